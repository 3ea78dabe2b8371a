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
    """weight (out, in / groups, *kernel_size) and bias (out,), drawn as
    PyTorch's ``reset_parameters`` draws them: kaiming_uniform(a=sqrt(5)) for
    the weight, i.e. uniform in +-1/sqrt(fan_in) as the bias, fan_in =
    in / groups * prod(kernel_size); from ``rng`` (a fresh Generator when None)."""

    rank = 0

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
        fan_in = in_channels // groups * math.prod(kernel)
        bound = 1.0 / math.sqrt(fan_in)
        shape = (self.out_channels, self.in_channels // self.groups) + tuple(kernel)
        with _allocating(name, shape):
            self.weight = param(rng.uniform(-bound, bound, shape), dtype=dtype, device=device)
            self.bias = (param(rng.uniform(-bound, bound, out_channels), dtype=dtype,
                               device=device) if bias else None)

    def forward(self, x: Any) -> Tensor:
        fn = ops.conv1d if self.rank == 1 else ops.conv2d
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


class MaxPool2d(Module):
    """PyTorch's ``nn.MaxPool2d`` (see ``ng.max_pool2d``)."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                 return_indices: bool = False, ceil_mode: bool = False) -> None:
        super().__init__()
        if return_indices or ceil_mode:
            raise NotImplementedError("MaxPool2d: return_indices and ceil_mode are not "
                                      "supported")
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation = dilation

    def forward(self, x: Any) -> Tensor:
        return ops.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation)

    def __repr__(self) -> str:
        return (f"MaxPool2d(kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation})")


class AvgPool2d(Module):
    """PyTorch's ``nn.AvgPool2d`` (see ``ng.avg_pool2d``)."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: Any = None) -> None:
        super().__init__()
        if ceil_mode or divisor_override is not None:
            raise NotImplementedError("AvgPool2d: ceil_mode and divisor_override are not "
                                      "supported")
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.count_include_pad = count_include_pad

    def forward(self, x: Any) -> Tensor:
        return ops.avg_pool2d(x, self.kernel_size, self.stride, self.padding,
                              count_include_pad=self.count_include_pad)

    def __repr__(self) -> str:
        return (f"AvgPool2d(kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding})")


class AdaptiveAvgPool2d(Module):
    """PyTorch's ``nn.AdaptiveAvgPool2d`` (see ``ng.adaptive_avg_pool2d``)."""

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Any) -> Tensor:
        return ops.adaptive_avg_pool2d(x, self.output_size)

    def __repr__(self) -> str:
        return f"AdaptiveAvgPool2d(output_size={self.output_size})"
