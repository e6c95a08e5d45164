"""The Llama of PyTorch's tensor-parallel tutorial, as written for one device (names, modules
and plan as the tutorial has them), its TP + SP plan, and the same placements written by hand
as ``mark_sharding`` calls: the oracle of "a plan is only annotations".

The tutorial's two lines that divide ``n_heads`` / ``n_kv_heads`` by the TP size for local
shapes are left out: tensors are global here."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

import ir_runtime as irt


@dataclass
class ModelArgs:
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 8
    n_kv_heads: int = 4
    vocab_size: int = 128
    hidden: int = 128
    norm_eps: float = 1e-5
    max_seq_len: int = 32


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_table(head_dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(end).float(), freqs)
    return torch.stack([angles.cos(), angles.sin()], -1)  # (end, head_dim / 2, 2)


def apply_rope(x, table):
    x = x.float().unflatten(-1, (-1, 2))
    cos, sin = table[:, None, :, 0], table[:, None, :, 1]
    real = x[..., 0] * cos - x[..., 1] * sin
    imag = x[..., 0] * sin + x[..., 1] * cos
    return torch.stack([real, imag], -1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads = a.n_heads, a.n_kv_heads
        self.head_dim = a.dim // a.n_heads
        self.wq = nn.Linear(a.dim, a.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(a.n_heads * self.head_dim, a.dim, bias=False)

    def forward(self, x, freqs_cis):
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xq, xk = apply_rope(xq, freqs_cis), apply_rope(xk, freqs_cis)
        q, k, v = (t.transpose(1, 2) for t in (xq, xk, xv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(bsz, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.w1 = nn.Linear(a.dim, a.hidden, bias=False)
        self.w2 = nn.Linear(a.hidden, a.dim, bias=False)
        self.w3 = nn.Linear(a.dim, a.hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.attention = Attention(a)
        self.feed_forward = FeedForward(a)
        self.attention_norm = RMSNorm(a.dim, a.norm_eps)
        self.ffn_norm = RMSNorm(a.dim, a.norm_eps)

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        self.layers = nn.ModuleList(TransformerBlock(a) for _ in range(a.n_layers))
        self.norm = RMSNorm(a.dim, a.norm_eps)
        self.output = nn.Linear(a.dim, a.vocab_size, bias=False)
        self.register_buffer(
            "freqs_cis", rope_table(a.dim // a.n_heads, a.max_seq_len), persistent=False
        )

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        freqs_cis = self.freqs_cis[: tokens.shape[1]]
        for layer in self.layers:
            h = layer(h, freqs_cis)
        return self.output(self.norm(h)).float()


def build(seed=0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelArgs(**overrides))


# The tutorial's plan.
ROOT_PLAN = {
    "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
    "norm": SequenceParallel(),
    "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
}
LAYER_PLAN = {
    "attention_norm": SequenceParallel(),
    "attention": PrepareModuleInput(
        input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
    ),
    "attention.wq": ColwiseParallel(use_local_output=False),
    "attention.wk": ColwiseParallel(use_local_output=False),
    "attention.wv": ColwiseParallel(use_local_output=False),
    "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
    "ffn_norm": SequenceParallel(),
    "feed_forward": PrepareModuleInput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
    ),
    "feed_forward.w1": ColwiseParallel(),
    "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    "feed_forward.w3": ColwiseParallel(),
}


def parallelize(model, mesh, fsdp=True):
    """The issue's program: TP + SP on ``mesh["tp"]`` per block and at the root, then
    ``fully_shard`` per block and at the root on ``mesh["dp"]``."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(model, mesh["tp"], ROOT_PLAN)
    for block in model.layers:
        parallelize_module(block, mesh["tp"], LAYER_PLAN)
        if fsdp:
            fully_shard(block, mesh=mesh["dp"])
    if fsdp:
        fully_shard(model, mesh=mesh["dp"])
    return model


# -- the same placements, by hand ---------------------------------------------------------------


def _seq(x, mesh):  # an activation split over the sequence on "tp", the batch on "dp"
    return irt.mark_sharding_with_gradients(x, mesh, ("dp", "tp", None))


def _rep(x, mesh):  # the batch on "dp", the rest whole
    return irt.mark_sharding_with_gradients(x, mesh, ("dp",) + (None,) * (x.dim() - 1))


def _last(x, mesh):  # the last dim on "tp"
    return irt.mark_sharding_with_gradients(x, mesh, ("dp",) + (None,) * (x.dim() - 2) + ("tp",))


def annotate_by_hand(model, mesh: irt.Mesh):
    """``parallelize``'s placements as a torch_xla user writes them: ``mark_sharding`` on each
    parameter and ``mark_sharding_with_gradients`` on the activations the plan places."""
    col, row = (("dp", "tp"), None), ("dp", "tp")  # a Linear's weight: out x in
    for block in model.layers:
        att, ffn = block.attention, block.feed_forward
        for w in (att.wq, att.wk, att.wv, ffn.w1, ffn.w3):
            irt.mark_sharding_with_gradients(w.weight, mesh, col)
        for w in (att.wo, ffn.w2):
            irt.mark_sharding_with_gradients(w.weight, mesh, row)
        for norm in (block.attention_norm, block.ffn_norm):
            irt.mark_sharding_with_gradients(norm.weight, mesh, ("dp",))
            norm.register_forward_pre_hook(lambda m, args: (_seq(args[0], mesh),))
            norm.register_forward_hook(lambda m, args, out: _seq(out, mesh))
        att.register_forward_pre_hook(lambda m, args: (_rep(_seq(args[0], mesh), mesh), args[1]))
        ffn.register_forward_pre_hook(lambda m, args: (_rep(_seq(args[0], mesh), mesh),))
        for w in (att.wq, att.wk, att.wv, ffn.w1, ffn.w3):
            w.register_forward_pre_hook(lambda m, args: (_rep(args[0], mesh),))
            w.register_forward_hook(lambda m, args, out: _last(out, mesh))
        for w in (att.wo, ffn.w2):
            w.register_forward_pre_hook(lambda m, args: (_last(args[0], mesh),))
            w.register_forward_hook(lambda m, args, out: _seq(out, mesh))
    irt.mark_sharding_with_gradients(model.tok_embeddings.weight, mesh, (("dp", "tp"), None))
    model.tok_embeddings.register_forward_pre_hook(lambda m, args: (_rep(args[0], mesh),))
    model.tok_embeddings.register_forward_hook(lambda m, args, out: _seq(out, mesh))
    irt.mark_sharding_with_gradients(model.norm.weight, mesh, ("dp",))
    model.norm.register_forward_pre_hook(lambda m, args: (_seq(args[0], mesh),))
    model.norm.register_forward_hook(lambda m, args, out: _seq(out, mesh))
    irt.mark_sharding_with_gradients(model.output.weight, mesh, col)
    model.output.register_forward_pre_hook(lambda m, args: (_rep(_seq(args[0], mesh), mesh),))
    model.output.register_forward_hook(lambda m, args, out: _rep(out, mesh))
    return model
