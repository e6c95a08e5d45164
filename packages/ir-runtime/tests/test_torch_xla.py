"""ir_runtime.torch_xla: torch_xla's API over the engine. The device is named per process, so
each case runs a script under ``python -m ir_runtime.torch_xla`` with 8 CPU devices; oracles
are torch eager (values, gradients), jax (where XLA puts each block) and XLA's own sharding
printer."""

import os
import subprocess
import sys
import textwrap


def run(code: str, devices: int = 8) -> str:
    env = dict(os.environ, CPU_NUM_DEVICES=str(devices))
    env.pop("IR_RUNTIME_CPU_DEVICES", None)
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"txla_{os.getpid()}.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent(code))
    done = subprocess.run(
        [sys.executable, "-m", "ir_runtime.torch_xla", path],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def test_device_and_training_match_eager():
    out = run("""
        import torch, torch_xla, torch_xla.core.xla_model as xm, torch_xla.runtime as xr
        assert torch_xla.device() == torch.device("xla", 0) == xm.xla_device()
        assert xr.global_runtime_device_count() == 8 and xr.device_type() == "CPU"
        torch.manual_seed(0)
        ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        model.load_state_dict(ref.state_dict()); model.to("xla")
        assert model[0].weight.device.type == "xla"
        opt_r = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x, y = torch.randn(32, 8), torch.randn(32, 1)
        seen = []
        for _ in range(4):
            opt_r.zero_grad(); lr = ((ref(x) - y) ** 2).mean(); lr.backward(); opt_r.step()
            opt.zero_grad(); l = ((model(x.to("xla")) - y.to("xla")) ** 2).mean(); l.backward()
            xm.optimizer_step(opt)
            xm.add_step_closure(lambda v, e=lr.item(): seen.append((v.item(), e)), (l,))
            torch_xla.sync()
        assert len(seen) == 4
        for got, want in seen:
            assert abs(got - want) <= 1e-5 * max(1, abs(want)), (got, want)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-5, atol=1e-6)
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_sharding_text_and_shards_agree_with_xla_and_jax():
    out = run("""
        import numpy as np, torch, jax, torch_xla, torch_xla.runtime as xr
        import torch_xla.distributed.spmd as xs
        from jax.sharding import NamedSharding, PartitionSpec as P
        xr.use_spmd()
        mesh = xs.Mesh(np.arange(8), (2, 4), ("x", "y"))
        t = torch.arange(64, dtype=torch.float32).reshape(8, 8)
        for spec in [("x", "y"), ("y", None), (None, ("x", "y")), (None, None)]:
            xt = xs.mark_sharding(t.to("xla"), mesh, spec)
            jspec = P(*spec)
            js = NamedSharding(mesh.get_jax_mesh(), jspec)
            # XLA's own printer, the explicit device list torch_xla 2.9 prints
            want = js._to_xla_hlo_sharding(2).to_proto()
            from jax._src.lib import xla_client
            want = str(xla_client.HloSharding.from_proto(want))
            got = torch_xla._XLAC._get_xla_sharding_spec(xt)
            assert got.replace(" ", "") == want.replace(" ", "") or "<=" in want, (spec, got, want)
            index = js.devices_indices_map((8, 8))
            for shard in xt.local_shards:
                dev = int(shard.shard_device.split(":")[1])
                block = t[index[jax.devices()[dev]]]
                torch.testing.assert_close(shard.data, block)
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_compile_runs_python_every_call_and_compiles_once():
    out = run("""
        import torch, torch_xla, ir_runtime as irt
        calls = []
        @torch_xla.compile(full_graph=True)
        def step(x):
            calls.append(1)
            return (x * 2).sin()
        x = torch.ones(4, device="xla")
        before = irt.metrics()["counters"]["CompileCount"]
        outs = [step(x + k).cpu() for k in range(3)]
        assert len(calls) == 3
        for k, o in enumerate(outs):
            torch.testing.assert_close(o, (torch.ones(4) + k).mul(2).sin())
        @torch_xla.compile(full_graph=True, name="reads")
        def reads(x):
            return x.sum().item()
        try:
            reads(x)
        except RuntimeError as e:
            assert "full_graph=True" in str(e) and "reads" in str(e)
        else:
            raise AssertionError("a host read inside full_graph=True was not refused")
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_lazy_device_is_refused_by_name_in_an_xla_process():
    out = run("""
        import torch, torch_xla
        torch.zeros(2, device="xla")
        try:
            torch.zeros(2, device="lazy")
        except Exception as e:
            assert "one process uses one name" in str(e), e
            print("refused")
    """)
    assert "refused" in out


def test_install_after_a_lazy_tensor_is_refused():
    code = textwrap.dedent("""
        import torch, ir_runtime as irt, ir_runtime.torch_xla as itx
        irt.to_lazy(torch.ones(2))
        try:
            itx.install()
        except irt.DeviceMismatchError as e:
            assert "already named 'lazy'" in str(e)
            print("refused")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "refused" in done.stdout, done.stderr[-3000:]


def test_unserved_module_and_auto_sharding_say_what_to_use():
    out = run("""
        import torch_xla.runtime as xr
        try:
            import torch_xla.experimental.splash_attention
        except ModuleNotFoundError as e:
            assert "not part of it" in str(e)
        try:
            xr.use_spmd(auto=True)
        except NotImplementedError as e:
            assert "mark_sharding" in str(e)
            print("ok")
    """)
    assert out.strip().endswith("ok")


def test_uneven_sharding_computes_as_eager_and_pads_its_shards():
    out = run("""
        import math, numpy as np, torch, torch_xla, torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr
        xr.use_spmd()
        mesh = xs.Mesh(np.arange(8), (4, 2))
        x, w = torch.randn(7, 3), torch.randn(3, 5)
        xt = xs.mark_sharding(x.to("xla"), mesh, (0, 1))
        assert xt.sharding_spec == "{devices=[4,2]0,1,2,3,4,5,6,7}", xt.sharding_spec
        y = torch.relu(xt.global_tensor @ w.to("xla"))
        xs.mark_sharding(y, mesh, (0, None))
        torch_xla.sync()
        torch.testing.assert_close(y.cpu(), torch.relu(x @ w))
        for shard in xt.local_shards:  # torch_xla's rule: ceil-sized blocks, zero-padded
            assert tuple(shard.data.shape) == (2, 2)
            torch.testing.assert_close(shard.unpadded_data, x[tuple(shard.indices)])
            rows, cols = (s.stop - s.start for s in shard.indices)
            assert shard.data[rows:].abs().sum() == 0 and shard.data[:, cols:].abs().sum() == 0
        print("ok")
    """)
    assert out.strip() == "ok"


def test_dcp_checkpoints_round_trip_and_read_as_dcp_reads_them():
    """torch_xla's CheckpointManager and planners: a sharded (uneven) model and AdamW state
    saved (sync and async), read back by DCP's own planner into CPU tensors (the oracle),
    restored into a model sharded another way; a checkpoint DCP wrote from CPU tensors loads
    into sharded tensors."""
    out = run("""
import tempfile, numpy as np, torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch_xla, torch_xla.runtime as xr, torch_xla.distributed.spmd as xs
import torch_xla.experimental.distributed_checkpoint as xc
xr.use_spmd()
dist.init_process_group("gloo", init_method="xla://")
mesh = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
torch.manual_seed(0)
ref = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Linear(10, 3))
model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Linear(10, 3)).to("xla")
model.load_state_dict(ref.state_dict())
xs.mark_sharding(model[0].weight, mesh, ("data", "model"))   # (10, 6): 10 over 4 uneven
xs.mark_sharding(model[1].weight, mesh, (None, "data"))      # (3, 10): uneven
opt = torch.optim.AdamW(model.parameters(), lr=0.1)
model(torch.randn(4, 6).to("xla")).sum().backward(); opt.step(); torch_xla.sync()
d = tempfile.mkdtemp()
ck = xc.CheckpointManager(d, save_interval=2)
state = {"model": model.state_dict(), "optim": opt.state_dict()}
assert ck.save(2, state)
assert ck.save_async(4, state) and (ck.join() or True)
print("steps", ck.all_steps())
# DCP itself reads it into CPU tensors (the oracle)
cpu = {"model": {k: torch.empty(v.shape, dtype=v.dtype) for k, v in model.state_dict().items()}}
dcp.load(cpu, checkpoint_id=f"{d}/2")
for k, v in model.state_dict().items():
    assert torch.equal(cpu["model"][k], v.cpu()), k
# restore into a fresh model sharded another way
m2 = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Linear(10, 3)).to("xla")
xs.mark_sharding(m2[0].weight, mesh, (None, "data"))
o2 = xc.prime_optimizer(torch.optim.AdamW(m2.parameters(), lr=0.1))
st2 = {"model": m2.state_dict(), "optim": o2.state_dict()}
ck.restore(4, st2)
m2.load_state_dict(st2["model"]); o2.load_state_dict(st2["optim"])
for (k, a), b in zip(model.state_dict().items(), m2.state_dict().values()):
    assert torch.equal(a.cpu(), b.cpu()), k
print(torch_xla._XLAC._get_xla_sharding_spec(m2[0].weight))
for s1, s2 in zip(opt.state.values(), o2.state.values()):
    for k in s1: assert torch.equal(s1[k].cpu(), s2[k].cpu()), k
# a checkpoint DCP wrote from CPU tensors loads into sharded tensors
plain = {"model": ref.state_dict()}
d2 = tempfile.mkdtemp(); dcp.save(plain, checkpoint_id=d2)
m3 = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Linear(10, 3)).to("xla")
xs.mark_sharding(m3[0].weight, mesh, ("data", "model"))
st3 = {"model": m3.state_dict()}
dcp.load(st3, checkpoint_id=d2, planner=xc.SPMDLoadPlanner())
for k, v in ref.state_dict().items():
    assert torch.equal(st3["model"][k].cpu(), v), k
print("ok")
    """)
    assert out.strip().endswith("ok")


def test_gradient_accumulation_and_scan_match_eager():
    out = run("""
        import copy, torch, torch_xla, torch_xla.runtime as xr
        from torch_xla.experimental.gradient_accumulation import gradient_accumulation
        from torch_xla.experimental.scan import scan
        torch.manual_seed(0)
        ref = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))
        model = copy.deepcopy(ref).to("xla")
        x, y = torch.randn(4, 3, 5), torch.randn(4, 3, 2)
        loss_fn = torch.nn.functional.mse_loss
        total = 0.0
        for k in range(4):  # eager: the loop torch_xla's test compares against
            loss = loss_fn(ref(x[k]), y[k]) / 4
            loss.backward()
            total += loss.detach()
        step = lambda a, b: loss_fn(model(a), b)
        got = gradient_accumulation(step, (x.to("xla"), y.to("xla")), model)
        torch_xla.sync()
        torch.testing.assert_close(got.cpu(), total)
        for p, q in zip(ref.parameters(), model.parameters()):
            torch.testing.assert_close(q.grad.cpu(), p.grad)
        # scan: jax.lax.scan's contract, a cumulative sum and its squares
        xs = torch.randn(6, 3)
        def step(c, v):
            c = c + v
            return c, c * c
        carry, ys = scan(step, torch.zeros(3).to("xla"), xs.to("xla"))
        torch.testing.assert_close(carry.cpu(), xs.sum(0))
        torch.testing.assert_close(ys.cpu(), xs.cumsum(0) ** 2)
        print("ok")
    """)
    assert out.strip() == "ok"


def test_process_groups_over_xla_rendezvous_and_the_xla_backend():
    out = run("""
        import torch, torch.distributed as dist, torch_xla, torch_xla.runtime as xr
        dist.init_process_group("gloo", init_method="xla://")
        assert dist.get_rank() == 0 and dist.get_world_size() == 1
        t = torch.ones(3)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0]
        dist.destroy_process_group()
        xr.use_spmd()
        try:
            dist.init_process_group("xla", init_method="xla://")
        except AssertionError as e:
            assert "not supported with SPMD" in str(e)
            print("ok")
    """)
    assert out.strip() == "ok"


def test_manual_regions_compute_as_eager_with_collectives_and_gradients():
    out = run("""
        import numpy as np, torch, torch_xla, torch_xla.runtime as xr
        import torch_xla.core.xla_model as xm, torch_xla.distributed.spmd as xs
        from ir_sharding import ShardingError
        xr.use_spmd()
        mesh = xs.Mesh(np.arange(8), (2, 4), ("x", "y"))
        xs.set_global_mesh(mesh)
        torch.manual_seed(0)
        a, b = torch.randn(8, 16), torch.randn(4)
        # blocks of (2, 4): device (i, j) holds a[4i:4i+4, 4j:4j+4]; b is read from outside
        m = xs.enable_manual_sharding(a.to("xla"), ("x", "y")).global_tensor
        assert m.shape == (4, 4)
        along_y = [[0, 1, 2, 3], [4, 5, 6, 7]]
        r = xm.all_reduce(xm.REDUCE_SUM, m * b.to("xla"), scale=0.5, groups=along_y)
        o = xs.disable_manual_sharding(r, ("x", "y"), (8, 16)).global_tensor
        blocks = (a * b.repeat(4)).reshape(2, 4, 4, 4)  # [i, row, j, col]
        want = (blocks.sum(2, keepdim=True) * 0.5).expand(2, 4, 4, 4).reshape(8, 16)
        torch.testing.assert_close(o.cpu(), want)
        # max over the x groups; a gather and a scatter along y, in the groups' order
        m = xs.enable_manual_sharding(a.to("xla"), ("x", "y")).global_tensor
        along_x = [[0, 4], [1, 5], [2, 6], [3, 7]]
        mx = xm.all_reduce(xm.REDUCE_MAX, m, groups=along_x)
        o = xs.disable_manual_sharding(mx, (None, "y"), (4, 16)).global_tensor
        torch.testing.assert_close(o.cpu(), torch.maximum(a[:4], a[4:]))
        g = xm.all_gather(m, dim=1, groups=along_y)
        assert g.shape == (4, 16)
        o = xs.disable_manual_sharding(g, ("x", None), (8, 16)).global_tensor
        torch.testing.assert_close(o.cpu(), a)
        s = xm.reduce_scatter(xm.REDUCE_SUM, m, 1.0, 0, 4, groups=along_y)
        assert s.shape == (1, 4)
        o = xs.disable_manual_sharding(s, ("x", "y"), (2, 16)).global_tensor
        # device (i, j) holds row j of the sum over its row's 4 blocks
        rows = a.reshape(2, 4, 4, 4).sum(2)  # [i, row, col]
        want = torch.cat([torch.cat([rows[i, j] for j in range(4)])[None] for i in range(2)])
        torch.testing.assert_close(o.cpu(), want)
        # gradients through a region, against eager's
        w = torch.randn(8, 8, requires_grad=True)
        c = torch.randn(8, 8)
        xw = w.detach().to("xla").requires_grad_()
        m = xs.enable_manual_sharding(xw, ("x", None)).global_tensor
        y = xm.all_reduce(xm.REDUCE_SUM, (m * m).sin(), groups=along_x)
        o = xs.disable_manual_sharding(y, ("x", None), (8, 8)).global_tensor
        (o * c.to("xla")).sum().backward()
        h = (w * w).sin()
        (torch.cat([h[:4] + h[4:]] * 2) * c).sum().backward()
        torch.testing.assert_close(xw.grad.cpu(), w.grad)
        # gradients where the result is replicated over an axis its spec leaves out (jax's
        # replication check holds: an all_gather's, a max's)
        def grad_of(make, out_spec, full, ref):
            w = torch.randn(8, 16, requires_grad=True)
            c = torch.randn(*full)
            xw = w.detach().to("xla").requires_grad_()
            m = xs.enable_manual_sharding(xw, ("x", "y")).global_tensor
            o = xs.disable_manual_sharding(make(m), out_spec, full).global_tensor
            torch.testing.assert_close(o.cpu(), ref(w).detach())
            (o * c.to("xla")).sum().backward()
            (ref(w) * c).sum().backward()
            torch.testing.assert_close(xw.grad.cpu(), w.grad)
        grad_of(lambda m: xm.all_gather(m, dim=1, groups=along_y), ("x", None), (8, 16),
                lambda w: w)
        grad_of(lambda m: xm.all_reduce(xm.REDUCE_MAX, m, groups=along_x), (None, "y"),
                (4, 16), lambda w: torch.maximum(w[:4], w[4:]))
        grad_of(lambda m: m, ("x", "y"), (8, 16), lambda w: w)  # the entry itself
        # one that entered twice, and a step while its region is open
        w = torch.randn(8, 16, requires_grad=True)
        xw = w.detach().to("xla").requires_grad_()
        m1 = xs.enable_manual_sharding(xw, ("x", "y")).global_tensor
        m2 = xs.enable_manual_sharding(xw, ("x", "y")).global_tensor
        xm.mark_step()
        o = xs.disable_manual_sharding(m1 * m2, ("x", "y"), (8, 16)).global_tensor
        o.sum().backward()
        (w * w).sum().backward()
        torch.testing.assert_close(xw.grad.cpu(), w.grad)
        # two regions of one graph: a value read from outside by one, entered by the other
        m = xs.enable_manual_sharding(a.to("xla"), ("x", "y")).global_tensor
        o1 = xs.disable_manual_sharding(m * a[:4, :4].to("xla"), ("x", "y"), (8, 16))
        m1 = xs.enable_manual_sharding(a.to("xla"), ("x", "y")).global_tensor
        m2 = xs.enable_manual_sharding(w.detach().to("xla"), ("x", "y")).global_tensor
        o2 = xs.disable_manual_sharding(m1 * m2, ("x", "y"), (8, 16))
        torch.testing.assert_close(o1.global_tensor.cpu(), a * a[:4, :4].repeat(2, 4))
        torch.testing.assert_close(o2.global_tensor.cpu(), a * w.detach())
        # blocks that jax cannot prove replicated, closed as replicated and without a
        # gradient: torch_xla's unchecked meaning (torch_xla's TPU test of reduce_scatter)
        x = xs.enable_manual_sharding(torch.ones(8, 8).to("xla"), (None, None)).global_tensor
        x = torch_xla._XLAC._xla_spmd_reduce_scatter(
            xm.REDUCE_SUM, x, 1.0, 0, 8, [list(range(8))])
        o = xs.disable_manual_sharding(x, (None, None), x.shape).global_tensor
        torch.testing.assert_close(o.cpu(), torch.full((1, 8), 8.0))
        # a step leaves an open region pending; reading inside it is refused, closing works
        m = xs.enable_manual_sharding(a.to("xla"), ("x", "y")).global_tensor
        n = m + 1
        xm.mark_step()
        try:
            n.cpu()
            raise AssertionError("read an open region")
        except ShardingError as e:
            assert "inside a manual region" in str(e), e
        # while it is open, a step reads an op of two outputs, one of them annotated
        t = torch.randn(8, 8)
        v, i = torch.max(t.to("xla"), 1)
        xs.mark_sharding(v, mesh, ("x",))
        torch.testing.assert_close(i.cpu(), torch.max(t, 1).indices)
        torch.testing.assert_close(v.cpu(), torch.max(t, 1).values)
        o = xs.disable_manual_sharding(n * 2, ("x", "y"), (8, 16)).global_tensor
        torch.testing.assert_close(o.cpu(), (a + 1) * 2)
        # refusals, each naming the rule
        def refused(kind, fn, words):
            try:
                fn()
            except kind as e:
                assert words in str(e), e
            else:
                raise AssertionError(words)
        plain = torch.zeros(8, 8).to("xla")
        refused(RuntimeError, lambda: torch_xla._XLAC._spmd_full_to_shard_shape(plain),
                "not sharded")
        refused(RuntimeError, lambda: xs._mark_manual_sharding(plain), "holds data")
        m = xs.enable_manual_sharding(a.to("xla"), ("x", "y")).global_tensor
        refused(ShardingError, lambda: xm.all_reduce(xm.REDUCE_SUM, m, groups=[[0, 1], [2, 3]]),
                "not the device groups")
        q = torch.ones(4, 4).to("xla") * 2  # (outside any region: each device's block)
        refused(ShardingError, lambda: xs.disable_manual_sharding(q, ("x", "y"), (8, 8)),
                "not the full shape")
        torch.testing.assert_close((q * 2).cpu(), torch.full((4, 4), 4.0))  # q as it was
        o = xs.disable_manual_sharding(q, ("x", "y"), (8, 16)).global_tensor
        torch.testing.assert_close(o.cpu(), torch.full((8, 16), 2.0))
        refused(ShardingError, lambda: xs.disable_manual_sharding(m, ("x", "y"), (8, 8)),
                "not the full shape")
        w = torch.randn(8, 16).to("xla").requires_grad_()  # a gradient jax cannot check
        mw = xs.enable_manual_sharding(w, ("x", "y")).global_tensor
        refused(ShardingError, lambda: xs.disable_manual_sharding(mw, ("x", None), (8, 4)),
                "over mesh axis 'y'")
        v = torch.randn(4, 4).to("xla").requires_grad_()
        refused(ShardingError,
                lambda: xs.disable_manual_sharding(m * v, ("x", "y"), (8, 16)).global_tensor,
                "from outside it, and it requires grad")
        print("ok")
    """)
    assert out.strip() == "ok"


def test_the_readme_example_runs_as_written():
    import pathlib
    import re

    readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    section = readme[readme.index("## Coming from torch_xla") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    env = dict(os.environ, CPU_NUM_DEVICES="8")
    env.pop("IR_RUNTIME_CPU_DEVICES", None)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "xla:0 {devices=[8,1]0,1,2,3,4,5,6,7}"
