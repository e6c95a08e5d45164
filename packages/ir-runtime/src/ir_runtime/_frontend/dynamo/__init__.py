"""``torch.compile(model, backend="ir_runtime")`` (``_backend``)."""
