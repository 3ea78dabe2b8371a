"""2-D pooling in PyTorch's NCHW layout (``max_pool2d``, ``avg_pool2d``,
``adaptive_avg_pool2d``), forward beside backward: one kernel each way (on
CUDA one launch for the forward and one for the input gradient).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import buffers, kernels
from ..tape import Node, _Backward
from ..tensor import Tensor
from ._common import contiguous, describe, ones, operand, result
from .conv import _as4d, _batched, _ints


def _window(x: Any, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: Any,
            op: str) -> tuple:
    """The checked operand and window: (x, batched?, (N, C, H, W), kernel,
    stride, padding, dilation, (OH, OW)), PyTorch's floor-mode output size."""
    x, is_batched = _batched(operand(x, op), 2, op)
    if ceil_mode:
        raise NotImplementedError(f"{op}: ceil_mode=True is not supported (only PyTorch's "
                                  "default floor mode)")
    kernel = _ints(kernel_size, 2, op, "kernel_size", 1)
    empty = stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0)
    stride = kernel if empty else _ints(stride, 2, op, "stride", 1)
    padding = _ints(padding, 2, op, "padding", 0)
    dilation = _ints(dilation, 2, op, "dilation", 1)
    if any(2 * p > k for p, k in zip(padding, kernel)):
        raise ValueError(f"{op}: padding {padding} must be at most half of kernel_size "
                         f"{kernel} (as PyTorch)")
    shape4 = ((1,) if not is_batched else ()) + tuple(x.shape)
    out_hw = tuple((n + 2 * p - d * (k - 1) - 1) // s + 1 for n, p, d, k, s in
                   zip(shape4[2:], padding, dilation, kernel, stride))
    if any(o < 1 for o in out_hw):
        raise ValueError(f"{op}: input {describe(x)} is too small for kernel_size {kernel}, "
                         f"padding {padding}, dilation {dilation}: the output would be "
                         f"{out_hw}")
    return x, is_batched, shape4, kernel, stride, padding, dilation, out_hw


# ------------------------------------------------------------ max_pool2d
def max_pool2d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,
               dilation: Any = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Tensor:
    """PyTorch's ``F.max_pool2d`` on (N, C, H, W) or unbatched (C, H, W): the
    max of each window, padding counting as -inf (it never wins); ``stride``
    defaults to ``kernel_size``. At ties the gradient goes to the first max
    in the window in row-major order, as PyTorch's CPU kernel (a nan is the
    max). ``ceil_mode`` and ``return_indices`` are not supported."""
    op = "max_pool2d"
    if return_indices:
        raise NotImplementedError(f"{op}: return_indices=True is not supported")
    x, is_batched, shape4, (kh, kw), (sh, sw), (ph, pw), (dh, dw), (oh, ow) = _window(
        x, kernel_size, stride, padding, dilation, ceil_mode, op)
    kern, dtype = x._kern, x._data.dtype
    out = buffers.take(kern, x.shape[:-2] + (oh, ow), dtype)
    idx = buffers.take(kern, shape4[:2] + (oh, ow), np.int64)
    out4 = _as4d(out, out.shape, is_batched, 2)
    kernels.call(kern, "max_pool2d", out.size, _as4d(contiguous(x), x.shape, is_batched, 2),
                 out4, idx, kh, kw, sh, sw, ph, pw, dh, dw)
    return result(out, kern, (x,), _max_pool2d_backward,
                  (idx, out.shape, is_batched, (kh, kw, sh, sw, ph, pw, dh, dw)))


def _max_pool2d_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    idx, out_shape, is_batched, window = node.saved
    kern = x._kern
    g = ones(kern, out_shape, x._data.dtype) if gout is None else gout
    dest, beta = ctx.dest(x)
    kernels.call(kern, "max_pool2d_backward", dest.size, _as4d(g, g.shape, is_batched, 2), idx,
                 _as4d(dest, x.shape, is_batched, 2), *window, beta)


# ------------------------------------------------------------ avg_pool2d
def avg_pool2d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,
               ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: Any = None) -> Tensor:
    """PyTorch's ``F.avg_pool2d`` on (N, C, H, W) or unbatched (C, H, W): the
    mean of each window; with ``count_include_pad`` (the default) the zero
    padding counts in the divisor. ``ceil_mode`` and ``divisor_override``
    are not supported."""
    op = "avg_pool2d"
    if divisor_override is not None:
        raise NotImplementedError(f"{op}: divisor_override is not supported")
    x, is_batched, shape4, (kh, kw), (sh, sw), (ph, pw), _, (oh, ow) = _window(
        x, kernel_size, stride, padding, 1, ceil_mode, op)
    include = bool(count_include_pad)
    kern, dtype = x._kern, x._data.dtype
    out = buffers.take(kern, x.shape[:-2] + (oh, ow), dtype)
    kernels.call(kern, "avg_pool2d", out.size, _as4d(contiguous(x), x.shape, is_batched, 2),
                 _as4d(out, out.shape, is_batched, 2), kh, kw, sh, sw, ph, pw, include)
    return result(out, kern, (x,), _avg_pool2d_backward,
                  (out.shape, is_batched, (kh, kw, sh, sw, ph, pw, include)))


def _avg_pool2d_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    out_shape, is_batched, window = node.saved
    kern = x._kern
    g = ones(kern, out_shape, x._data.dtype) if gout is None else gout
    dest, beta = ctx.dest(x)
    kernels.call(kern, "avg_pool2d_backward", dest.size, _as4d(g, g.shape, is_batched, 2),
                 _as4d(dest, x.shape, is_batched, 2), *window, beta)


# --------------------------------------------------- adaptive_avg_pool2d
def adaptive_avg_pool2d(x: Any, output_size: Any) -> Tensor:
    """PyTorch's ``F.adaptive_avg_pool2d`` on (N, C, H, W) or unbatched
    (C, H, W): output (OH, OW) (an int, or a pair whose None keeps that input
    size); window i spans rows floor(i*H/OH) to ceil((i+1)*H/OH)."""
    op = "adaptive_avg_pool2d"
    x, is_batched = _batched(operand(x, op), 2, op)
    items = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size,) * 2
    if len(items) != 2:
        raise TypeError(f"{op}: output_size must be an int or a pair, got {output_size!r}")
    size = tuple(x.shape[-2:])
    out_hw = _ints(tuple(n if v is None else v for v, n in zip(items, size)), 2, op,
                  "output_size", 1)
    if 0 in size:
        raise ValueError(f"{op}: input {describe(x)} has an empty spatial dim")
    kern, dtype = x._kern, x._data.dtype
    out = buffers.take(kern, x.shape[:-2] + out_hw, dtype)
    kernels.call(kern, "adaptive_avg_pool2d", out.size,
                 _as4d(contiguous(x), x.shape, is_batched, 2), _as4d(out, out.shape, is_batched, 2))
    return result(out, kern, (x,), _adaptive_backward, (out.shape, is_batched))


def _adaptive_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    out_shape, is_batched = node.saved
    kern = x._kern
    g = ones(kern, out_shape, x._data.dtype) if gout is None else gout
    dest, beta = ctx.dest(x)
    kernels.call(kern, "adaptive_avg_pool2d_backward", dest.size,
                 _as4d(g, g.shape, is_batched, 2), _as4d(dest, x.shape, is_batched, 2), beta)

