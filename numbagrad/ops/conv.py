"""Convolutions (``conv1d``, ``conv2d``, ``conv3d``, ``conv_transpose1d``,
``conv_transpose2d``) in PyTorch's NCHW layout, forward beside backward.

The forward copies every input patch into a row of a pooled columns buffer
(``im2col``, laid out (G, N, OH, OW, C/G, KH, KW): one row per output
position and group), and one batched GEMM per call multiplies those rows
with each group's transposed weight, into (G, N*OH*OW, C_out/G), which one
strided copy reorders into NCHW, adding the bias (``nn.Sequential`` runs a
``Conv2d``, ``ReLU``, ``MaxPool2d`` run as one op whose pool reads those
rows as they are and adds the bias, ``ops/conv_pool.py``). The backward
reorders the output gradient into that layout once, writes the weight
gradient with one GEMM per group over the whole batch, straight into its
destination (beta=1 adds into a param's accumulator), the bias gradient as
column sums (on the CPU a GEMM with a row of ones), and the input gradient
as a GEMM into columns that ``col2im`` adds back into the image (from
``CL_MIN_CHANNELS`` channels a group, columns laid out channels last, (G,
N, OH, OW, KH, KW, C/G), from a reordered copy of the weight, which
``col2im_cl`` adds with contiguous runs: the same bits, faster). With the
patches as rows the GEMMs are (N*OH*OW x K) by (K x C_out) and the like,
which OpenBLAS runs faster than their transposes on small channel counts
(measured 1.3-1.5x on a digits CNN's second convolution).
``conv1d`` is ``conv2d`` of height 1.

A convolution of one group at stride 1 whose outputs sum at most
``DIRECT_MAX_TAPS`` taps (C_in * KH * KW: a CNN's first layers) over
planes of at least ``DIRECT_MIN_OUTPUTS`` outputs runs without columns
instead (``kernels/cpu/conv.py``'s ``conv2d_direct``):
NCHW in and out as they are, no reorderings; its weight and bias gradients
are one kernel, its input gradient another.

A transposed convolution is the input gradient of a convolution, and is
computed as that one is: a GEMM into columns that ``col2im`` adds up into
the output (onto the bias); its gradient is that convolution's forward
(``im2col`` of the output gradient, then a GEMM each for dx and dW). With
one group the GEMMs read x and write dx per image in NCHW as they are.
``conv3d`` is made of ``conv2d`` (see its docstring).

CUDA launches: at most 4 per forward (im2col, the bias, the GEMM and the
reordering into NCHW) and, in the backward, 1 for the reordering of the
output gradient plus 1 for the bias, 1 for the weight and 2 for the input
gradient (3 from ``CL_MIN_CHANNELS`` channels a group: the weight's
reordering); on the direct path 1 forward and at most 3 backward (dW, db,
dx).
"""
from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .. import buffers, kernels
from ..tape import Node, _Backward
from ..tensor import Tensor
from ._common import (ArgumentLengthError, broadcast_into, contiguous, copy_strided, describe,
                      ones, pair, permuted, reduce_into, reshaped, result)
from .join import pad
from .shape import permute, reshape

_HOST = buffers.HOST


# The size that picks a threaded twin (``kernels.call``) for the columns and
# pool kernels: the elements a call touches, times this. Each element costs
# an index load and a scattered access, about four plain copies: their twins
# overtake the serial kernels from ~2**14 elements touched here (2 cores;
# im2col and col2im of 3x3 columns, the NHWC max pool and its gradient),
# where ``MT_MIN`` (2**16) is set for plain elementwise work.
GATHER_COST = 4


def _ints(value: Any, n: int, op: str, what: str, minimum: int) -> tuple[int, ...]:
    """``value`` (an int, or a tuple or list of ``n`` ints) as ``n`` ints of at
    least ``minimum``, or a clear error naming the op and the argument."""
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,) * n
    message = f"{op}: {what} must be an int or a tuple of {n} ints, got {value!r}"
    if len(items) != n:
        raise ArgumentLengthError(message)
    try:
        if any(isinstance(v, bool) for v in items):
            raise TypeError
        out = tuple(operator.index(v) for v in items)
    except TypeError:
        raise TypeError(message) from None
    if any(v < minimum for v in out):
        raise ValueError(f"{op}: {what} must be >= {minimum}, got {value!r}")
    return out


def _batched(x: Tensor, rank: int, op: str, what: str = "input") -> tuple[Tensor, bool]:
    """(x, whether it has a batch dim): PyTorch's unbatched (C, *spatial) input
    is accepted beside the batched (N, C, *spatial)."""
    if x.ndim not in (rank + 1, rank + 2):
        raise ValueError(f"{op}: {what} must be {rank + 1}-D (unbatched) or {rank + 2}-D "
                         f"(batched), got {describe(x)}")
    return x, x.ndim == rank + 2


def _as4d(data: Any, shape: tuple, is_batched: bool, rank: int) -> Any:
    """C-contiguous ``data`` of ``shape`` as (N, C, H, W): a missing batch dim
    is 1, and a 1-D convolution's length is the width of a height-1 image."""
    if not is_batched:
        shape = (1,) + tuple(shape)
    if rank == 1:
        shape = shape[:2] + (1,) + shape[2:]
    return reshaped(data, tuple(shape))


def _operands(x: Any, weight: Any, bias: Any, groups: Any, rank: int, op: str,
              transposed: bool = False) -> tuple:
    """The checked (x, weight, bias, is_batched, groups, out_channels): the
    weight is (C_out, C_in / groups, *kernel), or (C_in, C_out / groups,
    *kernel) for a transposed convolution, as PyTorch's."""
    x, weight = pair(x, weight, op, ("input", "weight"), promote=False)
    x, is_batched = _batched(x, rank, op)
    layout = ("in_channels, out_channels / groups" if transposed else
              "out_channels, in_channels / groups")
    if weight.ndim != rank + 2:
        raise ValueError(f"{op}: weight must be {rank + 2}-D ({layout}, *kernel_size), got "
                         f"{describe(weight)}")
    if bias is not None:
        _, bias = pair(x, bias, op, ("input", "bias"), promote=False)
    if isinstance(groups, bool) or not hasattr(groups, "__index__") or groups < 1:
        raise ValueError(f"{op}: groups must be a positive int, got {groups!r}")
    groups = operator.index(groups)
    channels = x.shape[-rank - 1]
    if transposed:
        if weight.shape[0] != channels:
            raise ValueError(f"{op}: input {describe(x)} has {channels} channels but weight "
                             f"{describe(weight)} expects {weight.shape[0]}")
        if channels % groups:
            raise ValueError(f"{op}: groups={groups} must divide the input's {channels} "
                             f"channels (input {describe(x)}, weight {describe(weight)})")
        cout = weight.shape[1] * groups
    else:
        cout, cg = weight.shape[:2]
        if channels % groups or cout % groups:
            raise ValueError(f"{op}: groups={groups} must divide both the input's {channels} "
                             f"channels and the weight's {cout} output channels (input "
                             f"{describe(x)}, weight {describe(weight)})")
        if cg * groups != channels:
            raise ValueError(f"{op}: input {describe(x)} has {channels} channels but weight "
                             f"{describe(weight)} with groups={groups} expects {cg * groups}")
    if bias is not None and bias.shape != (cout,):
        raise ValueError(f"{op}: bias {describe(bias)} must have shape ({cout},) for weight "
                         f"{describe(weight)}")
    if 0 in weight.shape[2:]:
        raise ValueError(f"{op}: weight {describe(weight)} has an empty kernel")
    if 0 in x.shape[-rank:]:
        raise ValueError(f"{op}: input {describe(x)} has an empty spatial dim (only the batch "
                         "dim may be 0)")
    return x, weight, bias, is_batched, groups, cout


def _padding(padding: Any, stride: tuple, span: tuple, rank: int, op: str) -> tuple:
    """(before, after): the zero padding of each spatial dim, from an int, a
    tuple, "valid" or "same" (stride 1; an odd total puts the extra one after,
    as PyTorch)."""
    if not isinstance(padding, str):
        before = _ints(padding, rank, op, "padding", 0)
        return before, before
    if padding == "valid":
        return (0,) * rank, (0,) * rank
    if padding == "same":
        if any(s != 1 for s in stride):
            raise ValueError(f"{op}: padding='same' needs stride 1 (as PyTorch), got "
                             f"stride={stride}")
        before = tuple((s - 1) // 2 for s in span)
        return before, tuple(s - 1 - b for s, b in zip(span, before))
    raise ValueError(f"{op}: padding must be 'same', 'valid', an int or a tuple of "
                     f"{rank} ints, got {padding!r}")


def _output_size(x: Tensor, before: tuple, after: tuple, span: tuple, stride: tuple,
                 rank: int, op: str) -> tuple:
    """The output's spatial size, or a clear error when the padded input is
    smaller than the dilated kernel."""
    padded = tuple(n + b + a for n, b, a in zip(x.shape[-rank:], before, after))
    if any(p < s for p, s in zip(padded, span)):
        raise ValueError(f"{op}: input {describe(x)} is too small: its padded size {padded} "
                         f"is smaller than the (dilated) kernel size {span}")
    return tuple((p - s) // st + 1 for p, s, st in zip(padded, span, stride))


def _conv(x: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
          groups: Any, rank: int, op: str) -> Tensor:
    return _conv_forward(*_conv_setup(x, weight, bias, stride, padding, dilation, groups, rank,
                                      op))


def _conv_setup(x: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
                groups: Any, rank: int, op: str) -> tuple:
    """The checked (x, weight, bias, geometry, out_shape) of a convolution."""
    x, weight, bias, is_batched, groups, cout = _operands(x, weight, bias, groups, rank, op)
    channels = x.shape[-rank - 1]
    kernel = tuple(weight.shape[2:])
    stride = _ints(stride, rank, op, "stride", 1)
    dilation = _ints(dilation, rank, op, "dilation", 1)
    span = tuple(d * (k - 1) + 1 for d, k in zip(dilation, kernel))
    before, after = _padding(padding, stride, span, rank, op)
    out_size = _output_size(x, before, after, span, stride, rank, op)
    if rank == 1:   # a 1-D convolution is a 2-D one of height 1
        kernel, stride, dilation, before = ((1,) + kernel, (1,) + stride, (1,) + dilation,
                                            (0,) + before)
        out_hw = (1,) + out_size
    else:
        out_hw = out_size
    n = x.shape[0] if is_batched else 1
    out_shape = ((n,) if is_batched else ()) + (cout,) + out_size
    geometry = (n, channels, groups, kernel, stride, before, dilation, out_hw, is_batched, rank)
    return x, weight, bias, geometry, out_shape


def _is_direct(geometry: tuple) -> bool:
    """Whether a convolution runs on the direct path (see ``DIRECT_MAX_TAPS``)."""
    _, channels, groups, (kh, kw), (sh, sw), _, _, (oh, ow), _, _ = geometry
    return groups == 1 and sh == sw == 1 and channels * kh * kw <= DIRECT_MAX_TAPS \
        and oh * ow >= DIRECT_MIN_OUTPUTS


def _conv_forward(x: Tensor, weight: Tensor, bias: Tensor | None, geometry: tuple,
                  out_shape: tuple) -> Tensor:
    if _is_direct(geometry):
        return _direct_forward(x, weight, bias, geometry, out_shape)
    n, _, groups, _, _, _, _, (oh, ow), _, _ = geometry
    kern, dtype = x._kern, x._data.dtype
    cout = weight.shape[0]
    cols, w3, prod = _columns_product(x, weight, geometry)
    out = buffers.take(kern, out_shape, dtype)
    beta = 0.0
    if bias is not None:   # out = the product reordered + the bias, rounded once
        broadcast_into(kern, reshaped(contiguous(bias), (1, cout, 1)), (n, cout, oh * ow),
                       reshaped(out, (n, cout, oh * ow)))
        beta = 1.0
    kernels.call(kern, "expand_nd", out.size,
                 permuted(reshaped(prod, (groups, n, oh * ow, cout // groups)), (1, 0, 3, 2)),
                 reshaped(out, (n, groups, cout // groups, oh * ow)), 1.0, beta)
    inputs = (x, weight) if bias is None else (x, weight, bias)
    return result(out, kern, inputs, _conv_backward, (cols, w3, geometry))


def _columns_product(x: Tensor, weight: Tensor, geometry: tuple) -> tuple:
    """(cols, w3, prod): ``im2col`` of x, the weight as (G, C_out/G, K), and
    their product, (G, N*OH*OW, C_out/G): every output position's channels
    in a row (NHWC for one group). The bias is added by the pass that reads
    the product (the reorder into NCHW, or the fused pool): the same
    rounding, fl(product + bias), and no pass of its own."""
    _, _, groups, _, (sh, sw), (ph, pw), (dh, dw), _, _, _ = geometry
    kern = x._kern
    x4, cols, w3, prod = _columns_operands(x, weight, geometry)
    kernels.call(kern, "im2col", GATHER_COST * (x4.size + cols.size), x4, cols, sh, sw, ph, pw,
                 dh, dw)
    work = groups * prod.shape[1] * w3.shape[2] * w3.shape[1]   # picks bgemm's threaded twin
    kernels.call(kern, "bgemm", work, reshaped(cols, (groups, prod.shape[1], w3.shape[2])), w3,
                 prod, 0, 1, 1.0, 0.0, 1, 1, 1, groups)
    return cols, w3, prod


def _columns_operands(x: Tensor, weight: Tensor, geometry: tuple) -> tuple:
    """(x4, cols, w3, prod) of ``_columns_product``: x as (N, C, H, W), the
    pooled columns (G, N, OH, OW, C/G, KH, KW) and product (G, N*OH*OW,
    C_out/G), and the weight as (G, C_out/G, K); nothing computed yet."""
    n, channels, groups, (kh, kw), _, _, _, (oh, ow), is_batched, rank = geometry
    kern, dtype = x._kern, x._data.dtype
    cout = weight.shape[0]
    x4 = _as4d(contiguous(x), x.shape, is_batched, rank)
    cols = buffers.take(kern, (groups, n, oh, ow, channels // groups, kh, kw), dtype)
    w3 = reshaped(contiguous(weight), (groups, cout // groups, channels // groups * kh * kw))
    # the GEMM writes (G, N*OH*OW, C_out/G), every patch's outputs in a row
    prod = buffers.take(kern, (groups, n * oh * ow, cout // groups), dtype)
    return x4, cols, w3, prod


def _conv_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    x, weight = node.inputs[:2]
    cols, w3, geometry = node.saved
    n, _, groups, _, _, _, _, (oh, ow), _, _ = geometry
    kern, dtype = x._kern, w3.dtype
    cout, length = weight.shape[0], n * oh * ow
    cout_g = cout // groups
    g = ones(kern, (n, cout, oh * ow), dtype) if gout is None else gout
    # (N, C_out, OH*OW) -> (G, N*OH*OW, C_out/G), the GEMMs' layout
    gt = buffers.take(kern, (groups, length, cout_g), dtype)
    kernels.call(kern, "expand_nd", gt.size,
                 permuted(reshaped(g, (n, groups, cout_g, oh * ow)), (1, 0, 3, 2)),
                 reshaped(gt, (groups, n, oh * ow, cout_g)), 1.0, 0.0)
    _columns_backward(ctx, node, gt)


def _columns_backward(ctx: _Backward, node: Node, gt: Any) -> None:
    """The gradients of ``_columns_product`` from its output's gradient ``gt``
    (G, N*OH*OW, C_out/G), into node.inputs (x, weight[, bias]); node.saved
    starts with (cols, w3, geometry)."""
    x, weight = node.inputs[:2]
    cols, w3, geometry = node.saved[:3]
    n, _, groups, _, (sh, sw), (ph, pw), (dh, dw), (oh, ow), is_batched, rank = geometry
    kern, dtype = x._kern, w3.dtype
    length = n * oh * ow
    cout_g, k_g = weight.shape[0] // groups, w3.shape[2]
    cols3 = reshaped(cols, (groups, length, k_g))
    work = groups * length * k_g * cout_g   # each GEMM's multiply-adds
    if len(node.inputs) == 3 and node.inputs[2].requires_grad:   # db = column sums
        dest, beta = ctx.dest(node.inputs[2])
        if kern is _HOST:
            # on the CPU a GEMM with a row of ones, db[g] = 1^T @ G[g], in the
            # BLAS's order as dW is: OpenBLAS adds row after row (sum_to's
            # order, its bits) with the sums in registers: 9.3 -> 5.1 us
            # over 4096x16; CUDA's column sums are one launch
            kernels.call(kern, "bgemm", groups * length * cout_g,
                         ones(kern, (1, 1, length), dtype), gt,
                         reshaped(dest, (groups, 1, cout_g)), 0, 0, 1.0, beta, 1, 1, 1, groups)
        else:
            reduce_into(kern, gt, reshaped(dest, (groups, 1, cout_g)), 1.0, beta)
    if weight.requires_grad:   # dW[g] = G[g]^T @ cols[g], over the whole batch
        dest, beta = ctx.dest(weight)
        kernels.call(kern, "bgemm", work, gt, cols3, reshaped(dest, w3.shape), 1, 0, 1.0, beta,
                     1, 1, 1, groups)
    if x.requires_grad:   # dcols[g] = G[g] @ W[g], added back into the image
        cin_g, kh, kw = cols.shape[4:]
        cl = cin_g >= CL_MIN_CHANNELS
        w_dx = _channels_last(kern, w3, cin_g, kh * kw) if cl else w3
        dcols = buffers.take(kern, cols.shape[:4] + ((kh, kw, cin_g) if cl else cols.shape[4:]),
                             dtype)
        kernels.call(kern, "bgemm", work, gt, w_dx, reshaped(dcols, (groups, length, k_g)),
                     0, 0, 1.0, 0.0, 1, 1, 1, groups)
        dest, beta = ctx.dest(x)
        kernels.call(kern, "col2im_cl" if cl else "col2im",
                     GATHER_COST * (dcols.size + dest.size), dcols,
                     _as4d(dest, x.shape, is_batched, rank), sh, sw, ph, pw, dh, dw, beta)


# The input gradient's columns are channels last, (G, N, OH, OW, KH, KW, C/G)
# (``col2im_cl``), from this many channels a group: each column entry's
# channels are then one contiguous run to add (1.4-5.7x faster than
# ``col2im`` here, from 3x3 columns of 8 channels on 8x8 images to 16 on
# 16x16; 2x slower at 1 channel). The GEMM gives an entry the same bits in
# either column order (the same dot product; a test checks it), so the
# gradient is the same either way.
CL_MIN_CHANNELS = 8


def _channels_last(kern: Any, w3: Any, cin_g: int, taps: int) -> Any:
    """The weight (G, C_out/G, C_in/G * KH*KW) with each output channel's
    columns reordered to (KH*KW, C_in/G): a copy."""
    groups, cout_g, k_g = w3.shape
    out = buffers.take(kern, (groups, cout_g, k_g), w3.dtype)
    kernels.call(kern, "expand_nd", out.size,
                 permuted(reshaped(w3, (groups, cout_g, cin_g, taps)), (0, 1, 3, 2)),
                 reshaped(out, (groups, cout_g, taps, cin_g)), 1.0, 0.0)
    return out


# The direct (im2col-free) convolution runs a convolution of one group at
# stride 1 whose outputs each sum at most DIRECT_MAX_TAPS taps (C_in * KH *
# KW) and whose output planes have at least DIRECT_MIN_OUTPUTS positions.
# Measured with scripts/bench_conv.py (float32, serial kernels, the sum of
# each kernel's best time over a 3x3, padding-1 layer's forward and
# backward, the input's gradient too when C_in > 1; direct / im2col; on 2
# busy cores): batch 64, 16 outputs, 8x8: 1.01-1.06 at C_in 1 (the cnn
# case's first layer), 0.90-1.03 at 2, 1.06-1.08 at 3, 1.09-1.24 at 4;
# 16x16: 0.70-0.74 at C_in 1, 0.83-0.99 at 3, 1.02 at 8; batch 32, 32x32,
# C_in 3: 0.64-0.70; batch 16, 28x28, C_in 1: 0.73; the cnn case's second
# layer (144 taps, 4x4): 2.8-5.4. The direct loops also compute the
# padding's positions of each plane (a 3x3 kernel on an 8x8 plane: 100 for
# 64 outputs), which small planes cannot afford; many taps favour the
# GEMMs' blocking; beyond both, the columns' copies and the reorderings
# into and out of the GEMM's layout cost more than the direct loops.
# Stride > 1 would waste the direct loops' work on the skipped positions.
DIRECT_MAX_TAPS = 27
DIRECT_MIN_OUTPUTS = 256


def _direct_forward(x: Tensor, weight: Tensor, bias: Tensor | None, geometry: tuple,
                    out_shape: tuple) -> Tensor:
    """The convolution by ``conv2d_direct`` (one group, few taps): no columns,
    and NCHW in and out as they are."""
    n, channels, _, (kh, kw), _, (ph, pw), (dh, dw), _, is_batched, rank = geometry
    kern, dtype = x._kern, x._data.dtype
    cout = weight.shape[0]
    x4 = _as4d(contiguous(x), x.shape, is_batched, rank)
    w4 = reshaped(contiguous(weight), (cout, channels, kh, kw))
    out = buffers.take(kern, out_shape, dtype)
    # without a bias the kernel reads none: any array of the dtype stands in
    b = reshaped(w4, (w4.size,)) if bias is None else contiguous(bias)
    kernels.call(kern, "conv2d_direct", out.size, x4, w4, b,
                 _as4d(out, out_shape, is_batched, rank), ph, pw, dh, dw, bias is not None)
    inputs = (x, weight) if bias is None else (x, weight, bias)
    return result(out, kern, inputs, _direct_backward, (x4, w4, geometry))


def _direct_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    x, weight = node.inputs[:2]
    x4, w4, geometry = node.saved
    n, _, _, _, _, (ph, pw), (dh, dw), (oh, ow), is_batched, rank = geometry
    kern, dtype = x._kern, w4.dtype
    cout = w4.shape[0]
    g = ones(kern, (n, cout, oh, ow), dtype) if gout is None else gout
    g4 = reshaped(g, (n, cout, oh, ow))
    bias = node.inputs[2] if len(node.inputs) == 3 and node.inputs[2].requires_grad else None
    if weight.requires_grad:   # (with db, the sums over N, OH, OW, when the bias needs it)
        dest, beta = ctx.dest(weight)
        bias_dest, bias_beta = ctx.dest(bias) if bias is not None else (reshaped(
            dest, (dest.size,)), 0.0)
        kernels.call(kern, "conv2d_direct_weight", w4.size, g4, x4, reshaped(dest, w4.shape),
                     bias_dest, ph, pw, dh, dw, beta, bias_beta, bias is not None)
    elif bias is not None:
        dest, beta = ctx.dest(bias)
        reduce_into(kern, reshaped(g, (n, cout, oh * ow)), reshaped(dest, (1, cout, 1)), 1.0,
                    beta)
    if x.requires_grad:
        dest, beta = ctx.dest(x)
        kernels.call(kern, "conv2d_direct_input", dest.size, g4, w4,
                     _as4d(dest, x.shape, is_batched, rank), ph, pw, dh, dw, beta)


def conv2d(x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    """PyTorch's ``F.conv2d`` (a cross-correlation): x (N, C_in, H, W) or
    unbatched (C_in, H, W), weight (C_out, C_in / groups, KH, KW), bias
    (C_out,) or None; ``stride``, ``padding`` and ``dilation`` an int or a
    pair, ``padding`` also "valid" (0) or "same" (stride 1; an odd total
    puts the extra zero row/column after, as PyTorch). Zero padding only."""
    return _conv(x, weight, bias, stride, padding, dilation, groups, 2, "conv2d")


def conv1d(x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    """PyTorch's ``F.conv1d``: x (N, C_in, L) or unbatched (C_in, L), weight
    (C_out, C_in / groups, K); the other arguments as ``conv2d``'s."""
    return _conv(x, weight, bias, stride, padding, dilation, groups, 1, "conv1d")


# ------------------------------------------------------------ conv_transpose
def _conv_transpose(x: Any, weight: Any, bias: Any, stride: Any, padding: Any,
                    output_padding: Any, groups: Any, dilation: Any, rank: int,
                    op: str) -> Tensor:
    x, weight, bias, is_batched, groups, cout = _operands(x, weight, bias, groups, rank, op,
                                                          transposed=True)
    kernel = tuple(weight.shape[2:])
    stride = _ints(stride, rank, op, "stride", 1)
    padding = _ints(padding, rank, op, "padding", 0)
    output_padding = _ints(output_padding, rank, op, "output_padding", 0)
    dilation = _ints(dilation, rank, op, "dilation", 1)
    if any(o >= s and o >= d for o, s, d in zip(output_padding, stride, dilation)):
        raise ValueError(f"{op}: output_padding {output_padding} must be smaller than either "
                         f"stride {stride} or dilation {dilation} (as PyTorch)")
    size = tuple(x.shape[-rank:])
    out_size = tuple((n - 1) * s - 2 * p + d * (k - 1) + o + 1 for n, s, p, d, k, o in
                     zip(size, stride, padding, dilation, kernel, output_padding))
    if any(o < 1 for o in out_size):
        raise ValueError(f"{op}: input {describe(x)} with kernel {kernel}, stride {stride}, "
                         f"padding {padding} and dilation {dilation} gives the empty output "
                         f"size {out_size}")
    if rank == 1:   # a height-1 2-D one
        kernel, stride, padding, dilation = ((1,) + kernel, (1,) + stride, (0,) + padding,
                                             (1,) + dilation)
        size, out_hw = (1,) + size, (1,) + out_size
    else:
        out_hw = out_size
    n = x.shape[0] if is_batched else 1
    out_shape = ((n,) if is_batched else ()) + (cout,) + out_size
    geometry = (n, x.shape[-rank - 1], cout, groups, kernel, stride, padding, dilation, size,
                out_hw, is_batched, rank)
    return _conv_transpose_forward(x, weight, bias, geometry, out_shape)


def _conv_transpose_forward(x: Tensor, weight: Tensor, bias: Tensor | None, geometry: tuple,
                            out_shape: tuple) -> Tensor:
    """The input gradient of a convolution whose output is x: a GEMM per image
    and group into columns, which ``col2im`` adds up into the output (onto
    the bias, when there is one)."""
    n, cin, cout, groups, (kh, kw), (sh, sw), (ph, pw), (dh, dw), (h, w), _, is_batched, rank \
        = geometry
    kern, dtype = x._kern, x._data.dtype
    cin_g, cout_g, length = cin // groups, cout // groups, n * h * w
    k_g = cout_g * kh * kw
    xs = _transpose_operand(kern, contiguous(x), geometry)
    w3 = reshaped(contiguous(weight), (groups, cin_g, k_g))
    cols = buffers.take(kern, (groups, n, h, w, cout_g, kh, kw), dtype)
    work = groups * length * k_g * cin_g
    if groups == 1:   # cols[n] = x[n]^T @ W: x read in NCHW as it is
        kernels.call(kern, "bgemm", work, xs, w3, reshaped(cols, (n, h * w, k_g)),
                     1, 0, 1.0, 0.0, 1, 1, 1, n)
    else:
        kernels.call(kern, "bgemm", work, xs, w3, reshaped(cols, (groups, length, k_g)),
                     0, 0, 1.0, 0.0, 1, 1, 1, groups)
    out = buffers.take(kern, out_shape, dtype)
    out4 = _as4d(out, out_shape, is_batched, rank)
    beta = 0.0
    if bias is not None:
        broadcast_into(kern, reshaped(contiguous(bias), (1, cout, 1, 1)), out4.shape, out4)
        beta = 1.0
    kernels.call(kern, "col2im", GATHER_COST * (cols.size + out.size), cols, out4, sh, sw, ph,
                 pw, dh, dw, beta)
    inputs = (x, weight) if bias is None else (x, weight, bias)
    return result(out, kern, inputs, _conv_transpose_backward, (xs, w3, geometry, out_shape))


def _transpose_operand(kern: Any, data: Any, geometry: tuple) -> Any:
    """x (C-contiguous) as the GEMMs read it: (N, C_in, H*W) for one group;
    else (G, N*H*W, C_in/G), reordered from a copy (``ng.compile`` replays
    no strided view of an argument, which x may be)."""
    n, cin, _, groups, _, _, _, _, (h, w), _, _, _ = geometry
    if groups == 1:
        return reshaped(data, (n, cin, h * w))
    copy = buffers.take(kern, tuple(data.shape), data.dtype)
    copy_strided(kern, data, copy)
    cin_g = cin // groups
    xt = buffers.take(kern, (groups, n * h * w, cin_g), data.dtype)
    kernels.call(kern, "expand_nd", xt.size,
                 permuted(reshaped(copy, (n, groups, cin_g, h * w)), (1, 0, 3, 2)),
                 reshaped(xt, (groups, n, h * w, cin_g)), 1.0, 0.0)
    return xt


def _conv_transpose_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    """The gradient is a convolution of it: ``im2col`` once, then dx = its
    columns times the weight, dW = x's transpose times them."""
    x, weight = node.inputs[:2]
    xs, w3, geometry, out_shape = node.saved
    n, cin, cout, groups, (kh, kw), (sh, sw), (ph, pw), (dh, dw), (h, w), (oh, ow), \
        is_batched, rank = geometry
    kern, dtype = x._kern, w3.dtype
    cin_g, cout_g, length = cin // groups, cout // groups, n * h * w
    k_g = cout_g * kh * kw
    g = ones(kern, out_shape, dtype) if gout is None else gout
    if len(node.inputs) == 3 and node.inputs[2].requires_grad:   # db = sums over N, H, W
        dest, beta = ctx.dest(node.inputs[2])
        reduce_into(kern, reshaped(g, (n, cout, oh * ow)), reshaped(dest, (1, cout, 1)), 1.0,
                    beta)
    if not (weight.requires_grad or x.requires_grad):
        return
    cols = buffers.take(kern, (groups, n, h, w, cout_g, kh, kw), dtype)
    kernels.call(kern, "im2col", GATHER_COST * (g.size + cols.size),
                 _as4d(g, out_shape, is_batched, rank),
                 cols, sh, sw, ph, pw, dh, dw)
    work = groups * length * k_g * cin_g
    one = groups == 1   # one group: per image, x and dx in NCHW as they are
    cols3 = reshaped(cols, (n, h * w, k_g) if one else (groups, length, k_g))
    count = n if one else groups
    if weight.requires_grad:   # dW[g] = xt[g]^T @ cols[g] (one group: sum of x[n] @ cols[n])
        dest, beta = ctx.dest(weight)
        kernels.call(kern, "bgemm", work, xs, cols3, reshaped(dest, w3.shape), 0 if one else 1,
                     0, 1.0, beta, 1, 1, 1, count)
    if not x.requires_grad:
        return
    dest, beta = ctx.dest(x)
    if one:   # dx[n] = W @ cols[n]^T
        kernels.call(kern, "bgemm", work, w3, cols3, reshaped(dest, (n, cin, h * w)), 0, 1,
                     1.0, beta, 1, 1, 1, n)
        return
    prod = buffers.take(kern, (groups, length, cin_g), dtype)   # dx[g] = cols[g] @ W[g]^T
    kernels.call(kern, "bgemm", work, cols3, w3, prod, 0, 1, 1.0, 0.0, 1, 1, 1, groups)
    kernels.call(kern, "expand_nd", dest.size,
                 permuted(reshaped(prod, (groups, n, h * w, cin_g)), (1, 0, 3, 2)),
                 reshaped(dest, (n, groups, cin_g, h * w)), 1.0, beta)


def conv_transpose2d(x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
    """PyTorch's ``F.conv_transpose2d`` (the gradient of ``conv2d`` with respect
    to its input): x (N, C_in, H, W) or unbatched (C_in, H, W), weight
    (C_in, C_out / groups, KH, KW), bias (C_out,) or None; output size
    (H - 1) * stride - 2 * padding + dilation * (KH - 1) + output_padding + 1.
    ``output_padding`` must be smaller than stride or dilation. Note
    PyTorch's order: ``groups`` before ``dilation``."""
    return _conv_transpose(x, weight, bias, stride, padding, output_padding, groups, dilation,
                           2, "conv_transpose2d")


def conv_transpose1d(x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
    """PyTorch's ``F.conv_transpose1d``: x (N, C_in, L) or (C_in, L), weight
    (C_in, C_out / groups, K); the other arguments as ``conv_transpose2d``'s."""
    return _conv_transpose(x, weight, bias, stride, padding, output_padding, groups, dilation,
                           1, "conv_transpose1d")


# ------------------------------------------------------------ conv3d
def conv3d(x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    """PyTorch's ``F.conv3d``: x (N, C_in, D, H, W) or unbatched (C_in, D, H, W),
    weight (C_out, C_in / groups, KD, KH, KW), bias (C_out,) or None; the
    other arguments as ``conv2d``'s, with triples.

    Made of ``conv2d``: every output depth's KD input slices (zero-padded in
    depth, strided, dilated) are gathered as channels, kernel depth within
    each group, and one ``conv2d`` over the (N * OD) images with the weight
    laid out alike computes all of them in one GEMM per group; the
    gradients follow from the ops it is made of (the gather's adds the
    slices' gradients back up)."""
    op = "conv3d"
    x, weight, bias, is_batched, groups, cout = _operands(x, weight, bias, groups, 3, op)
    kd = weight.shape[2]
    stride = _ints(stride, 3, op, "stride", 1)
    dilation = _ints(dilation, 3, op, "dilation", 1)
    span = tuple(d * (k - 1) + 1 for d, k in zip(dilation, weight.shape[2:]))
    before, after = _padding(padding, stride, span, 3, op)
    od, _, _ = _output_size(x, before, after, span, stride, 3, op)
    if not is_batched:
        x = reshape(x, (1,) + x.shape)
    n, c, _, h, w = x.shape
    cg = c // groups
    if before[0] or after[0]:
        x = pad(x, ((0, 0), (0, 0), (before[0], after[0]), (0, 0), (0, 0)))
    # depth i * dd + o * sd for kernel depth i and output depth o, in (i, o) order
    depths = (np.arange(kd)[:, None] * dilation[0] + np.arange(od) * stride[0]).reshape(-1)
    picked = reshape(x[:, :, depths], (n, groups, cg, kd, od, h, w))
    images = reshape(permute(picked, (0, 4, 1, 3, 2, 5, 6)), (n * od, groups * kd * cg, h, w))
    w2 = reshape(permute(weight, (0, 2, 1, 3, 4)), (cout, kd * cg) + weight.shape[3:])
    if isinstance(padding, str):
        inner: Any = "valid" if padding == "valid" else "same"
    else:
        inner = before[1:]
    out = conv2d(images, w2, bias, stride[1:], inner, dilation[1:], groups)
    out = permute(reshape(out, (n, od, cout) + out.shape[2:]), (0, 2, 1, 3, 4))
    return out if is_batched else reshape(out, out.shape[1:])
