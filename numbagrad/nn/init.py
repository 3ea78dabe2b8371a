"""``torch.nn.init``'s initialisers: each writes a tensor's data in place (on
its device) and returns the tensor.

Values are drawn on the host from ``generator`` (a NumPy Generator; a fresh
one when None, as ``Linear``'s ``rng``), then copied into the tensor, so a
param already adopted by an optimizer keeps its place in the optimizer's
flat buffer. The gains and fans are PyTorch's: ``calculate_gain``, and for
an N-d weight of shape (out, in, *kernel) fan_in = in * prod(kernel) and
fan_out = out * prod(kernel).
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from .. import kernels
from ..ops._common import is_scalar
from ..tensor import Tensor, _note_write

__all__ = ["calculate_gain", "uniform_", "normal_", "zeros_", "ones_", "constant_",
           "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_",
           "trunc_normal_"]

_LINEAR = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
           "conv_transpose3d", "sigmoid")


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """PyTorch's recommended gain for ``nonlinearity``: 1 for linear, the convs
    and sigmoid, 5/3 for tanh, sqrt(2) for relu, sqrt(2 / (1 + slope**2))
    for leaky_relu (slope ``param``, default 0.01), 3/4 for selu."""
    if nonlinearity in _LINEAR:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif is_scalar(param):
            slope = float(param)
        else:
            raise ValueError(f"calculate_gain: negative_slope {param!r} is not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r} (expected "
                     f"one of {', '.join(_LINEAR)}, tanh, relu, leaky_relu, selu)")


def _target(tensor: Any, fn: str) -> Tensor:
    if not isinstance(tensor, Tensor):
        raise TypeError(f"nn.init.{fn}: expected an ng Tensor (a param), got "
                        f"{type(tensor).__name__}")
    if tensor.dtype not in (np.float32, np.float64):
        raise TypeError(f"nn.init.{fn}: the tensor must be float32 or float64, got "
                        f"{tensor.dtype}")
    return tensor


def _rng(generator: Any, fn: str) -> np.random.Generator:
    if generator is None:
        return np.random.default_rng()
    if not isinstance(generator, np.random.Generator):
        raise TypeError(f"nn.init.{fn}: generator must be a NumPy Generator or None, got "
                        f"{type(generator).__name__}")
    return generator


def _number(value: Any, fn: str, what: str) -> float:
    if not is_scalar(value) or not math.isfinite(value):
        raise ValueError(f"nn.init.{fn}: {what} must be a finite number, got {value!r}")
    return float(value)


def _write(tensor: Tensor, values: Any) -> Tensor:
    """Copy host ``values`` into the tensor's data (rounded to its dtype)."""
    host = np.broadcast_to(np.asarray(values, tensor.dtype), tensor.shape)
    kernels.call(tensor._kern, "upload", 0, host, tensor._data)
    _note_write(tensor)   # (on the tensor it is a view of too)
    return tensor


def _empty(tensor: Tensor, fn: str) -> bool:
    if tensor.size == 0:
        warnings.warn(f"nn.init.{fn}: the tensor has no elements (shape {tensor.shape}); "
                      "nothing to initialise", UserWarning, stacklevel=3)
        return True
    return False


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, *,
             generator: np.random.Generator | None = None) -> Tensor:
    """Values drawn uniformly from [a, b)."""
    tensor = _target(tensor, "uniform_")
    lo, hi = _number(a, "uniform_", "a"), _number(b, "uniform_", "b")
    if lo > hi:
        raise ValueError(f"nn.init.uniform_: a ({lo}) must not exceed b ({hi})")
    rng = _rng(generator, "uniform_")
    return _write(tensor, rng.uniform(lo, hi, tensor.shape))


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, *,
            generator: np.random.Generator | None = None) -> Tensor:
    """Values drawn from N(mean, std**2)."""
    tensor = _target(tensor, "normal_")
    mean, std = _number(mean, "normal_", "mean"), _number(std, "normal_", "std")
    if std < 0:
        raise ValueError(f"nn.init.normal_: std must be >= 0, got {std}")
    rng = _rng(generator, "normal_")
    return _write(tensor, rng.normal(mean, std, tensor.shape))


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0,
                  b: float = 2.0, *, generator: np.random.Generator | None = None) -> Tensor:
    """Values from N(mean, std**2) truncated to [a, b] (absolute bounds, as
    PyTorch's): draws outside are redrawn; like PyTorch it warns when mean
    lies more than 2 std outside [a, b], where few draws land inside."""
    fn = "trunc_normal_"
    tensor = _target(tensor, fn)
    mean, std = _number(mean, fn, "mean"), _number(std, fn, "std")
    lo, hi = _number(a, fn, "a"), _number(b, fn, "b")
    if std <= 0 or lo >= hi:
        raise ValueError(f"nn.init.{fn}: needs std > 0 and a < b, got std={std}, a={lo}, "
                         f"b={hi}")
    if mean < lo - 2 * std or mean > hi + 2 * std:
        warnings.warn(f"nn.init.{fn}: mean {mean} is more than 2 std from [a, b]; the "
                      "distribution of values may be incorrect", UserWarning, stacklevel=2)
    rng = _rng(generator, fn)
    values = rng.normal(mean, std, tensor.shape)
    outside = (values < lo) | (values > hi)
    for _ in range(1000):
        n = int(outside.sum())
        if n == 0:
            break
        values[outside] = rng.normal(mean, std, n)
        outside = (values < lo) | (values > hi)
    return _write(tensor, np.clip(values, lo, hi))


def zeros_(tensor: Tensor) -> Tensor:
    """All zeros."""
    return _write(_target(tensor, "zeros_"), 0.0)


def ones_(tensor: Tensor) -> Tensor:
    """All ones."""
    return _write(_target(tensor, "ones_"), 1.0)


def constant_(tensor: Tensor, val: float) -> Tensor:
    """Every element ``val``."""
    tensor = _target(tensor, "constant_")
    if not is_scalar(val):
        raise TypeError(f"nn.init.constant_: val must be a number, got {val!r}")
    return _write(tensor, float(val))


def _fans(tensor: Tensor, fn: str) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight of shape (out, in, *receptive field)."""
    if tensor.ndim < 2:
        raise ValueError(f"nn.init.{fn}: fan in and fan out cannot be computed for a tensor "
                         f"of fewer than 2 dims (shape {tensor.shape})")
    receptive = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _fan(tensor: Tensor, mode: str, fn: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"nn.init.{fn}: mode {mode!r} is not supported (use 'fan_in' or "
                         "'fan_out')")
    fan_in, fan_out = _fans(tensor, fn)
    return fan_in if mode == "fan_in" else fan_out


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, *,
                    generator: np.random.Generator | None = None) -> Tensor:
    """U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)) (Glorot and Bengio)."""
    fn = "xavier_uniform_"
    tensor = _target(tensor, fn)
    fan_in, fan_out = _fans(tensor, fn)
    if _empty(tensor, fn):
        return tensor
    bound = math.sqrt(3.0) * _number(gain, fn, "gain") * math.sqrt(2.0 / (fan_in + fan_out))
    return _write(tensor, _rng(generator, fn).uniform(-bound, bound, tensor.shape))


def xavier_normal_(tensor: Tensor, gain: float = 1.0, *,
                   generator: np.random.Generator | None = None) -> Tensor:
    """N(0, std**2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fn = "xavier_normal_"
    tensor = _target(tensor, fn)
    fan_in, fan_out = _fans(tensor, fn)
    if _empty(tensor, fn):
        return tensor
    std = _number(gain, fn, "gain") * math.sqrt(2.0 / (fan_in + fan_out))
    return _write(tensor, _rng(generator, fn).normal(0.0, std, tensor.shape))


def kaiming_uniform_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu", *,
                     generator: np.random.Generator | None = None) -> Tensor:
    """U(-b, b) with b = gain * sqrt(3 / fan) (He et al.), gain =
    ``calculate_gain(nonlinearity, a)``, fan the ``mode``'s."""
    fn = "kaiming_uniform_"
    tensor = _target(tensor, fn)
    if _empty(tensor, fn):
        return tensor
    fan = _fan(tensor, mode, fn)
    bound = math.sqrt(3.0) * calculate_gain(nonlinearity, a) / math.sqrt(fan)
    return _write(tensor, _rng(generator, fn).uniform(-bound, bound, tensor.shape))


def kaiming_normal_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu", *,
                    generator: np.random.Generator | None = None) -> Tensor:
    """N(0, std**2) with std = gain / sqrt(fan) (He et al.)."""
    fn = "kaiming_normal_"
    tensor = _target(tensor, fn)
    if _empty(tensor, fn):
        return tensor
    std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode, fn))
    return _write(tensor, _rng(generator, fn).normal(0.0, std, tensor.shape))
