"""``generate(model, ...)``: Hugging Face generation with its bookkeeping on the host.

transformers' ``generate`` grows ``input_ids`` and ``attention_mask`` by one column per token.
On the lazy device each growth is a new shape, so each token would be a new program, even with
the static KV cache. Here the model's forward runs on the lazy device and everything around it
runs on the host, as eager: the token ids, the attention mask, the cache positions, the
logits processors, sampling (torch's own CPU generator: the same draws as eager for the same
seed) and the stopping criteria. Each forward returns its logits to the host: one read per
token, whose program holds that token's forward and the KV cache update. With
``cache_implementation="static"`` every decoding step has the same shapes, so generation of
any length compiles two programs (the prefill and the decoding step) and then only hits the
cache. With the default dynamic cache the cache grows, and each token is its own program.

transformers keeps a static cache on the model between calls and zeroes it for the next one.
On the lazy device that reuse costs two programs more (the zeroing, pending, joins the next
prefill, and the cache's length is read to the host first): each call here starts a fresh
cache instead, which the prefill program allocates itself, so later generations of the same
shapes compile nothing.

Encoder-decoder models (T5) build their decoder's attention mask, when none is given, as ones
of the length so far: one more column each token, a new program each token even with the static
cache. Here, with a static cache, each decoding forward is given that mask already at the
cache's full length, zeros past the tokens so far (positions the causal mask hides anyway), so
every step has the shapes of the one before: eager's tokens, two programs.

transformers 5 builds a static cache's 4-d attention mask in ``generate`` itself, on the device
of the token ids (the host here), from the cache's length, which is a lazy tensor: a read per
token, and a mask of the length so far, a new shape per token. Here that mask is built on the
lazy device instead (the model's ``create_masks_for_generate``, for the call's duration), from
the 2-d mask at the cache's full length (zeros past the tokens so far, which the causal mask
hides anyway): inside each token's program, with its shapes. The logits are read once every
pending tensor has run (``mark_step``): each token's program holds the whole step, its cache
updates included, so every token runs the same program.

A decoder-only model's decoding steps (one new token per row, the static cache) go through
``compile_step`` (``_Decoding``): the first few are traced, then each replays the same program
without running the forward's Python, as ``jax.jit`` would, the cache's tensors written in
place by the program (donated). The 2-d mask at the cache's full length is then the forward's
argument, and the forward builds its 4-d mask inside the step. Where a replay could not be the
call it replaces, every token runs the forward: a hook inside the model (it would run on
traced calls only), a cache that counts in Python (a sliding window's counter, seen changing
in the prefill or in a traced step), and whatever ``compile_step`` itself finds (transformers
4 setting layers' ``forward`` to record hidden states).

``model.generate(...)`` on a lazy model (``GenerationMixin.generate``, patched when the front
end is installed) takes this path, as ``irt.generate`` does, with the static cache unless the
call chooses a cache:
eager's tokens with two or three programs for any number of tokens, where transformers' own
loop on the lazy device compiles a program per token. Greedy decoding and sampling (with every
logits processor, stopping criterion and streamer: they run on the host, as eager) are the
modes this path has; beam search, assisted decoding, contrastive search and a cache the caller
made are refused by name (``UnsupportedOpError``). A call that asks for a growing cache
(``cache_implementation="dynamic"``, ``use_cache=False``) gets it, a program per token, with
one ``GenerationWarning`` saying so.
"""

from __future__ import annotations

import copy
import functools
import inspect
import warnings

import torch

from ir_runtime._errors import UnsupportedOpError
from ir_runtime._frontend.recording._api import to_lazy
from ir_runtime._frontend.recording._tensor import LazyTensor
from ir_runtime._frontend.steps._capture import CaptureWarning, CompiledStep
from ir_runtime._frontend.steps._step import mark_step, to_torch

_NONE = object()
_ACTIVE = [0]  # generate() calls under way: transformers' own generate runs inside them
_MODES = ("GREEDY_SEARCH", "SAMPLE")  # the generation modes this path has


class GenerationWarning(UserWarning):
    """A lazy model's generation compiles a program per token; the message says why."""


def _logits_to_host(module, args, kwargs, out):
    logits = getattr(out, "logits", None)
    if isinstance(logits, LazyTensor):
        mark_step()  # (the token's whole step, cache updates included: one program per token)
        out.logits = to_torch(logits)
    return out


def _static_length(cache):
    """The length of a static KV cache (an encoder-decoder's self-attention one), else None."""
    inner = getattr(cache, "self_attention_cache", cache)
    # (transformers 4's name, then 5's)
    get = getattr(inner, "get_max_cache_shape", None) or getattr(inner, "get_max_length", None)
    n = get() if get is not None else None
    return n if isinstance(n, int) and n > 0 else None


def _lazy_masks(model, total: int | None, decoding=None):
    """``create_masks_for_generate`` (the model's own, or transformers') building the mask on
    the lazy device from the 2-d mask at the static cache's full length, or the generation's
    (``total``: prompt and new tokens) when that is longer (a sliding window's cache holds
    the window only): module docstring."""
    made = getattr(model, "create_masks_for_generate", None)  # (bound, as generate finds it)
    if made is None:
        from transformers.masking_utils import create_masks_for_generate as made

    def create_masks_for_generate(*args, **kwargs):
        for name in ("inputs_embeds", "input_embeds"):  # (transformers 5's name, 4's)
            e = kwargs.get(name)
            if isinstance(e, torch.Tensor) and not isinstance(e, LazyTensor):
                kwargs[name] = torch.empty(e.shape, dtype=e.dtype, device="lazy")
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and not isinstance(mask, LazyTensor):
            length = _static_length(kwargs.get("cache", kwargs.get("past_key_values")))
            if length is not None and total is not None:
                length = max(length, total)
            if length is not None and mask.ndim == 2 and mask.shape[-1] <= length:
                full = mask.new_zeros(mask.shape[0], length)
                full[:, : mask.shape[-1]] = mask
                mask = full
            kwargs["attention_mask"] = to_lazy(mask)
            position = kwargs.get("cache_position")
            if isinstance(position, torch.Tensor) and not isinstance(position, LazyTensor):
                # (transformers 4 moves the mask to the positions' device: a read from the host)
                kwargs["cache_position"] = to_lazy(position)
            embeds = kwargs.get("inputs_embeds", kwargs.get("input_embeds"))
            one = isinstance(embeds, torch.Tensor) and embeds.dim() >= 2 and embeds.shape[1] == 1
            if one and decoding is not None and decoding.on:
                # (a replayed decoding step: the forward builds the 4-d mask from the 2-d one,
                # inside the step, as it does outside generate)
                return kwargs["attention_mask"]
        return made(*args, **kwargs)

    return create_masks_for_generate


def _total(model, inputs, kwargs) -> int | None:
    """The length a generation reaches: its prompt and new tokens (None when unknown)."""
    ids = inputs if inputs is not None else kwargs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return None
    new = kwargs.get("max_new_tokens")
    if isinstance(new, int):
        return ids.shape[-1] + new
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    n = getattr(config, "max_new_tokens", None)
    if isinstance(n, int):
        return ids.shape[-1] + n
    n = kwargs.get("max_length", getattr(config, "max_length", None))
    return n if isinstance(n, int) else None


def _full_decoder_mask(module, args, kwargs):
    """An encoder-decoder's decoding forward with a static cache: its decoder attention mask
    at the cache's full length (module docstring)."""
    if not getattr(module.config, "is_encoder_decoder", False):
        return None
    length = _static_length(kwargs.get("past_key_values"))
    position = kwargs.get("cache_position")
    ids = kwargs.get("decoder_input_ids")
    if length is None or not isinstance(position, torch.Tensor) or ids is None:
        return None
    if isinstance(position, LazyTensor) or position.numel() == 0:
        return None
    mask = kwargs.get("decoder_attention_mask")
    full = torch.zeros(ids.shape[0], length, dtype=torch.long)
    if mask is None:
        full[:, : int(position[-1]) + 1] = 1
    else:
        mask = to_torch(mask)
        full[:, : mask.shape[-1]] = mask
    kwargs["decoder_attention_mask"] = full
    return args, kwargs


_CACHE_FIELDS = ("cache", "past_key_values")


def _counted(before: list, after: list) -> bool:
    """Whether a number the cache had before a call (not a flag) changed in it: a counter in
    Python (a sliding window's), which a replay would not advance."""
    for b, a in zip(before, after, strict=False):
        for k, v in b.items():
            if type(v) in (int, float) and a.get(k, v) != v:
                return True
    return False


def _global_module_hooks() -> bool:
    from torch.nn.modules import module

    return any(
        getattr(module, name, None)
        for name in ("_global_forward_hooks", "_global_forward_pre_hooks")
    )


def _cache_of(kwargs):
    """The cache a forward is given (transformers 5's name, then 4's)."""
    cache = kwargs.get("cache")
    return kwargs.get("past_key_values") if cache is None else cache


def _python_state(cache) -> list:
    """A cache's Python state: per object (the cache, its layers), every attribute that is not
    a tensor, and which tensor each tensor attribute is."""
    objects = [cache, *getattr(cache, "layers", ())]
    return [
        {k: ("tensor", id(v)) if isinstance(v, torch.Tensor) else v for k, v in vars(o).items()}
        for o in objects
    ]


class _Decoding:
    """A decoder-only model's forward as generation calls it, its decoding steps (one new token
    per row, a static cache) replayed by ``compile_step``: their Python runs on the first calls
    only, as ``jax.jit``'s would (module docstring). The cache's tensors are written in place,
    which a replay redoes; a cache whose Python state changes from call to call (a sliding
    window's counter) is not replayed: every call runs the forward."""

    def __init__(self, model):
        self.forward = model.forward  # the model's own, bound
        # transformers reads the forward's signature (whether to build position ids from the
        # mask, pass logits_to_keep, infer a mask from the pad token, which keywords it takes):
        # it must see the model's own.
        self.__signature__ = inspect.signature(model.forward)
        self.step = CompiledStep(self._decode)
        self.output = None  # the forward's output type, from a traced call
        # A hook inside the forward would run on traced calls only: such a model runs every call.
        inner = [m for m in model.modules() if m is not model]
        self.on = not _global_module_hooks() and not any(
            m._forward_hooks or m._forward_pre_hooks for m in inner
        )

    def decodes(self, kwargs) -> bool:
        """Whether a forward with ``kwargs`` is a decoding step this replays."""
        ids = kwargs.get("input_ids")
        return (
            self.on
            and _static_length(_cache_of(kwargs)) is not None
            and isinstance(ids, torch.Tensor)
            and ids.dim() == 2
            and ids.shape[-1] == 1
        )

    def _decode(self, tensors, rest):
        out = self.forward(**tensors, **rest)
        self.output = type(out)
        # (every field it gives, hidden states and attentions too, but the cache: the call's own)
        return {k: v for k, v in out.items() if k not in _CACHE_FIELDS}

    def __call__(self, *args, **kwargs):
        cache = _cache_of(kwargs)
        if args or cache is None:
            return self.forward(*args, **kwargs)
        before = _python_state(cache)
        if not self.decodes(kwargs):  # (the prefill: its cache's lazy set-up changes it all)
            out = self.forward(**kwargs)
            self.on = self.on and not _counted(before, _python_state(cache))
            return out
        tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
        rest = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CaptureWarning)  # (not replayed: traced, as before)
            fields = self.step(tensors, rest)
        # (a traced call that changed it: the next ones run the forward)
        self.on = _python_state(cache) == before
        names = getattr(self.output, "__dataclass_fields__", ())
        name = "cache" if "cache" in names else "past_key_values"  # (transformers 5's, 4's)
        return self.output(**fields, **{name: cache})


def generate(model, inputs=None, **kwargs):
    """``model.generate(inputs, **kwargs)`` (a Hugging Face model moved with ``to_lazy``),
    with the forward on the lazy device and the rest on the host (module docstring).

    Args:
        model: a transformers ``GenerationMixin`` model on the lazy device.
        inputs: the prompt's token ids, lazy or host (as ``generate``'s first argument).
        **kwargs: ``generate``'s own: ``attention_mask``, ``max_new_tokens``, ``do_sample``,
            ... (lazy tensors among them are read first); the static cache unless the call
            chooses a cache, as ``model.generate`` on a lazy model.

    Returns:
        What ``generate`` returns; its token ids lazy when ``inputs`` was lazy, else on the host.
    """
    return _generate(model, inputs, _cache_defaults(model, kwargs))


def _generate(model, inputs, kwargs: dict):
    _refuse(model, kwargs)
    lazy_inputs = isinstance(inputs, LazyTensor) or isinstance(kwargs.get("input_ids"), LazyTensor)
    kwargs = {k: to_torch(v) for k, v in kwargs.items()}
    model.__dict__.pop("_cache", None)  # a fresh static cache (module docstring)
    _ACTIVE[0] += 1
    hook = model.register_forward_hook(_logits_to_host, with_kwargs=True)
    masks = model.register_forward_pre_hook(_full_decoder_mask, with_kwargs=True)
    own = model.__dict__.get("create_masks_for_generate", _NONE)
    own_forward = model.__dict__.get("forward", _NONE)
    decoding = None
    if not getattr(model.config, "is_encoder_decoder", False):
        decoding = model.forward = _Decoding(model)
    model.create_masks_for_generate = _lazy_masks(model, _total(model, inputs, kwargs), decoding)
    try:
        with warnings.catch_warnings():
            # Host token ids beside a lazy model are the point here, not a mistake.
            warnings.filterwarnings("ignore", message=".*on a device type different than")
            out = type(model).generate(model, to_torch(inputs), **kwargs)
    finally:
        _ACTIVE[0] -= 1
        hook.remove()
        masks.remove()
        for name, was in (("create_masks_for_generate", own), ("forward", own_forward)):
            if was is _NONE:
                model.__dict__.pop(name, None)
            else:
                setattr(model, name, was)
    if not lazy_inputs:
        return out
    if isinstance(out, torch.Tensor):
        return to_lazy(out)
    out.sequences = to_lazy(out.sequences)
    return out


def _config(model, kwargs):
    """The generation config this call runs with: the model's (or the call's), updated by the
    call's keywords, as ``generate`` makes it."""
    config = copy.deepcopy(kwargs.get("generation_config") or model.generation_config)
    config.update(**{k: v for k, v in kwargs.items() if k != "generation_config"})
    return config


def _refuse(model, kwargs) -> None:
    """The calls this path cannot bound, by name (module docstring)."""
    for name in ("past_key_values", "cache"):
        if kwargs.get(name) is not None:
            raise UnsupportedOpError(
                f"generate on the lazy device: `{name}` (a cache made by the caller) is not "
                f"supported; leave it out (the static cache is made for the call) or generate "
                f"with the eager model"
            )
    config = _config(model, kwargs)
    mode = config.get_generation_mode(kwargs.get("assistant_model"))
    name = getattr(mode, "name", str(mode))
    if name not in _MODES:
        raise UnsupportedOpError(
            f"generate on the lazy device: {name.lower().replace('_', ' ')} is not supported "
            f"(greedy decoding and sampling are); generate with the eager model for it"
        )


def _cache_defaults(model, kwargs) -> dict:
    """``kwargs`` with the static cache where the call chose none (module docstring); one
    warning where the call's choice grows the cache."""
    config = _config(model, kwargs)
    chosen = config.cache_implementation
    if config.use_cache is False:
        why = "use_cache=False (the whole sequence again each token)"
    elif chosen in _static_caches():
        return kwargs
    elif chosen is None and not _own_cache(model):
        return {**kwargs, "cache_implementation": "static"}
    elif chosen is None:
        why = f"{type(model).__name__}'s own cache (it takes no static one)"
    else:
        why = f"cache_implementation={chosen!r} (a cache that grows)"
    warnings.warn(
        f"generate on the lazy device with {why}: every token is a new shape, so each compiles "
        f"a program of its own; the static cache (cache_implementation='static', the default "
        f"here) compiles two for any number of tokens",
        GenerationWarning,
        stacklevel=3,
    )
    return kwargs


def _static_caches() -> frozenset:
    """The ``cache_implementation`` names transformers gives a cache of fixed length."""
    from transformers.generation import configuration_utils as c

    names = getattr(c, "ALL_STATIC_CACHE_IMPLEMENTATIONS", None)
    if names is None:  # (transformers 4)
        names = getattr(c, "STATIC_CACHE_IMPLEMENTATIONS", ("static",))
    return frozenset(names)


def _own_cache(model) -> bool:
    """Whether the model makes a cache of its own kind, not transformers' (Mamba, XLNet)."""
    supports = getattr(model, "_supports_default_dynamic_cache", None)
    return callable(supports) and not supports()


def lazy_model_generate(original):
    """``GenerationMixin.generate`` that sends a lazy model's call here (module docstring)."""
    if getattr(original, "_lazy", False):
        return original
    signature = inspect.signature(original)

    @functools.wraps(original)
    def generate_(self, *args, **kwargs):
        first = next(self.parameters(), None) if isinstance(self, torch.nn.Module) else None
        if _ACTIVE[0] or not isinstance(first, LazyTensor):
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs).arguments
        bound.pop("self")
        bound.update(bound.pop("kwargs", {}))
        inputs = bound.pop("inputs", None)
        return _generate(self, inputs, _cache_defaults(self, bound))

    generate_._lazy = True
    return generate_
