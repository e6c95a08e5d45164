"""Front-end handlers for complex tensors: the ops torch implements as views or conjugate bits
(view_as_real, view_as_complex, conj, real, imag), recorded as values.

None is needed: the lazy device keeps no conjugate or negative bit. ``_conj`` (what
``Tensor.conj()`` calls on a complex tensor) reaches the dispatch like any op and is recorded
as a view whose value is the conjugate (its rule is in ``_lowering/fft.py``, beside
``view_as_real``/``view_as_complex``, recorded as the views they are, so writing through one
is refused clearly rather than lost); ``real``/``imag`` are torch's composites of those. So
``is_conj()`` is False on the lazy device, and ``resolve_conj``/``resolve_neg`` return the value
as it is. (Autograd's efficient zero tensors are a factory: ``_factories``.)
"""

from __future__ import annotations
