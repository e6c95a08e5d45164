"""Source lines (node origins, StableHLO locations, XLA op metadata), recompile explanations
(IR_RUNTIME_DEBUG / set_debug), host-read notes, and irt.profile."""

import glob
import gzip
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ir_runtime as irt
from ir_runtime._frontend import inspect
from ir_runtime._frontend.recording import _fast

MESH = irt.Mesh(list(range(8)), (4, 2), ("data", "model"))
HERE = os.path.basename(__file__)


def line_of(marker: str) -> int:
    """The line of this file that carries ``# <marker>``."""
    with open(__file__) as f:
        for k, text in enumerate(f, 1):
            if text.rstrip().endswith(f"# {marker}"):
                return k
    raise AssertionError(marker)


@pytest.fixture
def debug():
    # Every graph a test explains is compiled in it: one another test compiled before would be
    # a cache hit, and never explained or compared with.
    irt.CACHE.clear()
    irt.set_debug(True)
    yield
    irt.set_debug(False)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x))  # block-forward


def test_each_node_knows_the_users_line_past_torch_and_this_package():
    x = irt.to_lazy(torch.ones(4, 8))
    y = x * 3 + 1  # arithmetic
    origin = y._ir.node.origin
    assert origin.filename == __file__ and origin.lineno == line_of("arithmetic")
    assert origin.function == "test_each_node_knows_the_users_line_past_torch_and_this_package"
    assert origin.short() == f"{HERE}:{line_of('arithmetic')}"
    model = irt.to_lazy(Block())
    out = model(x)
    # The relu and the linear both come from the module's forward: nn.Linear's own frames are
    # torch's, walked past.
    assert out._ir.node.origin.lineno == line_of("block-forward")
    assert out._ir.node.origin.function == "Block.forward"
    assert {n.origin.lineno for n in _computed(out)} == {line_of("block-forward")}, [
        (n.op, n.origin) for n in _computed(out)
    ]


def _computed(t):
    from ir_core import DeviceData, post_order

    return [n for n in post_order([t._ir]) if type(n) is not DeviceData]


def test_origins_are_not_hashed_and_can_be_turned_off():
    x = irt.to_lazy(torch.ones(4))
    a = x + 1
    b = x + 1  # (another line, the same graph)
    assert a._ir.node.origin.lineno != b._ir.node.origin.lineno
    assert a._ir.node.dag_hash == b._ir.node.dag_hash
    _fast.set_origins(False)
    try:
        assert (x * 2)._ir.node.origin is None
    finally:
        _fast.set_origins(True)
    assert (x * 2)._ir.node.origin is not None


def test_stablehlo_locations_and_xla_metadata_name_the_torch_line():
    x, w = irt.to_lazy(torch.ones(4, 8)), irt.to_lazy(torch.ones(8, 3))
    y = (x @ w).tanh()  # matmul-line
    line = line_of("matmul-line")
    text = irt.dump(y, format="stablehlo")
    assert f'loc("{__file__}":{line}:' in text
    assert "aten::mm.default" in text and "aten::tanh.default" in text
    irt.mark_step()
    hlo = inspect.last_executable().compiled.as_text()
    # The compiled program's stack frames: this file, the line, and the torch op by name.
    assert f'"{__file__}"' in hlo and f"line={line}" in hlo
    assert "aten::mm.default" in hlo


def test_a_recompile_says_which_op_and_line_changed_and_why(debug, capsys):
    w = irt.to_lazy(torch.ones(32, 3))
    for batch in (16, 16, 15):
        x = irt.to_lazy(torch.ones(batch, 32))
        loss = (x @ w).relu().sum()  # loss-line
        irt.mark_step()
    err = capsys.readouterr().err
    line = line_of("loss-line")
    assert loss.item() == 15 * 32 * 3
    assert err.count("differs from compile") == 1  # the 16 hit the cache
    assert (
        f"`aten::mm.default` at {HERE}:{line}: input 0 was float32[16, 32], now float32[15, 32] "
        f"(a partial last batch? drop it, or pad it to the full size)"
    ) in err
    assert "then 2 more" in err  # relu and sum follow from it


def test_a_changed_attribute_and_a_changed_placement_are_named(debug, capsys):
    x = irt.to_lazy(torch.ones(8, 4))
    for dim in (0, 1):
        s = x.sum(dim=dim)  # sum-line
        irt.mark_step()
    err = capsys.readouterr().err
    assert f"`aten::sum.dim_IntList` at {HERE}:{line_of('sum-line')}: attribute 'dim' was (0,), " \
           f"now (1,)" in err  # fmt: skip
    for spec in (("data", None), (None, "model")):
        y = irt.to_lazy(torch.ones(8, 4))
        irt.mark_sharding(y, MESH, spec)
        e = y.exp()  # exp-line
        irt.mark_step()
    err = capsys.readouterr().err
    assert s.shape == (8,) and e.shape == (8, 4)
    assert f"`aten::exp.default` at {HERE}:{line_of('exp-line')}: input 0 was placed" in err
    assert "('data', None)" in err and "(None, 'model')" in err


def test_a_python_number_that_changes_is_named(debug, capsys):
    x = irt.to_lazy(torch.ones(4))
    for k in (3, 4):
        p = x.pow(k)  # pow-line (pow's exponent is kept as an attribute: a new program)
        irt.mark_step()
    err = capsys.readouterr().err
    assert p.sum().item() == 4
    assert "attribute 'exponent' was 3, now 4" in err and "pass it as a tensor" in err


def test_a_host_read_mid_step_is_a_one_line_note(debug, capsys):
    x = irt.to_lazy(torch.ones(4)) * 2
    if x.sum() > 0:  # host-read
        pass
    err = capsys.readouterr().err
    assert f"host read of bool[] at {HERE}:{line_of('host-read')}: ran its pending graph" in err


def test_nothing_is_said_while_debugging_is_off(capsys):
    x = irt.to_lazy(torch.ones(4))
    for n in (2, 3):
        e = irt.to_lazy(torch.ones(n)).exp()
        irt.mark_step()
        assert e.shape == (n,)
    (x * 2).sum().item()
    assert capsys.readouterr().err == ""


def test_the_environment_turns_it_on(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch, ir_runtime as irt
            for n in (16, 15):
                x = irt.to_lazy(torch.ones(n, 4))
                y = (x * 2).sum()
                irt.mark_step()
            """
        )
    )
    env = dict(os.environ, IR_RUNTIME_DEBUG="1")
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert "`aten::mul.Tensor` at train.py:5: input 0 was float32[16, 4], now float32[15, 4]" in (
        out.stderr
    )


def test_profile_writes_a_trace_with_the_runtimes_spans(tmp_path):
    x = irt.to_lazy(torch.ones(32, 32))
    w = irt.to_lazy(torch.full((32,), 0.5))

    @irt.compile_step
    def step(v):
        w.mul_(v.sum())
        return w.sum()

    irt.reset_metrics()
    with irt.profile(tmp_path):
        for _ in range(2):
            x = (x @ x).tanh()
            irt.mark_step()
        losses = [step(irt.to_lazy(torch.ones(2))).item() for _ in range(4)]
        with pytest.raises(RuntimeError, match="profiles do not nest"):
            with irt.profile(tmp_path):
                pass
    assert glob.glob(f"{tmp_path}/plugins/profile/*/*.xplane.pb")
    (perfetto,) = glob.glob(f"{tmp_path}/plugins/profile/*/perfetto_trace.json.gz")
    trace = json.load(gzip.open(perfetto))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {e.get("name") for e in events}
    for span in ("mark_step", "trace", "lower", "compile", "execute", "replay"):
        assert f"ir_runtime.{span}" in names
    # The replays in the profile (its Python path) wrote w as the traced calls did.
    assert irt.metrics()["counters"]["StepReplay"] == 2
    assert losses == [0.5 * 32 * 2**k for k in range(1, 5)]
    # Outside the context, nothing is recorded and no span is made.
    from ir_runtime import _profile

    assert not _profile.ACTIVE[0] and _profile.span("x") is _profile.span("y")


def test_the_users_own_jax_programs_are_untouched_by_our_locations():
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    x, w = irt.to_lazy(torch.ones(64, 64)), irt.to_lazy(torch.ones(64, 64))
    irt.mark_sharding(x, MESH, ("data", "model"))
    irt.mark_sharding(w, MESH, ("model", None))
    # jnp.matmul and jax.nn.relu are jitted helpers: jax caches their jaxprs, traced here.
    y = torch.relu(x @ w)  # relu-line
    z = irt.shard_map(torch.relu, MESH, in_specs=(("data", None),), out_specs=("data", None))(x)
    irt.mark_step()
    assert y.cpu().sum().item() == 64**3 and z.cpu().sum().item() == 64**2

    jax_mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    xa = jax.device_put(np.ones((64, 64), np.float32), NamedSharding(jax_mesh, P("data", "model")))
    wa = jax.device_put(np.ones((64, 64), np.float32), NamedSharding(jax_mesh, P("model", None)))

    def mine(a, b):
        return jax.nn.relu(a @ b)  # the user's own jax, lowered with jax's full tracebacks

    text = jax.jit(mine).lower(xa, wa).as_text(debug_info=True)
    assert f":{line_of('relu-line')}:" not in text
    assert float(jax.jit(mine)(xa, wa).sum()) == 64**3


def test_outputs_that_come_and_go_and_a_tensor_passed_twice_are_named(debug, capsys):
    x = irt.to_lazy(torch.ones(4))
    for keep in (False, True):
        h = x * 2
        out = h + 1
        if not keep:
            del h  # logged on some steps only: one more live tensor, one more output
        irt.mark_step()
    err = capsys.readouterr().err
    assert out.shape == (4,)
    assert "the step computes 2 tensors, 1 before" in err

    a, b = irt.to_lazy(torch.ones(4)), irt.to_lazy(torch.ones(4))
    for second in (b, a):
        r = a * second  # mul-line
        irt.mark_step()
    err = capsys.readouterr().err
    assert r.shape == (4,)
    mul = f"`aten::mul.Tensor` at {HERE}:{line_of('mul-line')}"
    assert f"{mul}: input 1 is another value now: data input 0" in err


def test_a_steps_second_compile_is_said_to_read_the_state_its_first_made(debug, capsys):
    """Not "the same tensor passed twice?": the first step made the optimizer's state, the
    second reads it. Every line of the debugger's output stays short."""
    torch.manual_seed(0)
    model = irt.to_lazy(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)))
    irt.mark_sharding(model[0].weight, MESH, ("model", None))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    for n in (8, 8, 8, 6):
        model(irt.to_lazy(torch.ones(n, 4))).sum().backward()  # step-line
        opt.step()
        opt.zero_grad()
        irt.mark_step()
    err = capsys.readouterr().err
    second, third = err.split("[ir_runtime] ")[1:3]
    n = int(second.split()[1])  # (compiles are counted from when debugging was turned on)
    assert second.startswith(f"compile {n} (") and "a step's second" in second
    assert f"compile {n - 1} made tensors that are inputs now (8 more: `aten::zeros_like" in second
    assert "optimizer state" in second and "passed twice" not in second
    assert "float32[8, 4], now float32[6, 4] (a partial last batch?" in third
    assert max(map(len, err.splitlines())) <= 200, err
