"""Front-end handlers for complex tensors: the ops torch implements as views or conjugate bits
(view_as_real, view_as_complex, conj, real, imag), recorded as values."""

from __future__ import annotations
