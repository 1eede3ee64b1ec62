"""Measurement: benchmarks, the paper's claims report, the verifier lab."""
