"""``ir::materialize``: a cos or sin read more than once per element, computed once on one CPU
device (``_rewrite._computed_once``), against torch eager, XLA's compiled program and jax's own
derivatives."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import ir_runtime as irt
from ir_runtime._frontend import inspect
from ir_runtime._lowering.shape import FFI_MATERIALIZE, materialized, register_handler

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))


def rotary(q, k, positions, inv_freq):
    """Hugging Face Llama's rotary embedding: cos and sin of the positions, scaled, cast, and
    broadcast over the heads of q and k."""
    freqs = positions[:, :, None].float() * inv_freq[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = (emb.cos() * 1.0).to(q.dtype), (emb.sin() * 1.0).to(q.dtype)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)

    def half_turn(x):
        a, b = x.chunk(2, dim=-1)
        return torch.cat((-b, a), dim=-1)

    return q * cos + half_turn(q) * sin, k * cos + half_turn(k) * sin


def inputs(dtype=torch.float32):
    torch.manual_seed(0)
    q = torch.randn(2, 4, 16, 8, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 2, 16, 8, dtype=dtype, requires_grad=True)
    positions = torch.arange(16).expand(2, 16)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    return q, k, positions, inv_freq


def lines_with(text: str, op: str) -> list:
    return [line for line in text.splitlines() if f" = {op}(" in line]


def compiled_text() -> str:
    return inspect.last_executable().compiled.as_text()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_rotary_embeddings_cos_and_sin_are_computed_once_and_equal_eager(dtype):
    q, k, positions, inv_freq = inputs(dtype)
    lq, lk = (irt.to_lazy(t.detach()).requires_grad_() for t in (q, k))
    lazy = rotary(lq, lk, irt.to_lazy(positions), irt.to_lazy(inv_freq))
    eager = rotary(q, k, positions, inv_freq)
    (lazy[0].sum() + (lazy[1] ** 2).sum()).backward()
    (eager[0].sum() + (eager[1] ** 2).sum()).backward()

    rewritten = irt.dump([*lazy, lq.grad, lk.grad], format="rewritten")
    assert "ir::materialize" not in irt.dump([*lazy, lq.grad, lk.grad])
    materialized_ = lines_with(rewritten, "ir::materialize")
    for op in ("aten::cos.default", "aten::sin.default"):
        (node,) = lines_with(rewritten, op)
        name = node.split(" = ")[0]
        assert sum(f"ir::materialize({name})" in line for line in materialized_) == 1, rewritten
    tol = dict(rtol=1e-5, atol=1e-6) if dtype != torch.bfloat16 else dict(rtol=1e-2, atol=1e-2)
    for got, want in zip([*lazy, lq.grad, lk.grad], [*eager, q.grad, k.grad], strict=True):
        torch.testing.assert_close(irt.to_torch(got), want.detach(), **tol)
    # XLA computes each once, and its custom call hands it to the consumers.
    text = compiled_text()
    assert len(re.findall(r" cosine\(", text)) == 1 and len(re.findall(r" sine\(", text)) == 1
    assert text.count(f'custom_call_target="{FFI_MATERIALIZE}"') == 2


@pytest.mark.parametrize(
    "f",
    [
        lambda x: (x.cos() * 2 + 1).exp(),  # one consumer at a time, as many elements
        lambda x: x.sin().sum(),  # a reduction reads each element once
        lambda x: x.cos()[:, :3].exp(),  # a slice reads fewer
        lambda x: x.sin().to(torch.int32) * 3,  # a cast, then an elementwise op
        lambda x: torch.cat([x.cos(), x], 0) * 2,  # a concatenation reads each element once
        lambda x: torch.sort(x.cos(), 1)[0],  # a consumer with two outputs
    ],
    ids=["elementwise", "reduction", "slice", "cast", "cat", "two outputs"],
)
def test_a_cos_or_sin_read_once_is_left_to_fusion(f):
    x = torch.randn(4, 8)
    lazy = f(irt.to_lazy(x))
    assert "ir::materialize" not in irt.dump(lazy, format="rewritten")
    torch.testing.assert_close(irt.to_torch(lazy), f(x), rtol=1e-5, atol=1e-6)


def test_reads_through_a_chain_count_its_end():
    # cos -> * 3 -> exp, then two consumers: the chain's end is read twice, so cos is
    # materialized (the multiply and exp are cheap to copy, cos is not).
    x = torch.randn(4, 8)

    def f(x):
        e = (x.cos() * 3).exp()
        return e + 1, e * 2

    lazy = f(irt.to_lazy(x))
    rewritten = irt.dump(list(lazy), format="rewritten")
    assert len(lines_with(rewritten, "ir::materialize")) == 1, rewritten
    for got, want in zip(lazy, f(x), strict=True):
        torch.testing.assert_close(irt.to_torch(got), want, rtol=1e-5, atol=1e-6)


def test_a_result_also_read_by_a_consumer_is_read_twice():
    x = torch.randn(4, 8)

    def f(x):
        c = x.cos()
        return c, c * 2

    lazy = f(irt.to_lazy(x))
    assert len(lines_with(irt.dump(list(lazy), format="rewritten"), "ir::materialize")) == 1
    for got, want in zip(lazy, f(x), strict=True):
        torch.testing.assert_close(irt.to_torch(got), want, rtol=1e-5, atol=1e-6)


def test_not_on_a_mesh_nor_an_integer_or_complex_value():
    # XLA's partitioner cannot see through a custom call: a program on a mesh keeps its cos.
    x = torch.randn(8, 8)
    lx = irt.to_lazy(x)
    irt.mark_sharding(lx, MESH, ("data", None))
    y = lx.cos().unsqueeze(0).expand(3, 8, 8) * torch.ones(3, 1, 1)
    assert "ir::materialize" not in irt.dump(y, format="rewritten")
    torch.testing.assert_close(irt.to_torch(y), x.cos().expand(3, 8, 8), rtol=1e-5, atol=1e-6)
    # a mesh of one device: still a program the partitioner runs
    one = irt.to_lazy(x)
    irt.mark_sharding(one, irt.Mesh(np.arange(1), (1,), ("x",)), ("x", None))
    y = one.cos().unsqueeze(0).expand(3, 8, 8) * torch.ones(3, 1, 1)
    assert "ir::materialize" not in irt.dump(y, format="rewritten")
    torch.testing.assert_close(irt.to_torch(y), x.cos().expand(3, 8, 8), rtol=1e-5, atol=1e-6)
    z = torch.randn(4, 4, dtype=torch.complex64)
    lz = irt.to_lazy(z).cos().unsqueeze(0) * torch.ones(3, 1, 1, dtype=torch.complex64)
    assert "ir::materialize" not in irt.dump(lz, format="rewritten")
    torch.testing.assert_close(irt.to_torch(lz), z.cos().expand(3, 4, 4), rtol=1e-5, atol=1e-6)


def test_the_recorded_graph_is_untouched_and_one_program_serves_every_call():
    # The rewrite runs on a cache miss, on new nodes: the graph recorded (and keyed) has none.
    x = torch.randn(4, 8)
    irt.reset_metrics()
    for k in range(3):
        lazy = irt.to_lazy(x + k).cos().unsqueeze(0).expand(2, 4, 8) * 1.0
        assert "ir::materialize" not in irt.dump(lazy)
        assert "ir::materialize" in irt.dump(lazy, format="rewritten")
        torch.testing.assert_close(irt.to_torch(lazy), (x + k).cos().expand(2, 4, 8))
    assert irt.metrics()["counters"]["CompileCount"] == 1


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float64, jnp.int32])
def test_the_lowering_is_the_identity_with_the_identitys_derivatives(dtype):
    x = (jnp.arange(24).reshape(2, 3, 4) - 7).astype(dtype)
    np.testing.assert_array_equal(np.asarray(jax.jit(materialized)(x)), np.asarray(x))
    # a parameter the program may not write (not donated): XLA copies it for the call
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda x: materialized(x) * 2)(x)), x * 2)
    if jnp.issubdtype(dtype, jnp.floating):
        same, t = jax.jvp(materialized, (x,), (jnp.ones_like(x),))
        np.testing.assert_array_equal(np.asarray(same), np.asarray(x))
        np.testing.assert_array_equal(np.asarray(t), np.ones(x.shape))
        g = jax.grad(lambda x: (jnp.cos(materialized(x)) ** 2).sum().astype(jnp.float32))(x)
        want = jax.grad(lambda x: (jnp.cos(x) ** 2).sum().astype(jnp.float32))(x)
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(want, np.float64))


def test_other_platforms_lower_it_as_the_identity():
    # Only XLA's CPU has the handler: lowered for a TPU, the program has no custom call.
    x = jnp.ones((4, 4), jnp.float32)
    tpu = jax.jit(lambda x: materialized(jnp.cos(x))).trace(x).lower(lowering_platforms=("tpu",))
    assert FFI_MATERIALIZE not in tpu.as_text()
    cpu = jax.jit(lambda x: materialized(jnp.cos(x))).lower(x)
    assert FFI_MATERIALIZE in cpu.as_text()


def test_a_dump_of_tensors_no_one_program_runs_still_shows_the_rewritten_graph():
    # Tensors over two device orders make no one program (each runs its own): the rules that
    # need the program do not apply, and the text is shown rather than refused.
    a, b = irt.to_lazy(torch.randn(8, 4)), irt.to_lazy(torch.randn(8, 4))
    irt.mark_sharding(a, irt.Mesh(np.arange(8), (8,), ("x",)), ("x", None))
    irt.mark_sharding(b, irt.Mesh(np.arange(8)[::-1].copy(), (8,), ("x",)), ("x", None))
    text = irt.dump([a.cos() * 2, b.sin() + 1], format="rewritten")
    assert "aten::cos.default" in text and "aten::sin.default" in text
    assert "ir::materialize" not in text


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int8, jnp.bool_, jnp.complex64])
def test_the_handler_copies_its_operand_into_a_result_of_its_own(dtype):
    # Without the aliasing the rule asks for, XLA gives the result a buffer of its own and the
    # handler copies the bytes.
    register_handler()
    x = jnp.asarray(np.arange(-6, 18).reshape(2, 3, 4) % 5).astype(dtype)
    call = jax.ffi.ffi_call(FFI_MATERIALIZE, jax.ShapeDtypeStruct(x.shape, x.dtype))
    np.testing.assert_array_equal(np.asarray(jax.jit(call)(x)), np.asarray(x))


@pytest.mark.parametrize(
    "operand, result, message",
    [
        (jnp.zeros((8,), jnp.int4), jax.ShapeDtypeStruct((8,), jnp.int4), "packed or opaque"),
        (jnp.zeros((3, 4), jnp.float32), jax.ShapeDtypeStruct((4, 3), jnp.float32), "shapes"),
        (jnp.zeros((3, 4), jnp.float32), jax.ShapeDtypeStruct((3, 4), jnp.int32), "dtype or"),
    ],
    ids=["packed", "shape", "dtype"],
)
def test_the_handler_refuses_what_it_cannot_copy(operand, result, message):
    register_handler()
    with pytest.raises(Exception, match=message):
        jax.block_until_ready(jax.jit(jax.ffi.ffi_call(FFI_MATERIALIZE, result))(operand))
