"""Gradient utilities in ``torch.nn.utils``' style (``clip_grad_norm_``, ``clip_grad_value_``)."""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

import numpy as np

from .. import kernels
from ..tensor import Tensor, tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def _with_grads(parameters: Any, what: str) -> list[Tensor]:
    """The params that hold a ``.grad`` (as torch: params whose grad is None are skipped)."""
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    if not isinstance(parameters, Iterable):
        raise TypeError(f"{what}: parameters must be a Tensor or an iterable of Tensors, "
                        f"got {type(parameters).__name__}")
    params = list(parameters)
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise TypeError(f"{what}: parameters[{i}] is {type(p).__name__}, not a Tensor")
    return [p for p in params if p.grad is not None]


def _number(what: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
        raise ValueError(f"{what}: {name} must be a real number, got {value!r}")
    return float(value)


def _tensor(value: float, dtype: Any = np.float32, device: str = "cpu") -> Tensor:
    return tensor(np.array(value, dtype), device=device)


def clip_grad_norm_(parameters: Any, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> Tensor:
    """Scale the grads in place so that their total norm is at most ``max_norm``.

    As ``torch.nn.utils.clip_grad_norm_``: the norm is over all grads as one
    vector (``norm_type`` p, ``inf`` for the largest magnitude, ``-inf``
    for the smallest), the
    factor ``max_norm / (total + 1e-6)`` is clamped to 1, and the total
    norm (before clipping) comes back as a 0-d tensor. A non-finite total
    raises a RuntimeError with ``error_if_nonfinite``, before any grad
    changes.
    """
    what = "clip_grad_norm_"
    max_norm = _number(what, "max_norm", max_norm)
    norm_type = _number(what, "norm_type", norm_type)
    if norm_type <= 0 and not math.isinf(norm_type):
        raise ValueError(f"{what}: norm_type must be > 0 or inf, got {norm_type!r}")
    params = _with_grads(parameters, what)
    if not params:
        return _tensor(0.0)
    hosts = [np.abs(kernels.to_host(p._kern, p.grad).astype(np.float64)).ravel()
             for p in params]
    if math.isinf(norm_type):    # -inf: the smallest magnitude of them all
        if norm_type > 0:
            total = float(max(h.max() if h.size else 0.0 for h in hosts))
        else:
            total = float(min(h.min() for h in hosts if h.size)) if any(h.size for h in hosts) \
                else math.inf
    else:
        total = float(sum((h ** norm_type).sum() for h in hosts) ** (1.0 / norm_type))
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"{what}: the total norm of order {norm_type} of the gradients "
                           f"of {len(params)} params is non-finite ({total}), so they cannot "
                           f"be clipped; set error_if_nonfinite=False to clip anyway")
    coef = max_norm / (total + 1e-6)
    if coef < 1.0 or math.isnan(coef):
        for p in params:
            g = p.grad
            kernels.call(p._kern, "axpby", 0, 0.0, g, coef, g)
    return _tensor(total, params[0].dtype, params[0].device)


def clip_grad_value_(parameters: Any, clip_value: float) -> None:
    """Clamp every grad in place to ``[-clip_value, clip_value]``, as torch's."""
    what = "clip_grad_value_"
    clip_value = _number(what, "clip_value", clip_value)
    if clip_value < 0:
        raise ValueError(f"{what}: clip_value must be >= 0, got {clip_value!r}")
    for p in _with_grads(parameters, what):
        g = p.grad
        host = np.clip(kernels.to_host(p._kern, g), -clip_value, clip_value)
        kernels.call(p._kern, "upload", 0, np.ascontiguousarray(host), g)
