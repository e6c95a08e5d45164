"""``torch_xla.experimental.gradient_accumulation``: gradients accumulated over the leading
dimension of the inputs, as torch_xla's ``gradient_accumulation`` computes them: each
micro-step's loss divided by the number of steps and backpropagated, the gradients added into
``param.grad``, the losses summed. torch_xla runs the micro-steps as an XLA ``While`` loop;
here they are recorded one after another into the step's one program (the same values; the
program grows with the number of micro-steps)."""

from __future__ import annotations

import torch


def gradient_accumulation(train_step, iterable_tensors, model, *carried_tensors):
    """``train_step(*slices, *carried)`` for each index of the leading dimension of
    ``iterable_tensors`` (it returns the loss, or ``(loss, *carried)``); returns the
    accumulated loss (and the carried tensors after the last step), the parameters'
    ``.grad`` holding the accumulated gradients of the mean loss."""
    if not iterable_tensors:
        raise ValueError("iterable_tensors cannot be empty")
    steps = iterable_tensors[0].size(0)
    for i, t in enumerate(iterable_tensors):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"Element {i} of iterable_tensors is not a tensor")
        if t.numel() == 0:
            raise ValueError(f"Element {i} of iterable_tensors is empty")
        if t.size(0) != steps:
            raise ValueError(f"Element {i} of iterable_tensors has inconsistent first dimension")
    del model  # (its parameters' gradients are what backward accumulates into)
    carried = list(carried_tensors)
    total = None
    for k in range(steps):
        result = train_step(*(t[k] for t in iterable_tensors), *carried)
        if carried_tensors:
            loss, *carried = result
        else:
            loss = result
        loss = loss / steps
        loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    return (total, *carried) if carried_tensors else total
