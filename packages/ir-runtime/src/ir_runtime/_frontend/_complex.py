"""Front-end handlers for complex tensors: the ops torch implements as views or conjugate bits
(view_as_real, view_as_complex, conj, real, imag), recorded as values.

The lazy device keeps no conjugate or negative bit: ``_conj`` (what ``Tensor.conj()`` calls on
a complex tensor) is recorded as an op whose value is the conjugate (its rule is in
``_lowering/fft.py``, beside ``view_as_real``/``view_as_complex``, which are recorded as the
view ops they are); ``real``/``imag`` are torch's composites of those. So ``is_conj()`` is False
on the lazy device, and ``resolve_conj``/``resolve_neg`` return the value as it is.

Autograd's formulas for complex (and some real) functions also build *efficient zero tensors*
(``sgn``'s gradient of a real input, a real input's imaginary cotangent): a factory on the
lazy device, recorded here as zeros.
"""

from __future__ import annotations

import torch

from ir_runtime._frontend._record import DEVICE
from ir_runtime._frontend._tensor import record

aten = torch.ops.aten
_lib = torch.library.Library("aten", "IMPL", "Lazy")


def _efficientzerotensor(size, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    return record(aten.zeros.default, ([int(s) for s in size],), {"dtype": dtype, "device": DEVICE})


_lib.impl("_efficientzerotensor", _efficientzerotensor)
