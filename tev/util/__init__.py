"""The base layer: paths, timing, statistics and file helpers that every other layer may use."""
