"""Regions: bodies traced once (``shard_map``, ``scan_layers``) and scopes (recompute,
autocast, layouts) (see ``_frontend``'s map)."""
