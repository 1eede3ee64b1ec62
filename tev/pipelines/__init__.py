"""The commands that run the training library end to end: the asset build, train-drafter, ExitTrain
and its data, workload adaptation, and the model card they render."""
