"""One bounded memo for every cache in ir_runtime whose keys come from the user's data (shapes,
scalar values, shardings, meshes): a long run whose shapes keep changing must not grow."""

from __future__ import annotations


class Bounded(dict):
    """A dict that keeps at most ``capacity`` entries, dropping the oldest insertion first.

    A plain ``dict`` underneath, so lookups (``d.get(k)``, ``d[k]``, also from Cython, which
    reads the dict directly) cost what a dict's do; only inserting a new key pays for the
    bound. Insert with ``d[k] = v`` (``setdefault`` and ``update`` bypass the bound)."""

    __slots__ = ("capacity",)

    def __init__(self, capacity: int):
        super().__init__()
        if capacity < 1:
            raise ValueError(f"a bounded cache needs a capacity of at least 1, got {capacity}")
        self.capacity = capacity

    def __setitem__(self, key, value) -> None:
        if len(self) >= self.capacity and key not in self:
            self.pop(next(iter(self)), None)  # (another thread may have dropped it first)
        dict.__setitem__(self, key, value)

    def setdefault(self, key, default=None):
        raise TypeError("Bounded.setdefault would bypass the bound; use get and d[k] = v")

    def update(self, *args, **kwargs):
        raise TypeError("Bounded.update would bypass the bound; insert with d[k] = v")
