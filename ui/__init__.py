"""The app's tabs: one module per tab builds its components and wires its events beside its
handlers (``tab()``), plus the header, the validator and checked events every tab wires (components.py) and the Learn text.

``app.py`` (at the repository root, where Hugging Face Spaces looks) lays the tabs out; the
server objects they share live in :mod:`ui.shared`.
"""
