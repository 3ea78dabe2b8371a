"""Convolution and pooling layers with PyTorch's names, parameters, state-dict
keys, shapes and default init."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import ops
from ..ops.conv import _ints
from ..tensor import Tensor, param
from .module import Module, _allocating, _dtype


class _ConvNd(Module):
    """weight (out, in / groups, *kernel_size) (transposed: (in, out / groups,
    *kernel_size)) and bias (out,), drawn as PyTorch's ``reset_parameters``
    draws them: kaiming_uniform(a=sqrt(5)) for the weight, i.e. uniform in
    +-1/sqrt(fan_in) as the bias, fan_in = weight.shape[1] *
    prod(kernel_size); from ``rng`` (a fresh Generator when None)."""

    rank = 0
    transposed = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros", *, dtype: Any = None, device: str = "cpu",
                 rng: np.random.Generator | None = None) -> None:
        name = type(self).__name__
        for what, n in (("in_channels", in_channels), ("out_channels", out_channels),
                        ("groups", groups)):
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
                raise ValueError(f"{name}: {what} must be a positive integer, got {n!r}")
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"{name}: groups={groups} must divide in_channels={in_channels} "
                             f"and out_channels={out_channels}")
        if padding_mode != "zeros":
            raise NotImplementedError(f"{name}: padding_mode={padding_mode!r} is not "
                                      "supported (only 'zeros')")
        kernel = _ints(kernel_size, self.rank, name, "kernel_size", 1)
        if self.transposed and isinstance(padding, str):
            raise ValueError(f"{name}: padding must be an int or a tuple of {self.rank} ints, "
                             f"got {padding!r}")
        if not isinstance(padding, str):
            padding = _ints(padding, self.rank, name, "padding", 0)
        super().__init__()
        dtype = _dtype(dtype)
        rng = rng if rng is not None else np.random.default_rng()
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size, self.groups = kernel, int(groups)
        self.stride = _ints(stride, self.rank, name, "stride", 1)
        self.dilation = _ints(dilation, self.rank, name, "dilation", 1)
        self.padding = padding
        if self.transposed:
            shape = (self.in_channels, self.out_channels // self.groups) + tuple(kernel)
        else:
            shape = (self.out_channels, self.in_channels // self.groups) + tuple(kernel)
        bound = 1.0 / math.sqrt(shape[1] * math.prod(kernel))
        with _allocating(name, shape):
            self.weight = param(rng.uniform(-bound, bound, shape), dtype=dtype, device=device)
            self.bias = (param(rng.uniform(-bound, bound, out_channels), dtype=dtype,
                               device=device) if bias else None)

    def forward(self, x: Any) -> Tensor:
        fn = (ops.conv1d, ops.conv2d, ops.conv3d)[self.rank - 1]
        return fn(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                  self.groups)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding!r}, dilation={self.dilation}, groups={self.groups}, "
                f"bias={self.bias is not None}, dtype={self.weight.dtype}, "
                f"device='{self.weight.device}')")


class Conv1d(_ConvNd):
    """PyTorch's ``nn.Conv1d``: (N, C_in, L) or (C_in, L) -> (N, C_out, L_out)."""
    rank = 1


class Conv2d(_ConvNd):
    """PyTorch's ``nn.Conv2d``: (N, C_in, H, W) or (C_in, H, W) -> (N, C_out, H_out, W_out)."""
    rank = 2


class Conv3d(_ConvNd):
    """PyTorch's ``nn.Conv3d``: (N, C_in, D, H, W) or (C_in, D, H, W) -> (N, C_out,
    D_out, H_out, W_out)."""
    rank = 3


class _ConvTransposeNd(_ConvNd):
    """PyTorch's ``nn.ConvTranspose{1,2}d``: weight (in, out / groups,
    *kernel_size); ``forward(x, output_size=None)``: an ``output_size`` (the
    spatial sizes, or with the N and C dims) picks the output_padding that
    gives it, as PyTorch's."""

    transposed = True

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1,
                 padding: Any = 0, output_padding: Any = 0, groups: int = 1, bias: bool = True,
                 dilation: Any = 1, padding_mode: str = "zeros", *, dtype: Any = None,
                 device: str = "cpu", rng: np.random.Generator | None = None) -> None:
        name = type(self).__name__
        output_padding = _ints(output_padding, self.rank, name, "output_padding", 0)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, dtype=dtype, device=device, rng=rng)
        self.output_padding = output_padding

    def _output_padding(self, x: Any, output_size: Any) -> tuple:
        if output_size is None:
            return self.output_padding
        name = type(self).__name__
        size = tuple(output_size)
        if len(size) == self.rank + 2:
            size = size[2:]
        size = _ints(size, self.rank, name, "output_size", 1)
        smallest = tuple((n - 1) * s - 2 * p + d * (k - 1) + 1 for n, s, p, d, k in
                         zip(x.shape[-self.rank:], self.stride, self.padding, self.dilation,
                             self.kernel_size))
        if any(not m <= o < m + s for o, m, s in zip(size, smallest, self.stride)):
            raise ValueError(f"{name}: output_size {size} must lie between {smallest} and "
                             f"{tuple(m + s - 1 for m, s in zip(smallest, self.stride))} for "
                             f"input of shape {tuple(x.shape)}")
        return tuple(o - m for o, m in zip(size, smallest))

    def forward(self, x: Any, output_size: Any = None) -> Tensor:
        fn = ops.conv_transpose1d if self.rank == 1 else ops.conv_transpose2d
        return fn(x, self.weight, self.bias, self.stride, self.padding,
                  self._output_padding(x, output_size), self.groups, self.dilation)

    def __repr__(self) -> str:
        return super().__repr__().replace(", dilation=",
                                          f", output_padding={self.output_padding}, dilation=")


class ConvTranspose1d(_ConvTransposeNd):
    """PyTorch's ``nn.ConvTranspose1d``: (N, C_in, L) or (C_in, L) -> (N, C_out, L_out)."""
    rank = 1


class ConvTranspose2d(_ConvTransposeNd):
    """PyTorch's ``nn.ConvTranspose2d``: (N, C_in, H, W) or (C_in, H, W) -> (N, C_out,
    H_out, W_out)."""
    rank = 2


class MaxPool2d(Module):
    """PyTorch's ``nn.MaxPool2d`` (see ``ng.max_pool2d``)."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                 return_indices: bool = False, ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.return_indices = dilation, bool(return_indices)
        self.ceil_mode = bool(ceil_mode)

    def forward(self, x: Any) -> Any:
        return ops.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                              self.ceil_mode, self.return_indices)

    def __repr__(self) -> str:
        return (f"MaxPool2d(kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, "
                f"ceil_mode={self.ceil_mode})")


class MaxUnpool2d(Module):
    """PyTorch's ``nn.MaxUnpool2d`` (see ``ng.max_unpool2d``):
    ``forward(x, indices, output_size=None)``."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0) -> None:
        super().__init__()
        self.kernel_size = _ints(kernel_size, 2, "MaxUnpool2d", "kernel_size", 1)
        self.stride = self.kernel_size if stride is None else \
            _ints(stride, 2, "MaxUnpool2d", "stride", 1)
        self.padding = _ints(padding, 2, "MaxUnpool2d", "padding", 0)

    def forward(self, x: Any, indices: Any, output_size: Any = None) -> Tensor:
        return ops.max_unpool2d(x, indices, self.kernel_size, self.stride, self.padding,
                                output_size)

    def __repr__(self) -> str:
        return (f"MaxUnpool2d(kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding})")


class AvgPool2d(Module):
    """PyTorch's ``nn.AvgPool2d`` (see ``ng.avg_pool2d``)."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: Any = None) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = bool(ceil_mode), bool(count_include_pad)
        self.divisor_override = divisor_override

    def forward(self, x: Any) -> Tensor:
        return ops.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                              self.count_include_pad, self.divisor_override)

    def __repr__(self) -> str:
        return (f"AvgPool2d(kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, ceil_mode={self.ceil_mode}, "
                f"count_include_pad={self.count_include_pad})")


class AdaptiveAvgPool2d(Module):
    """PyTorch's ``nn.AdaptiveAvgPool2d`` (see ``ng.adaptive_avg_pool2d``)."""

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Any) -> Tensor:
        return ops.adaptive_avg_pool2d(x, self.output_size)

    def __repr__(self) -> str:
        return f"AdaptiveAvgPool2d(output_size={self.output_size})"


class Upsample(Module):
    """PyTorch's ``nn.Upsample`` (see ``ng.interpolate``)."""

    def __init__(self, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                 align_corners: bool | None = None,
                 recompute_scale_factor: bool | None = None) -> None:
        super().__init__()
        self.size, self.scale_factor, self.mode = size, scale_factor, mode
        self.align_corners, self.recompute_scale_factor = align_corners, recompute_scale_factor

    def forward(self, x: Any) -> Tensor:
        return ops.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners,
                               self.recompute_scale_factor)

    def __repr__(self) -> str:
        what = f"size={self.size}" if self.size is not None else \
            f"scale_factor={self.scale_factor}"
        return f"Upsample({what}, mode={self.mode!r})"
