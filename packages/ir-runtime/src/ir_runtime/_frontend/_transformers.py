"""Hugging Face transformers, on lazy tensors: its checks that exist only to warn, or to skip
work a valid branch would do anyway, read no data.

``PreTrainedModel.warn_if_padding_and_no_attention_mask`` looks at the first and last token of
every batch passed without an attention mask (``pad_token_id in input_ids[:, [-1, 0]]``) to warn
once that the batch may be padded: on the lazy device that read would run the step so far and
copy the ids to the host, on every forward, and a compiled step that reads a value into Python
is never replayed (GPT-2's training step with a pad token). transformers skips the check while
it is traced (Dynamo, jit, FX); a lazy step skips it too: it changes no value, only whether a
warning is printed.

Its attention masks (``masking_utils``) are built unless they can be skipped: with no padding
(``padding_mask.all()``) and a causal query (``q_offset``), SDPA's ``is_causal`` does the same
work. Deciding that reads the mask or the cache position to the host, mid-step, every forward;
transformers does not decide it while tracing (``is_tracing(tensor)``), and builds the mask,
which is valid either way. A lazy tensor is treated as traced there: the mask is always built
(with the same values), and the step reads nothing. (transformers 5 asks ``is_tracing``; 4.x
decides in ``_ignore_causal_mask_sdpa`` and ``_ignore_bidirectional_mask_sdpa``, which say
"not skippable" for lazy masks here.)

A lazy model's ``generate`` takes ``irt.generate``'s path (``steps/_generate.py``): its
bookkeeping on the host and the static cache, so the number of programs is bounded.

Applied when the front end is installed and whenever a module is made lazy or a compiled step
traced, so transformers imported at any point is covered.
"""

from __future__ import annotations

import functools
import sys

from ir_runtime._frontend.recording._tensor import LazyTensor


def patch() -> None:
    """Make transformers' warn-only and skip-only checks read no lazy data (once transformers
    is imported)."""
    _masks(sys.modules.get("transformers.masking_utils"))
    _generate(sys.modules.get("transformers.generation.utils"))
    modeling = sys.modules.get("transformers.modeling_utils")
    cls = getattr(modeling, "PreTrainedModel", None)
    check = getattr(cls, "warn_if_padding_and_no_attention_mask", None)
    if check is None or getattr(check, "_lazy", False):
        return

    @functools.wraps(check)
    def warn_if_padding_and_no_attention_mask(self, input_ids, attention_mask):
        if isinstance(input_ids, LazyTensor):  # (its only effect is a warning)
            return None
        return check(self, input_ids, attention_mask)

    warn_if_padding_and_no_attention_mask._lazy = True
    cls.warn_if_padding_and_no_attention_mask = warn_if_padding_and_no_attention_mask


def _masks(masking) -> None:
    if masking is None or getattr(masking, "_lazy", False):
        return
    traced = getattr(masking, "is_tracing", None)
    if callable(traced):  # transformers 5

        @functools.wraps(traced)
        def is_tracing(tensor=None):
            return isinstance(tensor, LazyTensor) or traced(tensor)

        masking.is_tracing = is_tracing
    else:  # transformers 4: the two skip decisions themselves
        for name in ("_ignore_causal_mask_sdpa", "_ignore_bidirectional_mask_sdpa"):
            decide = getattr(masking, name, None)
            if decide is not None:
                setattr(masking, name, _never_for_lazy(decide))
    masking._lazy = True


def _never_for_lazy(decide):
    @functools.wraps(decide)
    def skippable(*args, **kwargs):
        if any(isinstance(a, LazyTensor) for a in (*args, *kwargs.values())):
            return False  # (building the mask is valid either way)
        return decide(*args, **kwargs)

    return skippable


def _generate(generation) -> None:
    mixin = getattr(generation, "GenerationMixin", None)
    if mixin is None:
        return
    from ir_runtime._frontend.steps._generate import lazy_model_generate

    mixin.generate = lazy_model_generate(mixin.generate)
