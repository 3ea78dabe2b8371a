"""Binary math (issue 30): ``atan2``, ``copysign``, ``fmod``, ``remainder``
(``%``), ``floor_divide`` (``//``), ``logaddexp``, a tensor exponent in
``pow``, ``div(rounding_mode=)``, ``lerp``, and the tests ``isnan``,
``isinf``, ``isfinite``, ``isclose``, ``any``, ``all``.

The binary ones are one ``binary`` kernel forward and one backward each,
from their records in ``kernels/codes.py`` (with NumPy broadcasting; a
Python number takes the tensor's dtype and device, as PyTorch). ``lerp``,
``div(rounding_mode="trunc")`` and the tests are compositions of existing
ops. The tests return boolean tensors, as the comparisons do.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..kernels import codes
from ..tensor import Tensor
from . import elementwise as ew
from ._common import axis_of, is_scalar, operand, pair
from .activations import abs as _abs
from .masks import astype, eq, gt, le, lt, ne, where
from .reductions import sum as _sum


def _binary(code: int, name: str, a: Any, b: Any) -> Tensor:
    return ew._binary(code, a, b, name)


def atan2(a: Any, b: Any) -> Tensor:
    """The angle of the point (b, a), elementwise (``torch.atan2``); its
    gradient b / (a^2 + b^2), -a / (a^2 + b^2) is nan at (0, 0)."""
    return _binary(codes.ATAN2, "atan2", a, b)


def copysign(a: Any, b: Any) -> Tensor:
    """|a| with the sign of b (``torch.copysign``; the gradient to a is +-1,
    0 where a == 0, and b gets none)."""
    return _binary(codes.COPYSIGN, "copysign", a, b)


def fmod(a: Any, b: Any) -> Tensor:
    """C's fmod: the remainder of a / b with the sign of a (``torch.fmod``,
    ``np.fmod``); gradients 1 and -trunc(a / b); nan where b == 0."""
    return _binary(codes.FMOD, "fmod", a, b)


def remainder(a: Any, b: Any) -> Tensor:
    """``a % b`` with the sign of b (``torch.remainder``, ``np.mod``; a zero
    result keeps a's sign, as PyTorch's, where NumPy's takes b's);
    gradients 1 and -floor(a / b); nan where b == 0."""
    return _binary(codes.REMAINDER, "remainder", a, b)


def floor_divide(a: Any, b: Any) -> Tensor:
    """Python's ``a // b``, floor(a / b) (``torch.floor_divide``,
    ``np.floor_divide``); no gradient flows (0), as PyTorch's."""
    return _binary(codes.FLOOR_DIVIDE, "floor_divide", a, b)


def logaddexp(a: Any, b: Any) -> Tensor:
    """log(exp(a) + exp(b)) without overflow (``torch.logaddexp``)."""
    return _binary(codes.LOGADDEXP, "logaddexp", a, b)


def lerp(start: Any, end: Any, weight: Any) -> Tensor:
    """start + weight * (end - start) (``torch.lerp``; ``weight`` a number
    or a tensor; PyTorch computes end - (end - start) (1 - weight) for
    weight >= 0.5, which may differ in the last bit)."""
    start = operand(start, "lerp")
    return start + weight * (end - start)


def isnan(x: Any) -> Tensor:
    """Whether each element is nan: a boolean tensor (``torch.isnan``)."""
    x = operand(x, "isnan")
    return ne(x, x)


def isinf(x: Any) -> Tensor:
    """Whether each element is +-inf (``torch.isinf``)."""
    x = operand(x, "isinf")
    return eq(_abs(x), float("inf"))


def isfinite(x: Any) -> Tensor:
    """Whether each element is neither inf nor nan (``torch.isfinite``)."""
    x = operand(x, "isfinite")
    return lt(_abs(x), math.inf)


def isclose(a: Any, b: Any, rtol: float = 1e-05, atol: float = 1e-08,
            equal_nan: bool = False) -> Tensor:
    """|a - b| <= atol + rtol |b| elementwise, equal infinities close too
    (``torch.isclose``, ``np.isclose``); nan is close to nan only with
    ``equal_nan``."""
    if not (is_scalar(rtol) and is_scalar(atol)) or rtol < 0 or atol < 0:
        raise ValueError(f"isclose: rtol and atol must be numbers >= 0, got {rtol!r}, {atol!r}")
    a, b = pair(a, b, "isclose")
    # equal values (inf == inf too) are close; elsewhere an inf or nan makes
    # the gap inf or nan against a finite tolerance (no inf - inf is formed)
    same = eq(a, b)
    a0, b0 = where(same, 0.0, a), where(same, 0.0, b)
    gap = _abs(a0 - b0)
    size = where(lt(_abs(b0), math.inf), _abs(b0), 0.0)
    if equal_nan:
        gap = where(isnan(a), where(isnan(b), 0.0, gap), gap)
    return le(gap, atol + rtol * size)


def _truth_count(x: Any, axis: Any, keepdims: bool, op: str) -> tuple[Tensor, int]:
    """How many elements are true (non-zero; nan counts) over ``axis``, as
    float64 (exact to 2**53), and how many elements each count covers."""
    x = operand(x, op, ints=True)
    mask = x if x.dtype == np.bool_ else ne(x, 0)
    axes = range(x.ndim) if axis is None else \
        [axis_of(a, x.ndim, op) for a in (axis if isinstance(axis, (tuple, list)) else (axis,))]
    count = math.prod(x.shape[a] for a in set(axes))
    return _sum(astype(mask, np.float64), axis, keepdims), count


def any(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Whether any element over ``axis`` is true (non-zero, nan included): a
    boolean tensor, as ``torch.any``/``np.any``; False over nothing."""
    total, _ = _truth_count(x, axis, keepdims, "any")
    return gt(total, 0.0)


def all(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Whether every element over ``axis`` is true, as ``torch.all``/``np.all``;
    True over nothing."""
    total, count = _truth_count(x, axis, keepdims, "all")
    return eq(total, float(count))
