"""Data in and out: sharded checkpoints and the sharded loader (see ``_frontend``'s map)."""
