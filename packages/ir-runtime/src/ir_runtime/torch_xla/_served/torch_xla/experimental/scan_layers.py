"""``torch_xla.experimental.scan_layers``: a stack of identical layers compiled once, the
engine's ``ir_runtime.scan_layers`` (one layer traced, the stack one ``lax.scan``, each
layer's gradient back to its own parameters)."""

from __future__ import annotations

import ir_runtime as _irt


def scan_layers(layers, input_data, partition_fn=None, is_layer_pure=False):
    """``for layer in layers: input_data = layer(input_data)``, compiled as one layer.

    ``partition_fn`` (torch_xla's choice of what AOTAutograd saves for the backward) and
    ``is_layer_pure`` (its cache of the traced layer) tune torch_xla's tracing, not the
    values: the engine traces the layer once per step and saves what the scan's ``jax.vjp``
    needs (wrap the layer in ``torch.utils.checkpoint`` to recompute instead)."""
    del partition_fn, is_layer_pure
    return _irt.scan_layers(layers, input_data)
