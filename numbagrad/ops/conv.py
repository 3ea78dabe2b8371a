"""Convolutions (``conv1d``, ``conv2d``) in PyTorch's NCHW layout, forward
beside backward.

The forward copies every input patch into a row of a pooled columns buffer
(``im2col``, laid out (G, N, OH, OW, C/G, KH, KW): one row per output
position and group), and one batched GEMM per call multiplies those rows
with each group's transposed weight, into (G, N*OH*OW, C_out/G), which one
strided copy reorders into NCHW. The backward reorders the output gradient
into that layout once, writes the weight gradient with one GEMM per group
over the whole batch, straight into its destination (beta=1 adds into a
param's accumulator), the bias gradient as column sums, and the input
gradient as a GEMM into columns that ``col2im`` adds back into the image.
With the patches as rows the GEMMs are (N*OH*OW x K) by (K x C_out) and
the like, which OpenBLAS runs faster than their transposes on small
channel counts (measured 1.3-1.5x on a digits CNN's second convolution).
``conv1d`` is ``conv2d`` of height 1.

CUDA launches: at most 4 per forward (im2col, the bias, the GEMM and the
reordering into NCHW) and, in the backward, 1 for the reordering of the
output gradient plus 1 for the bias, 1 for the weight and 2 for the input
gradient.
"""
from __future__ import annotations

import operator
from typing import Any

from .. import buffers, kernels
from ..tape import Node, _Backward
from ..tensor import Tensor
from ._common import (ArgumentLengthError, broadcast_into, contiguous, describe, ones, pair,
                      permuted, reduce_into, reshaped, result)


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


def _conv(x: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
          groups: Any, rank: int, op: str) -> Tensor:
    x, weight = pair(x, weight, op, ("input", "weight"), promote=False)
    x, is_batched = _batched(x, rank, op)
    if weight.ndim != rank + 2:
        raise ValueError(f"{op}: weight must be {rank + 2}-D (out_channels, in_channels / "
                         f"groups, *kernel_size), got {describe(weight)}")
    if bias is not None:
        _, bias = pair(x, bias, op, ("input", "bias"), promote=False)
    if isinstance(groups, bool) or not hasattr(groups, "__index__") or groups < 1:
        raise ValueError(f"{op}: groups must be a positive int, got {groups!r}")
    groups = operator.index(groups)
    channels = x.shape[-rank - 1]
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
    kernel = tuple(weight.shape[2:])
    if 0 in kernel:
        raise ValueError(f"{op}: weight {describe(weight)} has an empty kernel")
    stride = _ints(stride, rank, op, "stride", 1)
    dilation = _ints(dilation, rank, op, "dilation", 1)
    span = tuple(d * (k - 1) + 1 for d, k in zip(dilation, kernel))
    if isinstance(padding, str):
        if padding == "valid":
            before = after = (0,) * rank
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError(f"{op}: padding='same' needs stride 1 (as PyTorch), got "
                                 f"stride={stride}")
            # PyTorch's split of an odd total: the extra row/column at the end
            before = tuple((s - 1) // 2 for s in span)
            after = tuple(s - 1 - b for s, b in zip(span, before))
        else:
            raise ValueError(f"{op}: padding must be 'same', 'valid', an int or a tuple of "
                             f"{rank} ints, got {padding!r}")
    else:
        before = after = _ints(padding, rank, op, "padding", 0)
    size = tuple(x.shape[-rank:])
    if 0 in size:
        raise ValueError(f"{op}: input {describe(x)} has an empty spatial dim (only the batch "
                         "dim may be 0)")
    padded = tuple(n + b + a for n, b, a in zip(size, before, after))
    if any(p < s for p, s in zip(padded, span)):
        raise ValueError(f"{op}: input {describe(x)} is too small: its padded size {padded} "
                         f"is smaller than the (dilated) kernel size {span}")
    out_size = tuple((p - s) // st + 1 for p, s, st in zip(padded, span, stride))
    if rank == 1:   # a 1-D convolution is a 2-D one of height 1
        kernel, stride, dilation, before = ((1,) + kernel, (1,) + stride, (1,) + dilation,
                                            (0,) + before)
        out_hw = (1,) + out_size
    else:
        out_hw = out_size
    n = x.shape[0] if is_batched else 1
    out_shape = ((n,) if is_batched else ()) + (cout,) + out_size
    geometry = (n, channels, groups, kernel, stride, before, dilation, out_hw, is_batched, rank)
    return _conv_forward(x, weight, bias, geometry, out_shape)


def _conv_forward(x: Tensor, weight: Tensor, bias: Tensor | None, geometry: tuple,
                  out_shape: tuple) -> Tensor:
    n, channels, groups, (kh, kw), (sh, sw), (ph, pw), (dh, dw), (oh, ow), is_batched, rank \
        = geometry
    kern, dtype = x._kern, x._data.dtype
    cout = weight.shape[0]
    cout_g, k_g, length = cout // groups, channels // groups * kh * kw, n * oh * ow
    x4 = _as4d(contiguous(x), x.shape, is_batched, rank)
    cols = buffers.take(kern, (groups, n, oh, ow, channels // groups, kh, kw), dtype)
    kernels.call(kern, "im2col", cols.size, x4, cols, sh, sw, ph, pw, dh, dw)
    w3 = reshaped(contiguous(weight), (groups, cout_g, k_g))
    # the GEMM writes (G, N*OH*OW, C_out/G), every patch's outputs in a row
    prod = buffers.take(kern, (groups, length, cout_g), dtype)
    beta = 0.0
    if bias is not None:
        broadcast_into(kern, reshaped(contiguous(bias), (groups, 1, cout_g)), prod.shape, prod)
        beta = 1.0
    work = groups * length * k_g * cout_g   # multiply-adds: picks bgemm's threaded twin
    kernels.call(kern, "bgemm", work, reshaped(cols, (groups, length, k_g)), w3, prod,
                 0, 1, 1.0, beta, 1, 1, 1, groups)
    out = buffers.take(kern, out_shape, dtype)
    kernels.call(kern, "expand_nd", out.size,
                 permuted(reshaped(prod, (groups, n, oh * ow, cout_g)), (1, 0, 3, 2)),
                 reshaped(out, (n, groups, cout_g, oh * ow)), 1.0, 0.0)
    inputs = (x, weight) if bias is None else (x, weight, bias)
    return result(out, kern, inputs, _conv_backward, (cols, w3, geometry))


def _conv_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    x, weight = node.inputs[:2]
    cols, w3, geometry = node.saved
    n, channels, groups, _, (sh, sw), (ph, pw), (dh, dw), (oh, ow), is_batched, rank = geometry
    kern, dtype = x._kern, w3.dtype
    cout, length = weight.shape[0], n * oh * ow
    cout_g, k_g = cout // groups, w3.shape[2]
    g = ones(kern, (n, cout, oh * ow), dtype) if gout is None else gout
    # (N, C_out, OH*OW) -> (G, N*OH*OW, C_out/G), the GEMMs' layout
    gt = buffers.take(kern, (groups, length, cout_g), dtype)
    kernels.call(kern, "expand_nd", gt.size,
                 permuted(reshaped(g, (n, groups, cout_g, oh * ow)), (1, 0, 3, 2)),
                 reshaped(gt, (groups, n, oh * ow, cout_g)), 1.0, 0.0)
    cols3 = reshaped(cols, (groups, length, k_g))
    work = groups * length * k_g * cout_g   # each GEMM's multiply-adds
    if len(node.inputs) == 3 and node.inputs[2].requires_grad:   # db = column sums
        dest, beta = ctx.dest(node.inputs[2])
        reduce_into(kern, gt, reshaped(dest, (groups, 1, cout_g)), 1.0, beta)
    if weight.requires_grad:   # dW[g] = G[g]^T @ cols[g], over the whole batch
        dest, beta = ctx.dest(weight)
        kernels.call(kern, "bgemm", work, gt, cols3, reshaped(dest, w3.shape), 1, 0, 1.0, beta,
                     1, 1, 1, groups)
    if x.requires_grad:   # dcols[g] = G[g] @ W[g], added back into the image
        dcols = buffers.take(kern, tuple(cols.shape), dtype)
        kernels.call(kern, "bgemm", work, gt, w3, reshaped(dcols, (groups, length, k_g)),
                     0, 0, 1.0, 0.0, 1, 1, 1, groups)
        dest, beta = ctx.dest(x)
        kernels.call(kern, "col2im", dest.size, dcols, _as4d(dest, x.shape, is_batched, rank),
                     sh, sw, ph, pw, dh, dw, beta)


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
