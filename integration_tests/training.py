"""One training step, the same on both sides of a comparison: torch eager on CPU, and the lazy
device with the batch sharded over "data"."""

import numpy as np

import ir_runtime as irt


def eager_step(model, opt, loss_fn, x, y):
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def lazy_step(model, opt, loss_fn, x, y, mesh):
    """The step on the lazy device; ``x`` and ``y`` (host tensors) split on their first dim."""
    lx, ly = irt.to_lazy(x), irt.to_lazy(y)
    irt.mark_sharding(lx, mesh, ("data",) + (None,) * (x.dim() - 1))
    irt.mark_sharding(ly, mesh, ("data",) + (None,) * (y.dim() - 1))
    loss = loss_fn(model(lx), ly)
    loss.backward()
    opt.step()
    opt.zero_grad()
    irt.mark_step()
    return loss


def assert_same_parameters(eager, lazy, rtol, atol):
    for pe, pl in zip(eager.parameters(), lazy.parameters(), strict=True):
        np.testing.assert_allclose(
            irt.to_torch(pl).numpy(), pe.detach().numpy(), rtol=rtol, atol=atol
        )


__all__ = ["assert_same_parameters", "eager_step", "lazy_step"]
