"""TEV Explorer: draft trees, target coverage and missing mass, exact tree verifiers.

Notation (the paper's, everywhere in this package): ``p`` is the **target** model, ``q``
the **draft** model.
"""

__version__ = "0.1.0"
