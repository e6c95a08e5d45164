"""The OpInfo ops that do not give eager's results on the lazy device, each with why.

``name: (part, reason)``: ``part`` is ``"values"`` (the op raises) or ``"gradients"`` (its values
match, its backward raises). This list only shrinks (``test_opinfo.py``).

``ALL_SAMPLES_FAILURES``: the same, for ops whose first three samples pass and a later one does
not; counted only when every sample runs (``IR_RUNTIME_OPINFO_SAMPLES=all``, ``nox -s
opinfo_all``).
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
    "nn.functional.linear_cross_entropy.chunked": (
        "values",
        "torch_nn::_linear_cross_entropy_batch_chunked is a custom op whose only kernels are "
        "torch's in-place CPU/CUDA loops; the unchunked form (nn.functional.linear_cross_entropy) "
        "passes",
    ),
    "nn.functional.linear_cross_entropy.chunked_none": (
        "values",
        "torch_nn::_linear_cross_entropy_batch_chunked_no_reduction: as the chunked variant",
    ),
}

ALL_SAMPLES_FAILURES: dict = {}
