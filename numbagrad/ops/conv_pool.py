"""``max_pool2d(relu(conv2d(x)))`` as one op, forward beside backward (no
public row: ``nn.Sequential`` reaches it for a ``Conv2d``, ``ReLU``,
``MaxPool2d`` run, ``nn/fusion.py``).

A convolution on the columns path computes its output as the GEMM's
(N*OH*OW, C_out) rows, an NHWC image, and reorders it into NCHW; its
backward reorders the output's gradient back. Here the pool reads the
GEMM's rows as they are (writing NCHW) and its gradient goes straight into
the GEMM's layout (``max_pool2d_backward_nhwc``): both reorderings and the
convolution's NCHW output are gone. The forward is one kernel call,
``conv_relu_max_pool2d_nhwc``: im2col, the GEMM and the pool, whose threaded
twin runs all three on each thread's block of images (one parallel region,
each block in its core's cache: a digits CNN's first layer 68 -> 37 us, its
second 93 -> 88 us on 2 cores). The values and gradients are the three ops'
bit for bit (the pool adds the bias to the rows as the reorder does,
fl(product + bias); the reorderings are exact copies; the picks and sums
are the NCHW kernels'), except that above the threaded size the GEMM's
blocks are the images' rather than ``bgemm_mt``'s: its last bits follow the
thread count, as any split GEMM's do. A convolution of several groups or on
the direct path (which writes NCHW itself) runs as the two ops ``conv2d``
and ``_relu_max_pool2d``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import buffers, kernels
from ..tape import Node, _Backward
from ..tensor import Tensor
from ._common import contiguous, ones, reshaped, result
from .conv import (GATHER_COST, _columns_backward, _columns_operands, _conv_forward,
                   _conv_setup, _is_direct)
from .pool import _pool_geometry, _relu_max_pool2d


def _conv2d_relu_max_pool2d(x: Any, weight: Any, bias: Any = None, stride: Any = 1,
                            padding: Any = 0, dilation: Any = 1, groups: Any = 1, *,
                            kernel_size: Any, pool_stride: Any = None, pool_padding: Any = 0,
                            pool_dilation: Any = 1, ceil_mode: bool = False) -> Tensor:
    """``max_pool2d(relu(conv2d(x, weight, bias, stride, padding, dilation,
    groups)), kernel_size, pool_stride, pool_padding, pool_dilation,
    ceil_mode)``: both ops' arguments are checked before anything runs."""
    x, weight, bias, geometry, conv_shape = _conv_setup(x, weight, bias, stride, padding,
                                                        dilation, groups, 2, "conv2d")
    n, _, groups, _, stride2, padding2, dilation2, (oh, ow), is_batched, _ = geometry
    cout = weight.shape[0]
    window4 = _pool_geometry((n, cout, oh, ow), kernel_size, pool_stride, pool_padding,
                            pool_dilation, ceil_mode, "max_pool2d",
                            f"(the convolution's output, of shape {conv_shape})")
    if groups != 1 or n == 0 or _is_direct(geometry):
        return _relu_max_pool2d(_conv_forward(x, weight, bias, geometry, conv_shape),
                                kernel_size, pool_stride, pool_padding, pool_dilation, ceil_mode)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (qh, qw) = window4
    kern, dtype = x._kern, x._data.dtype
    x4, cols, w3, prod = _columns_operands(x, weight, geometry)
    out = buffers.take(kern, ((n,) if is_batched else ()) + (cout, qh, qw), dtype)
    idx = buffers.take(kern, (n, cout, qh, qw), np.int64)   # (ng.compile: a temp)
    window = (kh, kw, sh, sw, ph, pw, dh, dw)
    # im2col, the GEMM and the pool in one call, threaded from the GEMM's or
    # the gathers' size; the pool adds the bias as the unfused conv2d's reorder
    # does (the product's first row stands in for an absent one)
    size = max(prod.shape[1] * w3.shape[2] * cout,
               GATHER_COST * (x4.size + cols.size + prod.size + 2 * out.size))
    kernels.call(kern, "conv_relu_max_pool2d_nhwc", size, x4, cols, w3, prod,
                 prod[0, 0] if bias is None else contiguous(bias),
                 int(bias is not None), reshaped(out, idx.shape), idx, *stride2, *padding2,
                 *dilation2, *window)
    inputs = (x, weight) if bias is None else (x, weight, bias)
    return result(out, kern, inputs, _conv2d_relu_max_pool2d_backward,
                  (cols, w3, geometry, idx, window))


def _conv2d_relu_max_pool2d_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    x = node.inputs[0]
    cols, w3, geometry, idx, window = node.saved
    n, _, _, _, _, _, _, (oh, ow), _, _ = geometry
    kern, dtype = x._kern, w3.dtype
    cout = w3.shape[1]
    g = ones(kern, idx.shape, dtype) if gout is None else gout
    gt = buffers.take(kern, (1, n * oh * ow, cout), dtype)   # the GEMM's layout
    kernels.call(kern, "max_pool2d_backward_nhwc", GATHER_COST * (gt.size + 2 * idx.size),
                 reshaped(g, idx.shape), idx, reshaped(gt, (n, oh, ow, cout)), *window, 0.0)
    _columns_backward(ctx, node, gt)
