"""Recording: torch ops on lazy tensors become ir-core nodes (see ``_frontend``'s map)."""
