"""Hugging Face transformers, on lazy tensors: its checks that exist only to warn read no data.

``PreTrainedModel.warn_if_padding_and_no_attention_mask`` looks at the first and last token of
every batch passed without an attention mask (``pad_token_id in input_ids[:, [-1, 0]]``) to warn
once that the batch may be padded: on the lazy device that read would run the step so far and
copy the ids to the host, on every forward, and a compiled step that reads a value into Python
is never replayed (GPT-2's training step with a pad token). transformers skips the check while
it is traced (Dynamo, jit, FX); a lazy step skips it too: it changes no value, only whether a
warning is printed. Applied when the front end is installed and whenever a module is made
lazy or a compiled step traced, so transformers imported at any point is covered.
"""

from __future__ import annotations

import functools
import sys

from ir_runtime._frontend.recording._tensor import LazyTensor


def patch() -> None:
    """Make transformers' warn-only checks skip lazy inputs (once transformers is imported)."""
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
