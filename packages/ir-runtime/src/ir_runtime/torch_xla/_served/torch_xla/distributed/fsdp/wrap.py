"""``torch_xla.distributed.fsdp.wrap``: the auto-wrap policies (torch's own, whose signature
torch_xla's share: ``policy(module, recurse, nonwrapped_numel)``)."""

from torch.distributed.fsdp.wrap import (  # noqa: F401
    always_wrap_policy,
    lambda_auto_wrap_policy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)
