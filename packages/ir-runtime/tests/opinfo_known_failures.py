"""The OpInfo ops that do not give eager's results on the lazy device, each with why.

``name: (part, reason)``: ``part`` is ``"values"`` (the op raises) or ``"gradients"`` (its values
match, its backward raises). This list only shrinks (``test_opinfo.py``).

``ALL_SAMPLES_FAILURES``: the same, for ops whose first three samples pass and a later one does
not; counted only when every sample runs (``IR_RUNTIME_OPINFO_SAMPLES=all``, ``nox -s
opinfo_all``).

``BFLOAT16_FAILURES``: the same, in bfloat16 (``test_opinfo_bf16.py``).
"""

KNOWN_FAILURES = {
    "chalf": (
        "values",
        "complex32 has no XLA dtype: converting to it raises DTypeError, as it should",
    ),
    "as_strided.partial_views": (
        "values",
        "the samples address the storage of a larger tensor the input is a view of; a lazy "
        "tensor is its own contiguous storage, so eager itself raises on a copy of the input",
    ),
}

_LSTSQ_TALL = (
    "values",
    "a later sample asks driver='gelss' of a tall matrix: its residuals are empty or not "
    "depending on the rank the values have (a shape from values, which the rule refuses by "
    "name, pointing at 'gels' and 'gelsy'); the first samples' drivers pass",
)
ALL_SAMPLES_FAILURES: dict = {
    "linalg.lstsq": _LSTSQ_TALL,
    "linalg.lstsq.grad_oriented": _LSTSQ_TALL,
}

# bfloat16 (``test_opinfo_bf16.py``): the same form, for the ops that fail in bfloat16. Values
# that differ from eager's only where eager rounds intermediates are not failures (``opinfo``'s
# docstring: they pass by being nearer float64's result than eager's).
BFLOAT16_FAILURES = {
    "chalf": KNOWN_FAILURES["chalf"],
}
