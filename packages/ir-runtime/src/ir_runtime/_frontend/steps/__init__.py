"""Steps: ``mark_step``, host reads, compiled steps and generation (see ``_frontend``'s map)."""
