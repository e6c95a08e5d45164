"""One training step, the same on both sides of a comparison: torch eager on CPU, and the lazy
device with the batch sharded over "data"."""

import copy
import functools

import numpy as np

import ir_runtime as irt


def eager_step(model, opt, loss_fn, x, y):
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def _record_step(model, opt, loss_fn, x, y, mesh):
    """The step recorded on the lazy device; ``x`` and ``y`` split on their first dim."""
    lx, ly = irt.to_lazy(x), irt.to_lazy(y)
    irt.mark_sharding(lx, mesh, ("data",) + (None,) * (x.dim() - 1))
    irt.mark_sharding(ly, mesh, ("data",) + (None,) * (y.dim() - 1))
    loss = loss_fn(model(lx), ly)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def lazy_step(model, opt, loss_fn, x, y, mesh):
    """The step on the lazy device, run by ``mark_step``; ``x`` and ``y`` are host tensors."""
    loss = _record_step(model, opt, loss_fn, x, y, mesh)
    irt.mark_step()
    return loss


def compiled_step(model, opt, loss_fn, mesh):
    """The same step as ``irt.compile_step(fn)``: call it with ``(x, y)``."""
    return irt.compile_step(lambda x, y: _record_step(model, opt, loss_fn, x, y, mesh))


def train_side_by_side(suite, mode, compiled=False):
    """A suite's model (``make_model``, ``shard``, ``make_optimizer``, ``LOSS``, ``batches``,
    ``MESH``) trained by torch eager and on the lazy device sharded per ``mode``, on the same
    batches (through ``compile_step`` when ``compiled``): (eager model, lazy model, eager
    losses, lazy losses)."""
    eager = suite.make_model()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    suite.shard(lazy, mode)
    opt_e, opt_l = suite.make_optimizer(eager), suite.make_optimizer(lazy)
    irt.reset_metrics()
    irt.CACHE.clear()
    if compiled:
        step = compiled_step(lazy, opt_l, suite.LOSS, suite.MESH)
    else:
        step = functools.partial(lazy_step, lazy, opt_l, suite.LOSS, mesh=suite.MESH)
    losses_e, losses_l = [], []
    for x, y in suite.batches():
        losses_e.append(eager_step(eager, opt_e, suite.LOSS, x, y))
        losses_l.append(step(x, y).item())
    return eager, lazy, losses_e, losses_l


def assert_same_parameters(eager, lazy, rtol, atol):
    for pe, pl in zip(eager.parameters(), lazy.parameters(), strict=True):
        np.testing.assert_allclose(
            irt.to_torch(pl).numpy(), pe.detach().numpy(), rtol=rtol, atol=atol
        )


__all__ = [
    "assert_same_parameters",
    "compiled_step",
    "eager_step",
    "lazy_step",
    "train_side_by_side",
]
