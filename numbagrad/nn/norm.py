"""Normalisation layers with PyTorch's names, parameters, buffers, state-dict
keys, shapes and default init (weight ones, bias zeros; running mean zeros,
running variance ones, num_batches_tracked 0 as int64). Their init draws
nothing, so ``rng=`` is accepted and ignored: code that builds every layer
with one ``rng=`` builds these too."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import kernels, ops
from ..ops._common import is_scalar
from ..ops.norm import _batch_norm
from ..tensor import Tensor, param
from .module import Module, _dtype


def _positive(name: str, what: str, n: Any) -> int:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{name}: {what} must be a positive integer, got {n!r}")
    return int(n)


def _eps(name: str, eps: Any) -> float:
    if not is_scalar(eps) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"{name}: eps must be a finite real number >= 0, got {eps!r}")
    return float(eps)


def _filled(value: float, shape: tuple, dtype: Any, device: str, is_param: bool) -> Tensor:
    """A param (or, else, a buffer tensor) of ``shape`` filled with ``value``."""
    array = np.full(shape, value, dtype=dtype)
    if is_param:
        return param(array, dtype=dtype, device=device)
    kern = kernels.get(device)
    return Tensor(kernels.from_host(kern, array), kern)


class LayerNorm(Module):
    """PyTorch's ``nn.LayerNorm``: ``ng.layer_norm`` over the trailing dims
    ``normalized_shape``, with ``weight`` (ones) and ``bias`` (zeros) of that
    shape when ``elementwise_affine`` (``bias=False``: no bias)."""

    def __init__(self, normalized_shape: Any, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, *, dtype: Any = None, device: str = "cpu",
                 rng: Any = None) -> None:
        items = normalized_shape if isinstance(normalized_shape, (tuple, list)) \
            else (normalized_shape,)
        shape = tuple(_positive("LayerNorm", "normalized_shape", n) for n in items)
        if not shape:
            raise ValueError("LayerNorm: normalized_shape must have at least 1 dim, got ()")
        super().__init__()
        dtype = _dtype(dtype)
        self.normalized_shape, self.eps = shape, _eps("LayerNorm", eps)
        self.elementwise_affine = bool(elementwise_affine)
        self.weight = _filled(1.0, shape, dtype, device, True) if elementwise_affine else None
        self.bias = (_filled(0.0, shape, dtype, device, True) if elementwise_affine and bias
                     else None)

    def forward(self, x: Any) -> Tensor:
        return ops.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def __repr__(self) -> str:
        return (f"LayerNorm({self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine})")


class GroupNorm(Module):
    """PyTorch's ``nn.GroupNorm``: ``ng.group_norm`` of (N, C, *) inputs with
    per-channel ``weight`` (ones) and ``bias`` (zeros) when ``affine``."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True, *, dtype: Any = None, device: str = "cpu",
                 rng: Any = None) -> None:
        groups = _positive("GroupNorm", "num_groups", num_groups)
        channels = _positive("GroupNorm", "num_channels", num_channels)
        if channels % groups:
            raise ValueError(f"GroupNorm: num_groups={groups} must divide num_channels="
                             f"{channels}")
        super().__init__()
        dtype = _dtype(dtype)
        self.num_groups, self.num_channels = groups, channels
        self.eps, self.affine = _eps("GroupNorm", eps), bool(affine)
        self.weight = _filled(1.0, (channels,), dtype, device, True) if affine else None
        self.bias = _filled(0.0, (channels,), dtype, device, True) if affine else None

    def forward(self, x: Any) -> Tensor:
        return ops.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def __repr__(self) -> str:
        return (f"GroupNorm({self.num_groups}, {self.num_channels}, eps={self.eps}, "
                f"affine={self.affine})")


class _BatchNorm(Module):
    """``ng.batch_norm`` with per-channel ``weight`` (ones) and ``bias`` (zeros)
    when ``affine`` and, when ``track_running_stats``, the buffers
    ``running_mean``, ``running_var`` and ``num_batches_tracked`` (int64).
    ``train()``: batch statistics, and the buffers are updated in place
    (also on every call of a compiled step); ``eval()``: the running ones.
    Without running statistics the batch's are used in both modes.

    With ``accumulate_steps=k`` the statistics are per micro-batch, as in
    PyTorch (pytorch#46516): k micro-batches are not one full batch. Use
    ``LayerNorm`` or ``GroupNorm`` where that exact equality matters.
    ``momentum=None`` (PyTorch's cumulative average) is not supported."""

    dims: tuple = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True, *,
                 dtype: Any = None, device: str = "cpu", rng: Any = None) -> None:
        name = type(self).__name__
        channels = _positive(name, "num_features", num_features)
        if momentum is None:
            raise NotImplementedError(f"{name}: momentum=None (a cumulative average) is not "
                                      "supported; pass a float in [0, 1]")
        if not is_scalar(momentum) or not 0.0 <= momentum <= 1.0:
            raise ValueError(f"{name}: momentum must be a real number in [0, 1], got "
                             f"{momentum!r}")
        super().__init__()
        dtype = _dtype(dtype)
        self.num_features, self.eps, self.momentum = channels, _eps(name, eps), float(momentum)
        self.affine, self.track_running_stats = bool(affine), bool(track_running_stats)
        self.weight = _filled(1.0, (channels,), dtype, device, True) if affine else None
        self.bias = _filled(0.0, (channels,), dtype, device, True) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", _filled(0.0, (channels,), dtype, device, False))
            self.register_buffer("running_var", _filled(1.0, (channels,), dtype, device, False))
            self.register_buffer("num_batches_tracked",
                                 _filled(0, (), np.int64, device, False))
        else:
            for name_ in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name_, None)

    def forward(self, x: Any) -> Tensor:
        ndim = len(getattr(x, "shape", np.shape(x)))
        if ndim not in self.dims:
            raise ValueError(f"{type(self).__name__}: expected a "
                             f"{' or '.join(f'{d}-D' for d in self.dims)} input, got shape "
                             f"{tuple(getattr(x, 'shape', np.shape(x)))}")
        batch_stats = self.training or not self.track_running_stats
        tracking = self.training and self.track_running_stats
        return _batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                           batch_stats, self.momentum, self.eps,
                           self.num_batches_tracked if tracking else None,
                           type(self).__name__)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.num_features}, eps={self.eps}, "
                f"momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats})")


class BatchNorm1d(_BatchNorm):
    """PyTorch's ``nn.BatchNorm1d``: (N, C) or (N, C, L) inputs."""
    dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """PyTorch's ``nn.BatchNorm2d``: (N, C, H, W) inputs."""
    dims = (4,)
