"""The app's tabs: input components, one module of handlers per tab, and the Learn text.

``app.py`` (at the repository root, where Hugging Face Spaces looks) lays the page out and
wires these handlers; the server objects they share live in :mod:`ui.shared`.
"""
