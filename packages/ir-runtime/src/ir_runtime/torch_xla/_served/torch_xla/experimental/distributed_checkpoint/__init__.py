"""``torch_xla.experimental.distributed_checkpoint``: torch_xla's checkpoints, in
``torch.distributed.checkpoint``'s (DCP's) format, for the engine's tensors."""

from .manager import CheckpointManager
from .planners import SPMDLoadPlanner, SPMDSavePlanner
from .util import prime_optimizer

__all__ = ["CheckpointManager", "SPMDLoadPlanner", "SPMDSavePlanner", "prime_optimizer"]
