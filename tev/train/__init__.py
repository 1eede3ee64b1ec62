"""Training: drafter self-distillation, ExitTrain, and the embedded asset build."""
