"""2-D pooling in PyTorch's NCHW layout (``max_pool2d``, ``avg_pool2d``,
``adaptive_avg_pool2d``) and ``max_unpool2d``, forward beside backward: one
kernel each way (on CUDA one launch for the forward and one for the input
gradient; two for max_unpool2d's forward).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import buffers, kernels
from ..kernels.cpu.indexing import first_out_of_range, index_error
from ..tape import Node, _Backward
from ..tensor import Tensor
from ._common import (ArgumentLengthError, contiguous, describe, index_data, ones, operand,
                      reshaped, result)
from .conv import _as4d, _batched, _ints
from .indexing import _indices


def _window(x: Any, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: Any,
            op: str) -> tuple:
    """The checked operand and window: (x, batched?, (N, C, H, W), kernel,
    stride, padding, dilation, (OH, OW)) (see ``_pool_geometry``)."""
    x, is_batched = _batched(operand(x, op), 2, op)
    shape4 = ((1,) if not is_batched else ()) + tuple(x.shape)
    return (x, is_batched, shape4) + _pool_geometry(shape4, kernel_size, stride, padding,
                                                    dilation, ceil_mode, op, describe(x))


def _pool_geometry(shape4: tuple, kernel_size: Any, stride: Any, padding: Any, dilation: Any,
                  ceil_mode: Any, op: str, what: str) -> tuple:
    """The checked window of a pool over (N, C, H, W) ``shape4`` (``what``
    names the input in errors): (kernel, stride, padding, dilation, (OH,
    OW)), PyTorch's output size: with ``ceil_mode`` the last window may run
    past the padded edge, but is dropped when it would start in the right
    padding."""
    kernel = _ints(kernel_size, 2, op, "kernel_size", 1)
    empty = stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0)
    stride = kernel if empty else _ints(stride, 2, op, "stride", 1)
    padding = _ints(padding, 2, op, "padding", 0)
    dilation = _ints(dilation, 2, op, "dilation", 1)
    if any(2 * p > k for p, k in zip(padding, kernel)):
        raise ValueError(f"{op}: padding {padding} must be at most half of kernel_size "
                         f"{kernel} (as PyTorch)")
    out_hw = tuple(_pooled(n, k, s, p, d, bool(ceil_mode)) for n, p, d, k, s in
                   zip(shape4[2:], padding, dilation, kernel, stride))
    if any(o < 1 for o in out_hw):
        raise ValueError(f"{op}: input {what} is too small for kernel_size {kernel}, "
                         f"padding {padding}, dilation {dilation}: the output would be "
                         f"{out_hw}")
    return kernel, stride, padding, dilation, out_hw


def _pooled(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's ``pooling_output_shape`` along one dim."""
    out = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


# ------------------------------------------------------------ max_pool2d
def max_pool2d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,
               dilation: Any = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Any:
    """PyTorch's ``F.max_pool2d`` on (N, C, H, W) or unbatched (C, H, W): the
    max of each window, padding counting as -inf (it never wins); ``stride``
    defaults to ``kernel_size``. At ties the gradient goes to the first max
    in the window in row-major order, as PyTorch's CPU kernel (a nan is the
    max). ``ceil_mode``: PyTorch's rounding up of the output size.
    ``return_indices``: (out, indices), the indices int64 positions
    h * W + w of each max in its input plane, as PyTorch's (a NumPy array on
    "cpu", a device array on "cuda", as ``argmax``'s), for ``max_unpool2d``."""
    return _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices,
                     "max_pool2d")


def _relu_max_pool2d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,
                     dilation: Any = 1, ceil_mode: bool = False) -> Tensor:
    """``max_pool2d(relu(x), ...)`` as one op (no public row: ``nn.Sequential``
    reaches it), one kernel each way and no
    relu output in memory: the window's max, or 0 where it is <= 0 (a nan
    stays nan). Its gradient is the chain's, PyTorch's exactly: relu passes
    none where its output is 0, so a window whose max is <= 0 passes none;
    else the window's first max (row-major) gets it, which is relu(x)'s
    first max too. ``nn.Sequential`` runs a ``ReLU`` directly followed by a
    ``MaxPool2d`` (without ``return_indices``) as this op (``nn/fusion.py``)."""
    return _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, False,
                     "relu_max_pool2d")


def _max_pool(x: Any, kernel_size: Any, stride: Any, padding: Any, dilation: Any,
              ceil_mode: Any, return_indices: bool, op: str) -> Any:
    """``op`` ("max_pool2d" or "relu_max_pool2d", the kernel's name too)."""
    x, is_batched, shape4, (kh, kw), (sh, sw), (ph, pw), (dh, dw), (oh, ow) = _window(
        x, kernel_size, stride, padding, dilation, ceil_mode, op)
    kern, dtype = x._kern, x._data.dtype
    out = buffers.take(kern, x.shape[:-2] + (oh, ow), dtype)
    idx = buffers.take(kern, shape4[:2] + (oh, ow), np.int64)   # (ng.compile: a temp)
    out4 = _as4d(out, out.shape, is_batched, 2)
    # (the elements the call touches: x read, out and idx written)
    kernels.call(kern, op, x.size + 2 * out.size, _as4d(contiguous(x), x.shape, is_batched, 2),
                 out4, idx, kh, kw, sh, sw, ph, pw, dh, dw)
    out = result(out, kern, (x,), _max_pool2d_backward,
                 (idx, out.shape, is_batched, (kh, kw, sh, sw, ph, pw, dh, dw)))
    if not return_indices:
        return out
    buffers.retire(kern, idx)   # it leaves numbagrad: never handed out again
    return out, reshaped(idx, out.shape)


def _max_pool2d_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    idx, out_shape, is_batched, window = node.saved
    kern = x._kern
    g = ones(kern, out_shape, x._data.dtype) if gout is None else gout
    dest, beta = ctx.dest(x)
    kernels.call(kern, "max_pool2d_backward", dest.size + 2 * g.size,
                 _as4d(g, g.shape, is_batched, 2), idx,
                 _as4d(dest, x.shape, is_batched, 2), *window, beta)


# ------------------------------------------------------------ avg_pool2d
def avg_pool2d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,
               ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: Any = None) -> Tensor:
    """PyTorch's ``F.avg_pool2d`` on (N, C, H, W) or unbatched (C, H, W): the
    mean of each window; with ``count_include_pad`` (the default) the zero
    padding counts in the divisor, but not a ``ceil_mode`` window's cells
    past the padded edge (PyTorch's rule); ``divisor_override`` (a positive
    int) divides every window's sum instead."""
    op = "avg_pool2d"
    divisor = 0
    if divisor_override is not None:
        divisor = _ints(divisor_override, 1, op, "divisor_override", 1)[0]
    x, is_batched, shape4, (kh, kw), (sh, sw), (ph, pw), _, (oh, ow) = _window(
        x, kernel_size, stride, padding, 1, ceil_mode, op)
    include = bool(count_include_pad)
    kern, dtype = x._kern, x._data.dtype
    out = buffers.take(kern, x.shape[:-2] + (oh, ow), dtype)
    kernels.call(kern, "avg_pool2d", out.size, _as4d(contiguous(x), x.shape, is_batched, 2),
                 _as4d(out, out.shape, is_batched, 2), kh, kw, sh, sw, ph, pw, include, divisor)
    return result(out, kern, (x,), _avg_pool2d_backward,
                  (out.shape, is_batched, (kh, kw, sh, sw, ph, pw, include, divisor)))


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


# ------------------------------------------------------------ max_unpool2d
def max_unpool2d(x: Any, indices: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,
                 output_size: Any = None) -> Tensor:
    """PyTorch's ``F.max_unpool2d``: the inverse of ``max_pool2d(...,
    return_indices=True)``: x (N, C, H, W) or (C, H, W) scattered to the
    positions ``indices`` (int64, x's shape, each in [0, OH * OW) of its
    plane) of a zero (N, C, OH, OW) output, OH = (H - 1) * stride - 2 *
    padding + kernel_size unless ``output_size`` ((OH, OW), or with the N
    and C dims) picks one within a stride of it. A repeated index keeps one
    value (the last on the CPU, as PyTorch's; max_pool2d's repeats are equal);
    the gradient of every input is its cell's. Host indices are checked
    first (not again by a compiled step's replay: there, as with a CUDA
    device array, an index out of range is skipped, never written)."""
    op = "max_unpool2d"
    indices = index_data(indices)
    x, is_batched = _batched(operand(x, op), 2, op)
    kernel = _ints(kernel_size, 2, op, "kernel_size", 1)
    empty = stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0)
    stride = kernel if empty else _ints(stride, 2, op, "stride", 1)
    padding = _ints(padding, 2, op, "padding", 0)
    default = tuple((n - 1) * s - 2 * p + k for n, s, p, k in
                    zip(x.shape[-2:], stride, padding, kernel))
    if output_size is None:
        out_hw = default
    else:
        items = tuple(output_size)
        if len(items) == 4:
            items = items[2:]
        if len(items) != 2:
            raise ArgumentLengthError(f"{op}: output_size must be (OH, OW) or (N, C, OH, OW), "
                                      f"got {output_size!r}")
        out_hw = _ints(items, 2, op, "output_size", 0)
        for o, d, s in zip(out_hw, default, stride):
            if not d - s < o < d + s:
                raise ValueError(f"{op}: output_size {out_hw} must lie between "
                                 f"{tuple(a - b for a, b in zip(default, stride))} and "
                                 f"{tuple(a + b for a, b in zip(default, stride))} "
                                 "(both excluded) for this input, kernel_size, stride and "
                                 "padding")
    if any(o < 1 for o in out_hw):
        raise ValueError(f"{op}: input {describe(x)} gives the empty output size {out_hw}")
    kern = x._kern
    shape = tuple(np.shape(indices)) if not (kern.name != "cpu" and kern.is_device_array(
        indices)) else tuple(indices.shape)
    if shape != tuple(x.shape):
        raise ValueError(f"{op}: indices of shape {shape} must have the input's shape "
                         f"{tuple(x.shape)}")
    plane = out_hw[0] * out_hw[1]
    if kern.name == "cpu" and isinstance(indices, np.ndarray) and indices.dtype == np.int64 \
            and indices.flags.c_contiguous:
        # max_pool2d's own indices, maybe made inside a compiled step: checked
        # here, not as host data that ng.compile would hold fixed
        bad = first_out_of_range(indices.reshape(-1), 0, plane)
        if bad >= 0:
            raise index_error(op, indices, bad, 0, plane, -1,
                              f" (the flat position h * W + w in a {out_hw} output plane)")
        index = indices
    else:
        index, _ = _indices(kern, indices, op, 0, plane, -1)
    shape4 = ((1,) if not is_batched else ()) + tuple(x.shape)
    planes, length = shape4[0] * shape4[1], shape4[2] * shape4[3]
    idx2 = reshaped(index, (planes, length))
    out = buffers.take(kern, x.shape[:-2] + out_hw, x._data.dtype)
    kernels.call(kern, "max_unpool2d", out.size, reshaped(contiguous(x), (planes, length)), idx2,
                 reshaped(out, (planes, plane)))
    return result(out, kern, (x,), _max_unpool2d_backward, (idx2, out.shape, plane))


def _max_unpool2d_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    idx2, out_shape, plane = node.saved
    kern = x._kern
    g = ones(kern, out_shape, x._data.dtype) if gout is None else gout
    dest, beta = ctx.dest(x)
    kernels.call(kern, "max_unpool2d_backward", dest.size,
                 reshaped(g, (idx2.shape[0], plane)), idx2,
                 reshaped(dest, tuple(idx2.shape)), beta)
