"""Mistakes a user makes with the lazy device, each refused at the call that made it, in the
project's words; the next correct step still runs, and earlier tensors keep their values."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import ir_runtime as irt


def same(lazy, eager):
    np.testing.assert_allclose(irt.to_torch(lazy).numpy(), eager.detach().numpy(), rtol=1e-6)


# -- a CPU model fed lazy inputs ------------------------------------------------------------


def test_a_cpu_model_fed_lazy_inputs_is_refused_at_its_forward_as_eager_does():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    eager = torch.nn.Linear(3, 2)
    eager.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = irt.to_lazy(torch.arange(12.0).reshape(4, 3))
    earlier = x * 2  # pending work recorded before the mistake
    with pytest.raises(irt.DeviceMismatchError) as caught:
        model(x).sum().backward()
        opt.step()
    message = str(caught.value)
    assert isinstance(caught.value, RuntimeError)
    assert message.startswith("Expected all tensors to be on the same device")
    assert "lazy:0 and cpu" in message
    assert "a cpu parameter of shape [2]" in message  # addmm's first operand: the bias
    assert "test_misuse.py:" in message  # the user's line, not torch's
    assert "irt.to_lazy(model)" in message and "before building its optimizer" in message
    assert model.weight.grad is None and model.bias.grad is None  # nothing half done

    irt.mark_step()
    same(earlier, torch.arange(12.0).reshape(4, 3) * 2)
    # The fix the message names, against eager.
    irt.to_lazy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    model(x).sum().backward()
    opt.step()
    irt.mark_step()
    eager(torch.arange(12.0).reshape(4, 3)).sum().backward()
    eager_opt.step()
    same(model.weight, eager.weight)
    same(model.bias, eager.bias)
    same(earlier, torch.arange(12.0).reshape(4, 3) * 2)


def test_a_cpu_tensor_computed_from_a_parameter_is_refused_too():
    w = torch.nn.Parameter(torch.ones(3, 2))
    x = irt.to_lazy(torch.ones(4, 3))
    with pytest.raises(irt.DeviceMismatchError, match=r"a cpu tensor of shape \[3, 2\] that req"):
        x @ (w * 2)
    with torch.no_grad():  # no gradient to give it: a constant input
        same(x @ (w * 2), torch.full((4, 2), 6.0))
    same(x @ (w * 2).detach(), torch.full((4, 2), 6.0))
    assert w.grad is None


def test_host_tensors_without_a_gradient_and_transfers_keep_working():
    """A constant host tensor is a program input; transfers to and from the device differentiate
    to the host (torch converts their gradients back); lazy leaves get lazy gradients."""
    leaf = irt.to_lazy(torch.tensor([1.0, -2.0, 3.0])).requires_grad_(True)
    mask = torch.tensor([1.0, 0.0, 1.0])  # a host constant
    (leaf * mask).sum().backward()
    same(leaf.grad, mask)
    assert isinstance(leaf.grad, irt.LazyTensor)

    p = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))
    dst = torch.zeros(3, device="lazy")
    dst.copy_(p)  # host to device, in grad mode
    (dst * 2).sum().backward()
    assert type(p.grad) is torch.Tensor and p.grad.device.type == "cpu"
    assert torch.equal(p.grad, torch.full((3,), 2.0))

    q = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    (q.to("lazy") ** 2).sum().backward()
    assert type(q.grad) is torch.Tensor and torch.equal(q.grad, torch.tensor([2.0, 4.0]))
    assert torch.equal(irt.to_lazy(q).cpu(), q.detach())
    irt.mark_step()


# -- the lazy device before the front end is installed -----------------------------------------

_FIRST_USE = textwrap.dedent(
    """
    import sys
    import torch, ir_runtime as irt
    assert "ir_runtime._frontend" not in sys.modules  # importing installed nothing
    seed = torch.manual_seed
    t = {first}
    assert "ir_runtime._frontend" in sys.modules and torch.manual_seed is not seed
    assert type(t).__name__ == "LazyTensor" and t.device == torch.device("lazy", 0)
    print(t.cpu().tolist())
    print(torch.ones(2, device="lazy").cpu().tolist(), torch.empty(2, device="lazy").shape,
          torch.randn(2, 3, device="lazy").shape)
    u = t + 1
    irt.mark_step()
    print(u.cpu().tolist(), t.cpu().tolist())
    """
)


@pytest.mark.parametrize(
    ("first", "values"),
    [
        ('torch.zeros(3, device="lazy")', [0.0, 0.0, 0.0]),
        ('torch.tensor([1.5, -2.0], device="lazy")', [1.5, -2.0]),
        ('torch.tensor([1.5, -2.0]).to("lazy")', [1.5, -2.0]),
        # composite factories: an empty tensor, written with out= (resized, as torch does)
        ('torch.arange(1, 9, 3, device="lazy")', [1, 4, 7]),
        ('torch.eye(2, 3, device="lazy")', [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]),
        ('torch.randperm(4, device="lazy").sort().values', [0, 1, 2, 3]),
    ],
    ids=["zeros", "tensor", "to", "arange", "eye", "randperm"],
)
def test_the_first_tensor_made_on_the_lazy_device_installs_the_front_end(first, values):
    """``import ir_runtime`` changes no torch setting; a fresh interpreter's first tensor made on
    the lazy device installs the front end (torch's Lazy dispatch key's fallback) and is made."""
    run = subprocess.run(
        [sys.executable, "-c", _FIRST_USE.format(first=first)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert lines == [
        str(values),
        "[1.0, 1.0] torch.Size([2]) torch.Size([2, 3])",
        f"{torch.tensor(values).add(1).tolist()} {values}",
    ]


def test_an_op_with_no_kernel_for_the_lazy_device_is_refused_in_our_words():
    x = irt.to_lazy(torch.tensor([1.0, 2.0]))
    earlier = x * 3
    with pytest.raises(irt.UnsupportedOpError, match=r"aten::tril_indices has no kernel for the"):
        torch.tril_indices(3, 3, device="lazy")
    with pytest.raises(NotImplementedError):  # what torch raised there, still caught as such
        torch.tril_indices(3, 3, device="lazy")
    irt.mark_step()
    same(earlier, torch.tensor([3.0, 6.0]))
    same(torch.zeros(2, device="lazy") + x, torch.tensor([1.0, 2.0]))
