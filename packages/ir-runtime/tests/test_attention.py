"""``scaled_dot_product_attention`` on lazy tensors: one ``ir::attention`` node and one
``ir::attention_backward`` node, with torch eager's values and gradients for every argument
torch takes (masks boolean and additive, rows with every key hidden, the causal triangle with
more or fewer queries than keys, ``scale``, grouped and broadcast key heads, 3-d and 5-d
inputs, keys longer than one block), in float64, float32 and bfloat16; sharded and in
compiled steps; torch's own composite where the rule does not take a call; the GPU path's
layout and masking code around jax's reference kernel."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ir_runtime as irt
from ir_runtime._frontend.regions import _attention
from ir_runtime._lowering import attention as rule

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 3e-2}


def _mask(shape, kind, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "bool":
        m = torch.rand(shape, generator=g) > 0.4
        m[..., 0, :] = False  # a row with every key hidden: zeros, as torch's
        return m
    m = torch.randn(shape, generator=g)
    m[..., 0, :] = float("-inf")
    return m


# (B dims, Hq, Hk, L, S, E, Ev, mask shape or None, mask kind, is_causal, scale, enable_gqa)
CASES = {
    "plain": ((2,), 4, 4, 5, 7, 8, 8, None, None, False, None, False),
    "causal, fewer queries": ((2,), 2, 2, 3, 6, 8, 8, None, None, True, None, False),
    "causal, more queries": ((1,), 2, 2, 6, 4, 8, 8, None, None, True, None, False),
    "bool mask over heads": ((2,), 4, 4, 5, 7, 8, 4, (2, 1, 5, 7), "bool", False, None, False),
    "additive mask (L, S)": ((2,), 3, 3, 4, 6, 8, 8, (4, 6), "float", False, 0.3, False),
    "mask over queries only": ((2,), 2, 2, 4, 5, 8, 8, (2, 2, 4, 1), "float", False, None, False),
    "grouped key heads": ((2,), 6, 2, 4, 5, 8, 8, (4, 5), "bool", False, None, True),
    "one key head": ((2,), 4, 1, 4, 5, 8, 8, None, None, True, None, False),
    "3-d": ((), 3, 3, 4, 6, 8, 8, None, None, False, 2.0, False),
    "5-d": ((2, 3), 2, 2, 4, 5, 8, 8, (3, 1, 4, 5), "bool", False, None, False),
    "keys over blocks": ((1,), 2, 2, 3, 1100, 8, 8, (1, 2, 3, 1100), "bool", False, None, False),
    "causal over blocks": ((1,), 2, 1, 4, 1030, 8, 8, None, None, True, None, True),
}


def _operands(case, dtype, seed=0):
    batch, hq, hk, L, S, E, Ev, mshape, kind, causal, scale, gqa = case
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, hq, L, E, generator=g, dtype=torch.float64)
    k = torch.randn(*batch, hk, S, E, generator=g, dtype=torch.float64)
    v = torch.randn(*batch, hk, S, Ev, generator=g, dtype=torch.float64)
    grad = torch.randn(*batch, hq, L, Ev, generator=g, dtype=torch.float64)
    mask = None if mshape is None else _mask(mshape, kind, seed + 1)
    if mask is not None and kind == "float":
        mask = mask.to(dtype)
    kwargs = {"attn_mask": mask, "is_causal": causal, "scale": scale, "enable_gqa": gqa}
    return [t.to(dtype) for t in (q, k, v)], grad.to(dtype), kwargs


def _eager(qkv, grad, kwargs, dtype):
    """torch's math kernel on CPU (in float32 for bfloat16, rounded once: the rule's contract,
    which torch's fused CPU kernels share)."""
    wide = torch.float32 if dtype == torch.bfloat16 else dtype
    leaves = [t.to(wide).requires_grad_() for t in qkv]
    mask = kwargs["attn_mask"]
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(wide)
    out = F.scaled_dot_product_attention(*leaves, **{**kwargs, "attn_mask": mask})
    out.backward(grad.to(wide))
    return [t.to(dtype) for t in (out.detach(), *(x.grad for x in leaves))]


def _lazy(qkv, grad, kwargs):
    leaves = [irt.to_lazy(t).requires_grad_() for t in qkv]
    mask = kwargs["attn_mask"]
    out = F.scaled_dot_product_attention(
        *leaves, **{**kwargs, "attn_mask": None if mask is None else irt.to_lazy(mask)}
    )
    out.backward(irt.to_lazy(grad))
    return out, leaves


def _close(got, want, dtype):
    tol = TOL[dtype]
    np.testing.assert_allclose(
        irt.to_torch(got).double().numpy(), want.detach().double().numpy(), rtol=tol, atol=tol
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(CASES))
def test_values_and_gradients_are_eagers(name, dtype):
    qkv, grad, kwargs = _operands(CASES[name], dtype)
    want = _eager(qkv, grad, kwargs, dtype)
    out, leaves = _lazy(qkv, grad, kwargs)
    assert out._ir.node.op == "ir::attention" and out.dtype == dtype
    assert {x.grad._ir.node.op for x in leaves} == {"ir::attention_backward"}
    for got, w in zip((out, *(x.grad for x in leaves)), want, strict=True):
        _close(got, w, dtype)


def test_hidden_rows_give_zeros_and_no_gradient():
    qkv, grad, kwargs = _operands(CASES["bool mask over heads"], torch.float32)
    out, leaves = _lazy(qkv, grad, kwargs)
    assert not irt.to_torch(out)[:, :, 0].any()
    assert not irt.to_torch(leaves[0].grad)[:, :, 0].any()
    assert torch.isfinite(irt.to_torch(leaves[1].grad)).all()


def test_one_op_forward_one_op_backward():
    qkv, grad, kwargs = _operands(CASES["grouped key heads"], torch.float32)
    out, leaves = _lazy(qkv, grad, kwargs)
    g = irt.dump([x.grad for x in leaves])
    assert g.count("ir::attention(") == 1 and g.count("ir::attention_backward(") == 1
    assert "aten::softmax" not in g and "aten::_softmax" not in g
    node = out._ir.node
    assert node.attrs["causal"] is False and node.attrs["scale"] == pytest.approx(8**-0.5)
    assert node.shapes[1].dtype == "float32" and node.shapes[1].dims == (2, 6, 4)


def test_inference_mode_records_the_forward_node():
    qkv, _, kwargs = _operands(CASES["causal, fewer queries"], torch.float32)
    want = F.scaled_dot_product_attention(*qkv, **kwargs)
    with torch.inference_mode():
        out = F.scaled_dot_product_attention(*(irt.to_lazy(t) for t in qkv), **kwargs)
    assert out._ir.node.op == "ir::attention"
    _close(out, want, torch.float32)


def test_calls_the_rule_does_not_take_run_torchs_composite():
    torch.manual_seed(0)
    q = torch.randn(2, 2, 4, 8)
    mask = torch.randn(4, 4, requires_grad=True)
    lmask = irt.to_lazy(mask.detach()).requires_grad_()
    want = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    want.sum().backward()
    lq = irt.to_lazy(q)
    out = F.scaled_dot_product_attention(lq, lq, lq, attn_mask=lmask)
    assert out._ir.node.op != "ir::attention"  # (a mask's gradient: torch's math path)
    out.sum().backward()
    _close(out, want, torch.float32)
    _close(lmask.grad, mask.grad, torch.float32)
    # dropout: torch's math path, drawing from the lazy random stream (p=1 drops every weight)
    dropped = F.scaled_dot_product_attention(lq, lq, lq, dropout_p=1.0)
    assert dropped._ir.node.op != "ir::attention"
    assert not irt.to_torch(dropped).any()
    # torch's own errors, from its own checks
    k3 = torch.randn(2, 3, 4, 8)
    with pytest.raises(RuntimeError) as eager:
        F.scaled_dot_product_attention(q, k3, k3)
    with pytest.raises(RuntimeError) as lazy:
        F.scaled_dot_product_attention(lq, irt.to_lazy(k3), irt.to_lazy(k3))
    assert str(lazy.value).split("\n")[0] == str(eager.value).split("\n")[0]


def test_disabled_the_math_path_gives_the_same_values():
    qkv, grad, kwargs = _operands(CASES["bool mask over heads"], torch.float64)
    out, leaves = _lazy(qkv, grad, kwargs)
    _attention.ENABLED[0] = False
    try:
        out2, leaves2 = _lazy(qkv, grad, kwargs)
    finally:
        _attention.ENABLED[0] = True
    assert out2._ir.node.op != "ir::attention"
    pairs = zip((out, *(x.grad for x in leaves)), (out2, *(x.grad for x in leaves2)), strict=True)
    for a, b in pairs:
        _close(a, irt.to_torch(b), torch.float64)


class Attend(torch.nn.Module):
    def __init__(self, d=16, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

    def forward(self, x, mask=None):
        b, s, d = x.shape
        q, k, v = (
            t.reshape(b, s, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(d, -1)
        )
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.out(a.transpose(1, 2).reshape(b, s, d))


@pytest.mark.parametrize("masked", [False, True])
def test_a_sharded_training_step_replays_with_eagers_values(masked):
    torch.manual_seed(0)
    eager = Attend()
    lazy = irt.to_lazy(Attend())
    lazy.load_state_dict(eager.state_dict())
    irt.mark_sharding(lazy.qkv.weight, MESH, ("model", None))
    irt.mark_sharding(lazy.out.weight, MESH, (None, "model"))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, lazy)]

    @irt.compile_step
    def step(x, mask):
        irt.mark_sharding(x, MESH, ("data", None, None))
        loss = lazy(x, mask).square().mean()
        loss.backward()
        opts[1].step()
        opts[1].zero_grad()
        return loss

    irt.reset_metrics()
    for k in range(4):
        g = torch.Generator().manual_seed(k)
        x = torch.randn(8, 6, 16, generator=g)
        mask = (torch.rand(8, 1, 6, 6, generator=g) > 0.3) if masked else None
        loss = eager(x, mask).square().mean()
        loss.backward()
        opts[0].step()
        opts[0].zero_grad()
        _close(step(x, mask), loss.detach(), torch.float32)
    assert irt.metrics()["counters"]["StepReplay"] == 4 - 2
    _close(lazy.qkv.weight, eager.qkv.weight.detach(), torch.float32)


GPU_CASES = [
    ((2, 3), 2, 2, 4, 6, 8, 8, (3, 1, 4, 6), "bool", False, None, False),  # rows hidden, 5-d
    ((2,), 6, 2, 4, 6, 8, 8, (4, 6), "bool", False, None, True),  # grouped key heads
    ((2,), 2, 2, 4, 6, 8, 8, (2, 2, 4, 1), "float", False, 0.3, False),  # broadcast over keys
    ((2,), 2, 2, 4, 6, 8, 8, None, None, True, None, False),  # causal, fewer queries
]


def test_the_gpu_paths_glue_around_jaxs_reference_kernel(monkeypatch):
    """The cuDNN branch's layout, masks and hidden rows, with jax's "xla" implementation in
    cuDNN's place (a CPU has no cuDNN)."""
    monkeypatch.setattr(rule, "_CUDNN_IMPLEMENTATION", ["xla"])
    taken = []

    def on_a_gpu(q, k, v, mask):
        lengths, masked = (q.shape[-2], k.shape[-2]), mask is not None
        how = rule.implementation("gpu", q.dtype, q.shape[-1], v.shape[-1], masked, lengths)
        taken.append(how == "cudnn")
        return taken[-1]

    monkeypatch.setattr(rule, "_use_cudnn", on_a_gpu)
    irt.CACHE.clear()  # (the same graphs compiled without the branch)
    try:
        for case in GPU_CASES:  # (even lengths: cuDNN's backward with a mask takes no others)
            qkv, grad, kwargs = _operands(case, torch.bfloat16)
            want = _eager(qkv, grad, kwargs, torch.bfloat16)
            out, leaves = _lazy(qkv, grad, kwargs)
            for got, w in zip((out, *(x.grad for x in leaves)), want, strict=True):
                _close(got, w, torch.bfloat16)
        assert taken and all(taken)
    finally:
        irt.CACHE.clear()


def test_the_implementation_chosen_per_platform_dtype_and_head():
    assert rule.implementation("gpu", np.float16, 64, 64) == "cudnn"
    assert rule.implementation("gpu", "bfloat16", 128, 128) == "cudnn"
    assert rule.implementation("gpu", np.float32, 64, 64) == "blockwise"
    assert rule.implementation("gpu", np.float16, 64, 32) == "blockwise"
    assert rule.implementation("gpu", np.float16, 12, 12) == "blockwise"
    assert rule.implementation("gpu", np.float16, 256, 256) == "blockwise"
    assert rule.implementation("cpu", np.float16, 64, 64) == "blockwise"
    # cuDNN's backward with a bias (any mask) takes even lengths only
    assert rule.implementation("gpu", np.float16, 64, 64, True, (128, 256)) == "cudnn"
    assert rule.implementation("gpu", np.float16, 64, 64, True, (127, 256)) == "blockwise"
    assert rule.implementation("gpu", np.float16, 64, 64, False, (127, 255)) == "cudnn"


def test_memory_is_linear_in_the_key_length():
    """XLA's analysis of the training program: the rule's temporaries grow about linearly in
    S (blocks of keys), the math path's quadratically."""

    def temporaries(S, enabled):
        _attention.ENABLED[0] = enabled
        try:
            q, k, v = (irt.to_lazy(torch.randn(1, 2, S, 16)).requires_grad_() for _ in range(3))
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
            return irt.compile([t.grad._ir for t in (q, k, v)]).memory()["temporaries"]
        finally:
            _attention.ENABLED[0] = True

    rule_growth = temporaries(4096, True) / temporaries(2048, True)
    math_growth = temporaries(4096, False) / temporaries(2048, False)
    assert rule_growth < 2.5 and math_growth > 3.5
