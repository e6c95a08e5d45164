"""The one exception ir_sharding raises for bad input."""


class ShardingError(ValueError):
    """A mesh, partition spec or annotation that breaks a rule; the message names the value,
    the rule and the fix. Nothing is changed by a call that raised it."""
