"""The OpInfo ops that do not yet give eager's results on the lazy device, each with why.

``name: (part, reason)``: ``part`` is ``"values"`` (the op raises) or ``"gradients"`` (its values
match, its backward raises). This list only shrinks (``test_opinfo.py``).
"""

KNOWN_FAILURES = {}
