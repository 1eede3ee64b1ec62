"""The app's server side: shared models, input checks, one ExitTrain at a time."""
