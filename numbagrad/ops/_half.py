"""Half precision: float16 and bfloat16 tensors, stored as halves, computed in float32.

A half tensor's data is a float16 (NumPy's) or bfloat16 (``ml_dtypes``')
array. Numba types neither, so the kernels never see one: the casts
(``kernels/*/half.py``) read and write their bits through uint16 views, and
every op given half tensors computes in float32 and returns a half, as
PyTorch's half ops do (their own kernels widen to float32 inside): its half
operands are cast to float32, the op runs on its float32 kernels, and its
float outputs are rounded back to the half dtype. Matrix products thus
accumulate in float32 (``matmul``, ``linear``, batched products) and
elementwise ops, reductions, softmax, norms and losses compute in float32.
Both casts are recorded, so gradients flow back through them: a half
tensor's gradient is a half, as PyTorch's.

The casting runs in a wrapper around each op of the table, installed when
the first half tensor is made (``enable``), so the float32 and float64
paths pay nothing while no half tensor exists. Mixed operands promote as
``torch.result_type`` (float16 with float32 is float32; the op's own checks
then cast the half operand). Not offered: half tensors inside ``ng.compile``
and in-place methods on half tensors.
"""
from __future__ import annotations

import functools
import threading
from typing import Any

import numpy as np

from .. import _dtypes, buffers, kernels
from ..tape import Node, _Backward
from ..tensor import Tensor
from ._common import ones, result

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
_U16, _U32 = np.dtype(np.uint16), np.dtype(np.uint32)
HALVES = _dtypes.HALVES
FLOAT16, BFLOAT16 = _dtypes.FLOAT16, _dtypes.BFLOAT16


def kind_of(dtype: np.dtype) -> int:
    """The half format's code in ``kernels/*/half.py``: 0 float16, 1 bfloat16."""
    return 0 if dtype == FLOAT16 else 1


def _bits(kern: Any, array: Any) -> Any:
    """A C-contiguous uint16 view of a half array (a copy when it is strided)."""
    if not kern.is_c_contiguous(array):
        if isinstance(array, np.ndarray):
            array = np.ascontiguousarray(array)
        else:
            array = kernels.from_host(kern, kernels.to_host(kern, array))
    return array.view(_U16)


def _float32(kern: Any, data: Any) -> Any:
    """A C-contiguous float32 array of float ``data``'s values (itself when it is one)."""
    from ._common import contiguous_array
    data = contiguous_array(kern, data)
    if data.dtype == _F32:
        return data
    out = buffers.take(kern, data.shape, _F32)
    kernels.call(kern, "astype", out.size, data, out, 0.0)
    return out


def widen(kern: Any, half: Any, out: Any = None) -> Any:
    """float32 values of the half array ``half`` (into ``out`` when given)."""
    if out is None:
        out = buffers.take(kern, half.shape, _F32)
    kernels.call(kern, "half_to_float", out.size, _bits(kern, half), out.view(_U32),
                 kind_of(half.dtype))
    return out


def narrow(kern: Any, data: Any, out: Any, beta: float = 0.0) -> None:
    """out (a half array) = float ``data`` rounded to out's format (+ beta * out,
    added in float32 before the rounding)."""
    src = _float32(kern, data)
    if beta != 0.0:
        acc = widen(kern, out)
        kernels.call(kern, "astype", acc.size, src, acc, float(beta))
        src = acc
    kernels.call(kern, "float_to_half", src.size, src.view(_U32), out.view(_U16),
                 kind_of(out.dtype))


def add_into(kern: Any, grad: Any, beta: float, dest: Any) -> None:
    """dest = grad + beta * dest where either is a half, in float32."""
    g = widen(kern, grad) if grad.dtype in HALVES else grad
    if dest.dtype in HALVES:
        narrow(kern, g, dest, beta)
    else:
        _write_float(kern, _float32(kern, g), dest, beta)


def _write_float(kern: Any, g32: Any, dest: Any, beta: float) -> None:
    """dest (float32 or float64) = float32 ``g32`` (of dest's size) + beta * dest."""
    kernels.call(kern, "astype", dest.size, g32, dest, float(beta))


# ------------------------------------------------------------------ casts
def to_float(x: Tensor, want: np.dtype = _F32) -> Tensor:
    """A half tensor as float32 (or float64): exact. Recorded: the gradient
    is rounded back to ``x``'s half format."""
    kern = x._kern
    out = widen(kern, x._data)
    if want != _F32:
        wide = buffers.take(kern, out.shape, want)
        kernels.call(kern, "astype", wide.size, out, wide, 0.0)
        out = wide
    return result(out, kern, (x,), _cast_backward)


def _cast_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    """Either cast's backward: the gradient added into the input's in the
    input's format (a half rounded, a float32 or float64 one widened; an
    accumulator kept in float32, the optimizers' master weights, stays so)."""
    (x,) = node.inputs
    dest, beta = ctx.dest(x)
    add_into(x._kern, ones(x._kern, x.shape, _F32) if gout is None else gout, beta, dest)


def to_half(x: Tensor, want: np.dtype) -> Tensor:
    """A float32/float64 tensor rounded to the half format ``want`` (to
    nearest, ties to even; a float64 is first rounded to float32). Recorded:
    the gradient is widened back."""
    kern = x._kern
    out = buffers.take(kern, x.shape, want)
    narrow(kern, x._data, out)
    return result(out, kern, (x,), _cast_backward)


def cast(x: Tensor, want: np.dtype, copy: bool = False) -> Tensor:
    """``astype`` where either side is a half: between floats recorded (the
    gradient is cast back), to and from integers and bools through float32
    with no gradient."""
    from .masks import astype   # (masks imports this module lazily)
    enable()
    if want == x.dtype:
        return to_half(to_float(x), want) if copy else x
    if x.dtype in HALVES:
        if want in HALVES:
            return to_half(to_float(x), want)
        if _dtypes.is_float(want):
            return to_float(x, want)
        return astype(Tensor(widen(x._kern, x._data), x._kern), want)
    if _dtypes.is_float(x.dtype):
        return to_half(x, want)
    return to_half(astype(x, _F32), want)


# ------------------------------------------------------------------ the op wrapper
def _tensors_in(args: tuple, kwargs: dict) -> list:
    """The tensors among the arguments (and inside list or tuple arguments)."""
    found = []
    for a in (*args, *kwargs.values()):
        if type(a) is Tensor:
            found.append(a)
        elif type(a) in (list, tuple):
            found.extend(v for v in a if type(v) is Tensor)
    return found


def _up(value: Any) -> Any:
    if type(value) is Tensor:
        return to_float(value) if value._data.dtype in HALVES else value
    if type(value) in (list, tuple):
        return type(value)(_up(v) for v in value)
    return value


def _down(value: Any, want: np.dtype) -> Any:
    if isinstance(value, Tensor):
        return to_half(value, want) if value._data.dtype == _F32 else value
    if isinstance(value, tuple) and hasattr(value, "_make"):   # a named tuple
        return value._make(_down(v, want) for v in value)
    if type(value) in (list, tuple):
        return type(value)(_down(v, want) for v in value)
    return value


def halved(fn: Any) -> Any:
    """``fn`` (an op) computing in float32 when its tensors' result type is
    a half, its float32 outputs rounded to that half."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        tensors = _tensors_in(args, kwargs)
        if not any(t._data.dtype in HALVES for t in tensors):
            return fn(*args, **kwargs)
        if kernels._observer is not None:
            raise RuntimeError(f"{fn.__name__}: half-precision tensors run eagerly; ng.compile "
                               f"does not record them (call the function without ng.compile)")
        want = _dtypes.result_type(*tensors)
        if want not in HALVES:   # mixed with wider floats: the op's own promotion (and refusal)
            return fn(*args, **kwargs)
        out = fn(*_up(args), **{k: _up(v) for k, v in kwargs.items()})
        return _down(out, want)

    run.__wrapped_op__ = fn   # type: ignore[attr-defined]
    return run


# the rows whose op does not compute on float tensors, or casts itself
_UNWRAPPED = {"astype"}
# recorded ops that Tensor reaches without a row: x.T
_HELPERS = (("shape", "_reversed_dims"),)
_enabled = [False]
_lock = threading.Lock()


def enable() -> None:
    """Install the half wrapper on every float op of the table, where the
    op is bound: the op rows, ``ng.`` and ``ops.``, ``ng.nn.functional``,
    the op modules (their calls of each other too), the Tensor methods and
    operators and the NumPy dispatch. Called when the first half tensor is
    made; idempotent."""
    if _enabled[0]:
        return
    with _lock:
        if _enabled[0]:
            return
        import sys

        from .. import ops as ops_pkg
        from ..nn import functional
        from . import table
        ng = sys.modules[__name__.split(".")[0]]
        swapped = {}
        for op in table.OPS:
            if op.integer or op.name in _UNWRAPPED:
                continue
            new = swapped.get(id(op.fn)) or halved(op.fn)   # (rows may share a function)
            swapped[id(op.fn)] = new
            object.__setattr__(op, "fn", new)
        op_modules = [m for name, m in sys.modules.items()
                      if name.startswith(ops_pkg.__name__ + ".") and m is not None]
        for space in (vars(ops_pkg), vars(ng), vars(functional), *map(vars, op_modules)):
            for name, value in list(space.items()):
                if id(value) in swapped and callable(value):
                    space[name] = swapped[id(value)]
        for mapping in (table.UFUNCS, table.FUNCTIONS):
            for name, value in list(mapping.items()):
                mapping[name] = swapped.get(id(value), value)
        for module, name in _HELPERS:
            module = sys.modules[f"{ops_pkg.__name__}.{module}"]
            setattr(module, name, halved(getattr(module, name)))
        table._install(Tensor)
        _enabled[0] = True
