"""Resampling, distances and losses on the lazy device against torch eager: values and the
gradients of every floating input, for the options OpInfo's samples miss: align_corners,
scale_factor against size (and recompute_scale_factor), antialiasing, nearest against
nearest-exact, grid_sample's padding modes in 2-d and 3-d, embedding_bag's modes with offsets,
per-sample weights, include_last_offset and padding_idx, cdist's norms and compute modes, pdist,
CTC with padded and concatenated targets, margin losses, replicate padding, shrinkage, unfold."""

import math

import pytest
import torch
import torch.nn.functional as F
from eager import compare, lazy, same

import ir_runtime as irt

aten = torch.ops.aten


def rnd(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def uniform(*shape, lo=-1.0, hi=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g, dtype=torch.float64).float() * (hi - lo) + lo


# -- interpolation ------------------------------------------------------------------------------

SPATIAL = {
    "linear": (1, (7,)),
    "bilinear": (2, (5, 6)),
    "bicubic": (2, (5, 6)),
    "trilinear": (3, (3, 4, 5)),
}


@pytest.mark.parametrize("mode", ["linear", "bilinear", "bicubic", "trilinear"])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize(
    "how",
    [
        {"scale_factor": 2.0},
        {"scale_factor": 0.6},
        {"scale_factor": 1.7, "recompute_scale_factor": True},
        {"scale_factor": 2.3},
        {"size": "up"},
        {"size": "down"},
    ],
    ids=["x2", "x0.6", "x1.7-recompute", "x2.3", "size-up", "size-down"],
)
def test_interpolate_linear_family(mode, align_corners, how):
    _, spatial = SPATIAL[mode]
    x = rnd(2, 3, *spatial)
    how = dict(how)
    if how.get("size") == "up":
        how["size"] = tuple(s * 2 + 1 for s in spatial)
    elif how.get("size") == "down":
        how["size"] = tuple(max(s // 2, 1) for s in spatial)
    compare(F.interpolate, x, mode=mode, align_corners=align_corners, **how)


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize(
    "how",
    [
        {"scale_factor": 2.0},
        {"scale_factor": 0.5},
        {"scale_factor": 1.6},
        {"scale_factor": 3.0},
        {"size": "odd"},
        {"size": "same"},
    ],
    ids=["x2", "x0.5", "x1.6", "x3", "size-odd", "size-same"],
)
def test_interpolate_nearest(mode, n, how):
    spatial = (5, 4, 3)[:n]
    x = rnd(2, 2, *spatial)
    how = dict(how)
    if how.get("size") == "odd":
        how["size"] = tuple(s * 2 - 1 for s in spatial)
    elif how.get("size") == "same":
        how["size"] = spatial
    compare(F.interpolate, x, mode=mode, **how)


def test_interpolate_nearest_integers():
    """Nearest is a gather: integer inputs keep their dtype and values."""
    x = torch.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5).to(torch.uint8)
    compare(F.interpolate, x, scale_factor=1.5, mode="nearest", grad=False)
    compare(F.interpolate, x, size=(7, 3), mode="nearest-exact", grad=False)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize(
    "how",
    [
        {"scale_factor": 0.5},
        {"scale_factor": 0.3},
        {"size": (3, 7)},
        {"size": (11, 13)},
        {"scale_factor": 1.5},
    ],
    ids=["x0.5", "x0.3", "size-mixed", "size-up", "x1.5"],
)
def test_interpolate_antialias(mode, align_corners, how):
    x = rnd(2, 3, 10, 9)
    compare(F.interpolate, x, mode=mode, antialias=True, align_corners=align_corners, **how)


def test_interpolate_same_size_with_scale():
    """torch copies an axis whose size does not change, whatever scale it is given (linear,
    antialiased, nearest; not nearest-exact, and bicubic only in its backward)."""
    x = rnd(1, 2, 5, 5)
    for op in (
        aten.upsample_bilinear2d.default,
        aten.upsample_bicubic2d.default,
        aten._upsample_bilinear2d_aa.default,
        aten._upsample_bicubic2d_aa.default,
    ):
        compare(lambda v, op=op: op(v, [5, 5], False, 1.1, 1.1), x)
        compare(lambda v, op=op: op(v, [5, 7], False, 1.1, 1.4), x)
    compare(lambda v: aten.upsample_linear1d.default(v, [5], False, 1.2), x[0])
    compare(
        lambda v: aten.upsample_trilinear3d.default(v, [5, 5, 4], False, 1.1, 1.2, 0.9), x[None]
    )
    compare(lambda v: aten.upsample_nearest2d.default(v, [5, 5], 1.3, 1.3), x)
    compare(lambda v: aten.upsample_nearest2d.default(v, [10, 10], 1.3, 1.3), x)
    compare(lambda v: aten._upsample_nearest_exact2d.default(v, [5, 5], 1.3, 1.3), x)


def test_interpolate_dtypes():
    x = rnd(1, 2, 6, 6, dtype=torch.float64)
    compare(F.interpolate, x, scale_factor=1.5, mode="bicubic", rtol=1e-10, atol=1e-10)
    compare(
        F.interpolate, x, scale_factor=0.4, mode="bilinear", antialias=True, rtol=1e-10, atol=1e-10
    )
    xb = rnd(1, 2, 6, 6, dtype=torch.bfloat16)
    compare(F.interpolate, xb, scale_factor=2, mode="bilinear", rtol=1e-2, atol=1e-2)


def test_interpolate_batchless_and_size_one():
    compare(F.interpolate, rnd(1, 1, 1, 1), size=(3, 4), mode="bilinear", align_corners=True)
    compare(F.interpolate, rnd(1, 1, 4, 4), size=(1, 1), mode="bilinear", align_corners=True)
    compare(F.interpolate, rnd(1, 1, 4, 4), size=(1, 1), mode="bicubic")


# -- grid sampling --------------------------------------------------------------------------------


# (input shape, grid shape, how far the grid reaches, its seed) per spatial rank; coordinates
# reaching well outside [-1, 1], so every padding mode does something.
GRIDS = {2: ((2, 3, 5, 7), (2, 4, 6, 2), 1.8, 1), 3: ((2, 2, 4, 5, 3), (2, 3, 2, 4, 3), 1.6, 2)}
GRID_MODES = {2: ["bilinear", "nearest", "bicubic"], 3: ["bilinear", "nearest"]}  # no 3-d bicubic
GRID_TOL = {"rtol": 1e-4, "atol": 1e-5}


@pytest.mark.parametrize(("d", "mode"), [(d, m) for d, modes in GRID_MODES.items() for m in modes])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample(d, mode, padding_mode, align_corners):
    x_shape, grid_shape, reach, seed = GRIDS[d]
    x = rnd(*x_shape)
    grid = uniform(*grid_shape, lo=-reach, hi=reach, seed=seed)
    options = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}
    compare(F.grid_sample, x, grid, **options, **GRID_TOL)


def test_grid_sample_far_outside_and_size_one():
    """Coordinates many images away reflect back in; a size-1 dim reflects onto itself."""
    x = rnd(1, 2, 4, 4)
    grid = uniform(1, 3, 3, 2, lo=-9.0, hi=9.0, seed=3)
    x1 = rnd(1, 2, 1, 5)
    grid1 = uniform(1, 2, 3, 2, lo=-2.0, hi=2.0, seed=4)
    cases = [(x, grid, p, False) for p in ("zeros", "border", "reflection")]
    cases += [(x1, grid1, "reflection", a) for a in (False, True)]
    for v, g, padding_mode, align_corners in cases:
        options = {"padding_mode": padding_mode, "align_corners": align_corners}
        compare(F.grid_sample, v, g, **options, **GRID_TOL)


def test_grid_sample_input_only_or_grid_only():
    """Only one of input and grid wanting a gradient (torch's output_mask)."""
    x = rnd(1, 2, 4, 5)
    grid = uniform(1, 3, 3, 2, seed=5)
    compare(lambda v: F.grid_sample(v, grid, align_corners=False), x)
    compare(lambda g: F.grid_sample(x, g, align_corners=False), grid, rtol=1e-4)


def test_grid_sampler_3d_bicubic_raises():
    x = irt.to_lazy(rnd(1, 1, 2, 2, 2))
    grid = irt.to_lazy(uniform(1, 1, 1, 1, 3))
    with pytest.raises(Exception, match=r"bicubic|interpolation"):
        irt.to_torch(F.grid_sample(x, grid, mode="bicubic", align_corners=False))


# -- embedding bags -------------------------------------------------------------------------------

INDICES = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 4])
OFFSETS = torch.tensor([0, 4, 4, 6])  # an empty bag, then bags of 2 and 4


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 4])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag_offsets(mode, padding_idx, include_last_offset):
    weight = rnd(10, 3)
    offsets = torch.cat([OFFSETS, torch.tensor([10])]) if include_last_offset else OFFSETS
    compare(
        lambda w: F.embedding_bag(
            INDICES,
            w,
            offsets,
            mode=mode,
            padding_idx=padding_idx,
            include_last_offset=include_last_offset,
        ),
        weight,
    )


@pytest.mark.parametrize("padding_idx", [None, 2])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag_per_sample_weights(padding_idx, include_last_offset):
    weight = rnd(10, 4)
    psw = rnd(10, seed=3)
    offsets = torch.cat([OFFSETS, torch.tensor([10])]) if include_last_offset else OFFSETS
    compare(
        lambda w, p: F.embedding_bag(
            INDICES,
            w,
            offsets,
            mode="sum",
            per_sample_weights=p,
            padding_idx=padding_idx,
            include_last_offset=include_last_offset,
        ),
        weight,
        psw,
    )


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_2d_input_and_freq(mode):
    weight = rnd(8, 5)
    idx = torch.tensor([[1, 2, 1], [7, 7, 0], [3, 1, 1]])
    compare(lambda w: F.embedding_bag(idx, w, mode=mode), weight)
    compare(lambda w: F.embedding_bag(idx, w, mode=mode, padding_idx=1), weight)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_scale_grad_by_freq(mode):
    """Each row's gradient divided by how often its index occurs, as documented (and as
    F.embedding does). torch's CPU kernel divides by the count of the wrong index (the i-th
    sorted index, not the i-th distinct one), so the reference is its unscaled gradient."""
    weight = rnd(8, 5)
    idx = torch.tensor([[1, 2, 1], [7, 7, 0], [3, 1, 1]])
    cot = rnd(3, 5, seed=9)
    we = weight.clone().requires_grad_(True)
    (plain,) = torch.autograd.grad(F.embedding_bag(idx, we, mode=mode), we, cot)
    counts = torch.bincount(idx.flatten(), minlength=8).clamp(min=1).to(weight.dtype)
    wl = irt.to_lazy(weight).requires_grad_(True)
    out = F.embedding_bag(irt.to_lazy(idx), wl, mode=mode, scale_grad_by_freq=True)
    (got,) = torch.autograd.grad(out, wl, irt.to_lazy(cot))
    torch.testing.assert_close(irt.to_torch(got), plain / counts[:, None])


def test_embedding_bag_max_ties_and_all_padding():
    """Max mode: the first maximum of a bag takes the gradient; a bag of padding only gives
    zeros and no gradient."""
    weight = torch.tensor([[1.0, 2.0], [1.0, 3.0], [0.5, 3.0], [5.0, 5.0]])
    idx = torch.tensor([3, 3, 0, 1, 2, 1])
    offsets = torch.tensor([0, 2, 6])
    compare(lambda w: F.embedding_bag(idx, w, offsets, mode="max", padding_idx=3), weight)


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_embedding_bag_dense_backward(mode):
    """The dense backward op called directly, with torch's own forward's auxiliary outputs."""
    weight = rnd(10, 3)
    _, offset2bag, bag_size, max_indices = aten._embedding_bag.default(
        weight, INDICES, OFFSETS, False, mode, False, None, False, 4
    )
    if offset2bag.numel() == 0:  # torch's fast sum path: give it the bags
        offset2bag = torch.tensor([0, 0, 0, 0, 2, 2, 3, 3, 3, 3])
    grad = rnd(4, 3, seed=5)
    args = (grad, INDICES, offset2bag, bag_size, max_indices, 10, False, mode, None, 4)
    want = aten._embedding_bag_dense_backward.default(*args)
    got = aten._embedding_bag_dense_backward.default(*map(lazy, args))
    same(got, want, 1e-5, 1e-5, "gradient")


@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag_aux_outputs(include_last_offset):
    """torch.embedding_bag's other outputs (offset2bag, bag_size, max_indices), wherever
    torch's meta kernel gives them the CPU kernel's shape."""
    weight = rnd(10, 3)
    offsets = torch.cat([OFFSETS, torch.tensor([10])]) if include_last_offset else OFFSETS
    for mode in (0, 1, 2):
        for pad in (-1, 4):
            args = (INDICES, offsets, False, mode, False, None, include_last_offset, pad)
            want = aten._embedding_bag.default(weight, *args)
            got = aten._embedding_bag.default(irt.to_lazy(weight), *map(lazy, args))
            same(got[0], want[0], 1e-5, 1e-5, "output")
            for k in (1, 2, 3):
                if got[k].shape == want[k].shape:
                    same(got[k], want[k], 0, 0, f"{mode} {pad} output {k}")
            # bag_size: one entry an offset on the lazy device (the meta kernel's shape).
            assert torch.equal(irt.to_torch(got[2])[: want[2].shape[0]], want[2])


# -- distances ------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, math.inf])
@pytest.mark.parametrize(
    "compute_mode",
    [None, "use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist"],
    ids=["default", "mm", "no-mm"],
)
def test_cdist(p, compute_mode):
    x1 = rnd(2, 5, 4)
    x2 = rnd(2, 6, 4, seed=1)
    kwargs = {} if compute_mode is None else {"compute_mode": compute_mode}
    compare(torch.cdist, x1, x2, p=p, rtol=1e-4, atol=1e-5, **kwargs)


def test_cdist_large_uses_mm_and_broadcasts():
    """More than 25 rows: torch's default computes p=2 by a matmul."""
    x1 = rnd(30, 3)
    x2 = rnd(27, 3, seed=1)
    compare(torch.cdist, x1, x2, rtol=1e-4, atol=1e-4)
    compare(torch.cdist, rnd(3, 1, 4, 5), rnd(1, 2, 6, 5, seed=2), p=1.0, rtol=1e-4)


def test_cdist_ties_and_zero_distance():
    """Inf-norm: every coordinate reaching the max gets the gradient (torch's rule); equal
    points have zero distance and zero gradient."""
    x1 = torch.tensor([[0.0, 0.0], [1.0, 2.0], [3.0, 3.0]])
    x2 = torch.tensor([[1.0, 1.0], [1.0, 2.0]])
    for p in (1.0, 2.0, 3.0, math.inf, 0.5):
        compare(torch.cdist, x1, x2, p=p, compute_mode="donot_use_mm_for_euclid_dist")


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 2.0, 3.0, math.inf])
def test_pdist(p):
    compare(F.pdist, rnd(6, 4), p=p, rtol=1e-4, atol=1e-5)


def test_pdist_edge():
    compare(F.pdist, rnd(1, 3))
    compare(F.pdist, torch.tensor([[0.0, 1.0], [0.0, 1.0], [2.0, 0.0]]), p=math.inf)


# -- bilinear layer (_trilinear) ------------------------------------------------------------------


def test_bilinear():
    compare(
        F.bilinear,
        rnd(4, 3),
        rnd(4, 5, seed=1),
        rnd(6, 3, 5, seed=2),
        rnd(6, seed=3),
        rtol=1e-5,
        atol=1e-5,
    )
    compare(F.bilinear, rnd(2, 4, 3), rnd(2, 4, 5, seed=1), rnd(2, 3, 5, seed=2))


# -- CTC loss -------------------------------------------------------------------------------------


def _log_probs(T, N, C, seed=0):
    return rnd(T, N, C, seed=seed).log_softmax(-1)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss(reduction, zero_infinity):
    T, N, C = 8, 4, 5
    lp = _log_probs(T, N, C)
    # Repeated labels (need a blank between them), an empty target, and one too long for its
    # input (infinite loss).
    targets = torch.tensor([[1, 2, 2, 3], [4, 4, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    input_lengths = [8, 6, 3, 5]
    target_lengths = [4, 2, 0, 4]
    compare(
        lambda v: F.ctc_loss(
            v,
            targets,
            input_lengths,
            target_lengths,
            reduction=reduction,
            zero_infinity=zero_infinity,
        ),
        lp,
        rtol=1e-5,
        atol=1e-5,
    )


def test_ctc_loss_concatenated_targets_and_blank():
    T, N, C = 7, 3, 4
    lp = _log_probs(T, N, C, seed=1)
    targets = torch.tensor([0, 1, 1, 2, 0, 0])  # lengths 3, 1, 2; blank is class 3
    compare(lambda v: F.ctc_loss(v, targets, [7, 5, 6], [3, 1, 2], blank=3, reduction="sum"), lp)


def test_ctc_loss_empty_targets_and_short_inputs():
    lp = _log_probs(4, 3, 3, seed=4)
    compare(
        lambda v: F.ctc_loss(
            v, torch.zeros(3, 0, dtype=torch.long), [4, 1, 2], [0, 0, 0], reduction="none"
        ),
        lp,
    )
    # An input of length 0: loss 0 for an empty target, inf (or 0 with zero_infinity) else.
    targets = torch.tensor([[1, 2], [2, 2], [1, 1]])
    for zero_infinity in (False, True):
        compare(
            lambda v, z=zero_infinity: F.ctc_loss(
                v, targets, [0, 4, 1], [0, 2, 1], reduction="none", zero_infinity=z
            ),
            lp,
        )


def test_ctc_loss_raw_outputs():
    """_ctc_loss's own outputs: the losses (inf when impossible, even with zero_infinity) and
    log_alpha where torch writes it."""
    lp = _log_probs(5, 2, 4, seed=2)
    targets = torch.tensor([[1, 1], [1, 2]])
    nll, log_alpha = aten._ctc_loss.default(lp, targets, [2, 5], [2, 2], 0, True)
    lazy = aten._ctc_loss.default(irt.to_lazy(lp), irt.to_lazy(targets), [2, 5], [2, 2], 0, True)
    same(lazy[0], nll, 1e-5, 1e-5, "nll")
    got = irt.to_torch(lazy[1])
    # Batch 1 (input length 5) has every step written; batch 0 only its first 2 steps.
    torch.testing.assert_close(got[1], log_alpha[1])
    torch.testing.assert_close(got[0, :2], log_alpha[0, :2])


def test_ctc_loss_unbatched():
    lp = _log_probs(6, 1, 3, seed=3)[:, 0]
    compare(lambda v: F.ctc_loss(v, torch.tensor([1, 2]), [6], [2]), lp)


# -- margin losses --------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True])
def test_multi_margin_loss(p, reduction, weighted):
    x = rnd(5, 4, scale=0.5)
    target = torch.tensor([0, 3, 1, 1, 2])
    weight = rnd(4, seed=2).abs() if weighted else None
    compare(
        lambda v: F.multi_margin_loss(
            v, target, p=p, margin=0.7, weight=weight, reduction=reduction
        ),
        x,
    )
    if reduction != "none":  # 1-D, no reduction: torch's meta kernel says [1], CPU says []
        compare(lambda v: F.multi_margin_loss(v, target[1], p=p, reduction=reduction), x[0])


def test_multi_margin_loss_at_the_margin():
    """z = 0 exactly: no loss and no gradient (torch's z > 0)."""
    x = torch.tensor([[1.0, 0.0, 2.0]])
    compare(lambda v: F.multi_margin_loss(v, torch.tensor([2])), x)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss(reduction):
    x = rnd(3, 5, scale=0.5)
    target = torch.tensor([[3, 0, -1, 1, 2], [1, 1, 4, -1, 0], [0, 1, 2, 3, 4]])
    compare(lambda v: F.multilabel_margin_loss(v, target, reduction=reduction), x)
    if reduction != "none":  # 1-D, no reduction: torch's meta kernel says [1], CPU says []
        compare(lambda v: F.multilabel_margin_loss(v, target[0], reduction=reduction), x[0])


# -- replicate padding, shrinkage, unfold ---------------------------------------------------------


@pytest.mark.parametrize(
    "shape, pad",
    [
        ((2, 5), (2, 3)),
        ((1, 2, 5), (0, 4)),
        ((2, 4, 5), (1, 2, 3, 0)),
        ((1, 2, 4, 5), (-1, 2, 3, -2)),
        ((1, 2, 3, 4, 5), (1, 1, 2, 0, 0, 3)),
        ((2, 3, 4, 5), (-2, -1, 1, 1, 0, -1)),
    ],
)
def test_replicate_pad(shape, pad):
    compare(lambda v: F.pad(v, pad, mode="replicate"), rnd(*shape))


@pytest.mark.parametrize("lambd", [0.5, 0.3, 0.0, 1.7])
def test_shrink(lambd):
    x = torch.tensor([-2.0, -1.7, -0.5, -0.3, 0.0, 0.3, 0.5, 1.7, 2.0, float("nan")])
    compare(F.hardshrink, x, lambd=lambd)
    compare(F.softshrink, x, lambd=lambd)


@pytest.mark.parametrize(
    "shape, dim, size, step",
    [
        ((7,), 0, 3, 2),
        ((4, 9), 1, 4, 1),
        ((4, 9), 0, 2, 3),
        ((3, 4, 5), -1, 5, 1),
        ((3, 4, 5), 1, 1, 1),
        ((6, 2), 0, 6, 6),
    ],
)
def test_unfold(shape, dim, size, step):
    compare(lambda v: v.unfold(dim, size, step), rnd(*shape))
    compare(lambda v: v.unfold(dim, size, step) * 2, rnd(*shape))


def test_unfold_0d_and_through_base():
    compare(lambda v: v.unfold(0, 1, 1), torch.tensor(3.0))

    # A view that reads its base after the base was written in place.
    def fn(v):
        b = v * 1
        w = b.unfold(0, 2, 1)
        b.add_(1)
        return w

    compare(fn, rnd(5))
