"""The math of tree speculation: draft trees, the target flow, exact verifiers, sampling.

Pure tensor functions in the paper's notation; nothing here imports transformers or any
other ``tev`` layer except ``tev.util``.
"""
