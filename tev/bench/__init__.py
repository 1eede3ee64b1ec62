"""The paper's benchmarks and measurements of the library: verifiers, end to end, the ExitTrain
ablation, the claims report, reach, row cost; each a ``python -m tev bench`` subcommand."""
