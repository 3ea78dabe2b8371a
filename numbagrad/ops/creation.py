"""Tensor creation, PyTorch's factories: ``zeros``, ``ones``, ``full``, ``empty``,
their ``*_like`` forms, ``arange``, ``linspace``, ``eye``, ``one_hot`` and the
random ``rand``, ``randn``, ``normal`` (and ``rand_like``, ``randn_like``),
with ``randint`` and ``multinomial``, which give int64 index arrays.

Each takes ``dtype=`` (default: ``ng.get_default_dtype()``; ``arange`` of
ints is int64 and ``full`` takes its value's kind, as PyTorch's), ``device=``
and ``requires_grad=`` (True gives a trainable leaf, as ``ng.param``; only a
float tensor may). Sizes are given as PyTorch's ``zeros(2, 3)`` or
``zeros((2, 3))``. The random ones give floats (``randint``: int64 indices).

The random ones draw from numbagrad's counter-based generator on the
tensor's device (``ng.manual_seed``, ``ng.random.get_state``), as dropout
does: a call advances its device's counter once, and element k is a
function of (seed, counter, k) alone (the same on both devices, whose
counters are separate), so a seed reproduces a run, eager or compiled. A
uniform takes 53 random bits per element (24 in float32, so it never
rounds up to 1), a normal is Box-Muller over two 53-bit uniforms. These are
not PyTorch's streams: a seed draws other numbers than ``torch.rand``.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _defaults, _dtypes, buffers, kernels
from .._defaults import float_dtype
from .. import random as _random
from ..kernels.cpu.random import NORMAL, UNIFORM, UNIFORM24
from ..tensor import Tensor
from ._common import operand, real_number, reshaped

def _size(size: tuple, op: str) -> tuple[int, ...]:
    """PyTorch's sizes: ``f(2, 3)``, ``f((2, 3))`` or ``f([2, 3])``."""
    if len(size) == 1 and isinstance(size[0], (Sequence, np.ndarray)) \
            and not isinstance(size[0], str):
        size = tuple(size[0])
    dims = []
    for n in size:
        if isinstance(n, (bool, np.bool_)):
            raise TypeError(f"{op}: sizes must be integers, got {size!r}")
        try:
            d = operator.index(n)
        except TypeError:
            raise TypeError(f"{op}: sizes must be integers, got {size!r}") from None
        if d < 0:
            raise ValueError(f"{op}: sizes must be >= 0, got {size!r}")
        dims.append(d)
    return tuple(dims)


def _checked(requires_grad: Any) -> bool:
    if not isinstance(requires_grad, (bool, np.bool_)):
        raise TypeError(f"requires_grad must be a bool, got {requires_grad!r}")
    return bool(requires_grad)


def _dtype(dtype: Any, who: str, requires_grad: Any, default: Any = None) -> np.dtype:
    """A factory's ``dtype=``: any a tensor holds (None: ``default``, else the
    default float); only a float one may require a gradient."""
    want = np.dtype(default or _defaults.get_default_dtype()) if dtype is None else \
        _dtypes.tensor_dtype(dtype, who)
    if _checked(requires_grad) and not _dtypes.is_float(want):
        raise TypeError(f"{who}: only float tensors can require gradients, not {want}")
    return want


def _filled(shape: tuple, value: Any, dtype: np.dtype, device: str,
            requires_grad: bool) -> Tensor:
    requires_grad = _checked(requires_grad)      # before anything is allocated or drawn
    kern = kernels.get(device)
    array = buffers.take(kern, shape, dtype) if not requires_grad else \
        kernels.empty(kern, shape, dtype)
    if dtype.itemsize == 2 and dtype in _dtypes.HALVES:   # filled through its bits (ops/_half.py)
        from ._half import enable
        enable()
        if value is not None and array.size:
            bits = np.array(value, np.float32).astype(dtype).view(np.uint16)
            kernels.call(kern, "fill", 0, _flat(array).view(np.uint16), int(bits))
    elif value is not None and array.size:     # (in the dtype: a large int64 stays exact)
        kernels.call(kern, "fill", 0, _flat(array),
                     float(value) if dtype.kind == "f" else dtype.type(value))
    return Tensor(array, kern, requires_grad=requires_grad)


def _flat(array: Any) -> Any:
    return reshaped(array, (array.size,))


def _from_host(array: np.ndarray, dtype: np.dtype, device: str, requires_grad: bool) -> Tensor:
    requires_grad = _checked(requires_grad)
    kern = kernels.get(device)
    if dtype.itemsize == 2 and dtype in _dtypes.HALVES:   # rounded from float32 (ops/_half.py)
        from ._half import enable
        enable()
        array = np.asarray(array, np.float32)
    return Tensor(kernels.from_host(kern, np.ascontiguousarray(array, dtype)), kern,
                  requires_grad=requires_grad)


def zeros(*size: Any, dtype: Any = None, device: str = "cpu",
          requires_grad: bool = False) -> Tensor:
    """A tensor of zeros (``torch.zeros``; any dtype a tensor holds)."""
    return _filled(_size(size, "zeros"), 0, _dtype(dtype, "zeros", requires_grad), device,
                   requires_grad)


def ones(*size: Any, dtype: Any = None, device: str = "cpu",
         requires_grad: bool = False) -> Tensor:
    """A tensor of ones (``torch.ones``)."""
    return _filled(_size(size, "ones"), 1, _dtype(dtype, "ones", requires_grad), device,
                   requires_grad)


def full(size: Any, fill_value: float, *, dtype: Any = None, device: str = "cpu",
         requires_grad: bool = False) -> Tensor:
    """A tensor of ``fill_value`` (``torch.full``: its dtype, unless given, is
    the value's: bool for a bool, int64 for an int, else the default float)."""
    value = _fill_value(fill_value, "full")
    dt = _dtype(dtype, "full", requires_grad, _dtypes.result_type(value))
    return _filled(_size((size,), "full"), value, dt, device, requires_grad)


def _fill_value(value: Any, who: str) -> Any:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    return real_number(value, who, "fill_value")


def empty(*size: Any, dtype: Any = None, device: str = "cpu",
          requires_grad: bool = False) -> Tensor:
    """A tensor whose contents are undefined (``torch.empty``)."""
    return _filled(_size(size, "empty"), None, _dtype(dtype, "empty", requires_grad), device,
                   requires_grad)


def _like(op: str, t: Any, dtype: Any, device: str | None, requires_grad: Any
          ) -> tuple[tuple, np.dtype, str]:
    t = operand(t, op, ints=True)
    return t.shape, _dtype(dtype, op, requires_grad, t.dtype), \
        t.device if device is None else device


def zeros_like(t: Any, *, dtype: Any = None, device: str | None = None,
               requires_grad: bool = False) -> Tensor:
    """Zeros of ``t``'s shape, dtype and device (each may be overridden)."""
    shape, dt, dev = _like("zeros_like", t, dtype, device, requires_grad)
    return _filled(shape, 0.0, dt, dev, requires_grad)


def ones_like(t: Any, *, dtype: Any = None, device: str | None = None,
              requires_grad: bool = False) -> Tensor:
    """Ones of ``t``'s shape, dtype and device (each may be overridden)."""
    shape, dt, dev = _like("ones_like", t, dtype, device, requires_grad)
    return _filled(shape, 1.0, dt, dev, requires_grad)


def full_like(t: Any, fill_value: float, *, dtype: Any = None, device: str | None = None,
              requires_grad: bool = False) -> Tensor:
    """``fill_value`` in ``t``'s shape, dtype and device."""
    shape, dt, dev = _like("full_like", t, dtype, device, requires_grad)
    return _filled(shape, _fill_value(fill_value, "full_like"), dt, dev, requires_grad)


def empty_like(t: Any, *, dtype: Any = None, device: str | None = None,
               requires_grad: bool = False) -> Tensor:
    """An undefined tensor of ``t``'s shape, dtype and device."""
    shape, dt, dev = _like("empty_like", t, dtype, device, requires_grad)
    return _filled(shape, None, dt, dev, requires_grad)


def arange(start: float, end: float | None = None, step: float = 1, *, dtype: Any = None,
           device: str = "cpu", requires_grad: bool = False) -> Tensor:
    """start, start + step, ... up to ``end`` excluded (``torch.arange``;
    ``arange(n)`` counts from 0): int64 when start, end and step are all
    ints (exact), else the default float, as PyTorch's. Float values are
    start + i * step in float64, then rounded to ``dtype``."""
    if end is None:
        start, end = 0, start
    a, b = real_number(start, "arange", "start"), real_number(end, "arange", "end")
    s = real_number(step, "arange", "step")
    if s == 0 or not all(map(math.isfinite, (a, b, s))):
        raise ValueError(f"arange: start, end and step must be finite and step non-zero, got "
                         f"start={a}, end={b}, step={s}")
    if (b - a) * s < 0:
        raise ValueError(f"arange: step {s} points away from end {b} (start {a}); PyTorch "
                         f"refuses it too")
    ints = all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
               for v in (start, end, step))
    dt = _dtype(dtype, "arange", requires_grad, np.int64 if ints else None)
    if ints:
        values = np.arange(int(start), int(end), int(step), dtype=np.int64)
    else:
        values = a + np.arange(math.ceil((b - a) / s), dtype=np.float64) * s
    return _from_host(values, dt, device, requires_grad)


def linspace(start: float, end: float, steps: int, *, dtype: Any = None, device: str = "cpu",
             requires_grad: bool = False) -> Tensor:
    """``steps`` values from ``start`` to ``end`` included, evenly spaced
    (``torch.linspace``, whose formula this is: the first half counted from
    start, the second from end, so both ends are exact; one step is start)."""
    a, b = real_number(start, "linspace", "start"), real_number(end, "linspace", "end")
    n = _size((steps,), "linspace")[0]
    i = np.arange(n, dtype=np.float64)
    step = (b - a) / (n - 1) if n > 1 else 0.0
    values = np.where(i < n // 2, a + i * step, b - (n - 1 - i) * step) if n > 1 else i + a
    return _from_host(values, _dtype(dtype, "linspace", requires_grad), device, requires_grad)


def eye(n: int, m: int | None = None, *, dtype: Any = None, device: str = "cpu",
        requires_grad: bool = False) -> Tensor:
    """An n x m identity (``torch.eye``; m defaults to n)."""
    rows, cols = _size((n, n if m is None else m), "eye")
    return _from_host(np.eye(rows, cols), _dtype(dtype, "eye", requires_grad), device,
                      requires_grad)


def _random_fill(shape: tuple, kind: int, a: float, b: float, dtype: np.dtype,
                 device: str, requires_grad: bool) -> Tensor:
    out = _filled(shape, None, dtype, device, requires_grad)
    if kind == UNIFORM and dtype == np.float32:   # 24 bits: never rounded up to 1
        kind = UNIFORM24
    kernels.call(out._kern, "random_fill", 0, _flat(out._data), _random.state(out._kern), kind,
                 a, b)
    return out


def rand(*size: Any, dtype: Any = None, device: str = "cpu",
         requires_grad: bool = False) -> Tensor:
    """Uniform draws in [0, 1) from numbagrad's generator (``torch.rand``;
    see the module's docstring)."""
    return _random_fill(_size(size, "rand"), UNIFORM, 0.0, 1.0, float_dtype(dtype, "rand"),
                        device, requires_grad)


def randn(*size: Any, dtype: Any = None, device: str = "cpu",
          requires_grad: bool = False) -> Tensor:
    """Standard normal draws from numbagrad's generator (``torch.randn``)."""
    return _random_fill(_size(size, "randn"), NORMAL, 0.0, 1.0,
                        float_dtype(dtype, "randn"), device, requires_grad)


def normal(mean: float, std: float, size: Any, *, dtype: Any = None, device: str = "cpu",
           requires_grad: bool = False) -> Tensor:
    """Normal draws of one ``mean`` and ``std`` (``torch.normal(mean, std,
    size)``, the form with Python numbers; std must be >= 0)."""
    m, s = real_number(mean, "normal", "mean"), real_number(std, "normal", "std")
    if not s >= 0:
        raise ValueError(f"normal: std must be >= 0, got {s}")
    return _random_fill(_size((size,), "normal"), NORMAL, m, s,
                        float_dtype(dtype, "normal"), device, requires_grad)


def rand_like(t: Any, *, dtype: Any = None, device: str | None = None,
              requires_grad: bool = False) -> Tensor:
    """``rand`` in ``t``'s shape, dtype and device."""
    shape, dt, dev = _like("rand_like", t, dtype, device, requires_grad)
    dt = float_dtype(dt, "rand_like")
    return _random_fill(shape, UNIFORM, 0.0, 1.0, dt, dev, requires_grad)


def randn_like(t: Any, *, dtype: Any = None, device: str | None = None,
               requires_grad: bool = False) -> Tensor:
    """``randn`` in ``t``'s shape, dtype and device."""
    shape, dt, dev = _like("randn_like", t, dtype, device, requires_grad)
    dt = float_dtype(dt, "randn_like")
    return _random_fill(shape, NORMAL, 0.0, 1.0, dt, dev, requires_grad)


def randint(low: int, high: int | None = None, size: Any = (), *, device: str = "cpu") -> Any:
    """Integers drawn uniformly from [low, high) (``randint(high, size)``
    counts from 0), as ``torch.randint``: an int64 index array, as
    ``argmax``'s (a NumPy array on "cpu", a device array on "cuda";
    ``ng.tensor`` makes it a tensor). Drawn from numbagrad's generator (``rand``'s stream,
    scaled and floored in float64: exact below 2**53)."""
    if high is None:
        low, high = 0, low
    try:
        lo, hi = operator.index(low), operator.index(high)
    except TypeError:
        raise TypeError(f"randint: low and high must be integers, got {low!r}, {high!r}") \
            from None
    if hi <= lo:
        raise ValueError(f"randint: high ({hi}) must be above low ({lo})")
    shape = _size((size,), "randint")
    kern = kernels.get(device)
    u = _random_fill(shape, UNIFORM, float(lo), float(hi), np.dtype(np.float64), device, False)
    values = np.floor(kernels.to_host(kern, u._data) if kern.name != "cpu" else u._data)
    out = np.minimum(values, hi - 1).astype(np.int64)     # (rounding never reaches hi)
    return out if kern.name == "cpu" else kernels.from_host(kern, out)


def multinomial(probs: Any, num_samples: int, replacement: bool = False) -> Any:
    """Class indices drawn from the rows of ``probs`` (weights >= 0, each row
    not all zero), as ``torch.multinomial``: an int64 index array of shape
    (..., num_samples), as ``argmax``'s. Without replacement it is the
    Gumbel top-k of log(probs) (no class twice); with replacement the
    inverse of each row's running sum at uniform draws. Both draw from
    numbagrad's generator; the numbers differ from PyTorch's streams."""
    from . import elementwise as ew, masks, reductions, shape, sorting, statistics
    x = operand(probs, "multinomial")
    if x.ndim not in (1, 2):
        raise ValueError(f"multinomial: probs must be 1-D or 2-D, got shape {x.shape}")
    k = _size((num_samples,), "multinomial")[0]
    classes = x.shape[-1]
    host = kernels.to_host(x._kern, x._data) if x.device != "cpu" else x._data
    if not (np.isfinite(host).all() and (host >= 0).all() and (host.sum(-1) > 0).all()):
        raise ValueError("multinomial: probs must be finite, >= 0 and not all 0 in a row")
    if not replacement:
        if k > classes or k > (host > 0).sum(-1).min():
            raise ValueError(f"multinomial: {k} samples without replacement from "
                             f"{classes} classes, {(host > 0).sum(-1).min()} of them non-zero "
                             f"in some row")
        u = rand_like(x)
        gumbel = ew.neg(ew.log(ew.neg(ew.log(ew.add(u, 1e-300)))))   # -log(-log u)
        return sorting.topk(ew.add(ew.log(x), gumbel), k, -1).indices
    cdf = statistics.cumsum(x, -1)
    total = reductions.sum(x, -1, True)
    u = ew.mul(rand(*(x.shape[:-1] + (k,)), dtype=x.dtype, device=x.device), total)
    below = masks.astype(masks.lt(shape.unsqueeze(cdf, -2), shape.unsqueeze(u, -1)),
                         np.float64)                # (..., k, C): cdf < u
    counts = reductions.sum(below, -1)
    found = kernels.to_host(x._kern, counts._data) if x.device != "cpu" else counts._data
    out = np.minimum(found, classes - 1).astype(np.int64)
    return out if x.device == "cpu" else kernels.from_host(x._kern, out)


def one_hot(indices: Any, num_classes: int = -1, *, dtype: Any = None,
            device: str = "cpu") -> Tensor:
    """``F.one_hot``: a (..., num_classes) tensor of 0 and 1 (a float tensor
    of ``dtype``, where PyTorch's is int64) from integer class indices (a
    NumPy integer array or an int64 tensor); ``num_classes=-1`` is max + 1."""
    host = np.asarray(indices)
    if host.dtype.kind not in "iu":
        raise TypeError(f"one_hot: indices must be integers, got dtype {host.dtype}")
    n = int(host.max()) + 1 if num_classes == -1 and host.size else operator.index(num_classes)
    if host.size and (host.min() < 0 or host.max() >= n):
        raise ValueError(f"one_hot: indices must lie in [0, {n}), got [{host.min()}, "
                         f"{host.max()}]")
    dt = float_dtype(dtype, "one_hot")
    if kernels._observer is not None:
        from .indexing import _note_unreplayable
        _note_unreplayable("one_hot builds its tensor from the indices on the host",
                           (host, indices, getattr(indices, "_data", None)))
    return _from_host(np.arange(max(n, 0)) == host[..., None], dt, device, False)


__all__ = ["zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like",
           "empty_like", "arange", "linspace", "eye", "rand", "randn", "normal", "rand_like",
           "randn_like", "randint", "multinomial", "one_hot"]
