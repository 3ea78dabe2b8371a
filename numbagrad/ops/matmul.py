"""Matrix products: ``matmul`` and ``linear``, each forward beside its backward.

A transposed operand (``x.T``, or an N-d view with its last two dims
swapped) is a strided view; the GEMM reads its C-contiguous base through a
transpose flag instead of copying it. Stacks of matrices run as one batched
GEMM (``bgemm``) whose products may read a broadcast operand's slices many
times and whose gradients add those products up in place.
"""
from __future__ import annotations

from typing import Any

from .. import buffers, kernels
from ..kernels import codes
from ..tape import Node, _Backward, output
from ..tape import _state as _tape_state
from ..tensor import Tensor
from ._common import (_F32, _F64, broadcast_into, contiguous, describe, is_scalar, ones, pair,
                      permuted, reduce_into, reshaped, result, scalar_of)


_HOST = buffers.HOST
# dtype -> the CPU gemm's specialisation for three C-contiguous matrices (kernels.hot_table)
_HOT_GEMM = kernels.hot_table()


def _gemm_operand(t: Tensor) -> tuple[Any, bool]:
    """(C-contiguous array, transposed?) with ``array.T`` == data when flagged."""
    data, kern = t._data, t._kern
    if kern.is_c_contiguous(data):
        return data, 0
    if len(data.shape) == 2 and kern.is_c_contiguous(data.T):
        return data.T, 1
    return contiguous(t), 0


def _as_matrix(array: Any, shape2: tuple, transposed: bool = False) -> Any:
    """``array`` (a vector, a matrix or a stack of matrices) as the matrix
    ``shape2``; the base of a transposed operand, read through its flag, as
    it is."""
    return array if transposed or array.shape == shape2 else reshaped(array, shape2)


# ------------------------------------------------------------------ matmul
def matmul(a: Any, b: Any) -> Tensor:
    """``a @ b`` with NumPy's (and PyTorch's) ``matmul`` rules: a 1-D
    operand is a row (first) or a column (second) that is dropped from the
    result; operands of 3 or more dims are stacks of matrices whose batch
    dims broadcast, ``(B, 1, n, k) @ (H, k, m)`` -> ``(B, H, n, m)``. Never a
    view. A view whose last two dims are swapped (a transpose) is read
    through the GEMM's transpose flag, not copied; ``(..., n, k) @ (k, m)``
    with a contiguous or copied first operand is one 2-D GEMM of its rows.
    The backward writes each gradient straight into its destination, a
    broadcast operand's summed over the batch there.

    Stacks run as one ``bgemm`` per forward and per gradient (on CUDA one
    launch each), except when an operand's unbroadcast batch dims are not
    adjacent, e.g. ``(B, 1, C, n, k) @ (1, H, 1, k, m)``: that operand is first
    expanded to the full batch (one more kernel each way).
    """
    # The common case, two C-contiguous float matrices of one device and
    # dtype, skips the general checks.
    if type(a) is Tensor and type(b) is Tensor:
        ad, bd, kern = a._data, b._data, a._kern
        dtype, sa, sb = ad.dtype, ad.shape, bd.shape
        if b._kern is kern and (dtype is _F32 or dtype is _F64) and bd.dtype is dtype \
                and type(sa) is tuple and len(sa) == 2 and len(sb) == 2 and sa[1] == sb[0] \
                and kern.is_c_contiguous(ad) and kern.is_c_contiguous(bd):
            n, m = sa[0], sb[1]
            work = n * m * sb[0]
            if kern is _HOST and n * m <= buffers.FRESH and kernels._observer is None:
                out = buffers.fresh((n, m), dtype)
                gemm = _HOT_GEMM.get(dtype) if work < _HOST.MT_MIN else None
            else:
                out, gemm = buffers.take(kern, (n, m), dtype), None
            if gemm is None:
                gemm = kernels.typed(kern, "gemm", work, dtype, _HOT_GEMM)
            # three C-contiguous matrices of one float dtype, two ints, two floats
            gemm(ad, bd, out, 0, 0, 1.0, 0.0)
            # result(out, kern, (a, b), _matmul_backward, saved), inline
            if (a.requires_grad or b.requires_grad) and _tape_state.box[0] > 0:
                return output(out, kern, out, _matmul_backward, (a, b), (ad, 0, bd, 0, None))
            return output(out, kern, out)
    return _matmul_checked(a, b)


def _matmul_checked(a: Any, b: Any) -> Tensor:
    a, b = pair(a, b, "matmul", promote=False)
    sa, sb = a.shape, b.shape
    if len(sa) == 0 or len(sb) == 0:
        raise ValueError(f"matmul: operands must have at least 1 dim, got {describe(a)} and "
                         f"{describe(b)}")
    pa = sa if len(sa) >= 2 else (1,) + sa          # a vector: one row
    pb = sb if len(sb) >= 2 else sb + (1,)          # a vector: one column
    if pa[-1] != pb[-2]:
        raise ValueError(f"matmul: shapes {sa} and {sb} are not aligned: {pa[-1]} (last dim "
                         f"of first) != {pb[-2]} (second-to-last dim of second); operands "
                         f"{describe(a)} and {describe(b)}")
    batch = () if len(pa) == 2 and len(pb) == 2 else _batch_shape(a, b, pa[:-2], pb[:-2])
    out_shape = batch + (pa[-2],) * (len(sa) >= 2) + (pb[-1],) * (len(sb) >= 2)
    if len(pb) > 2 or (len(pa) > 2 and _swapped(a) is not None):
        return _bmm(a, b, pa, pb, batch, out_shape)
    # (..., n, k) @ (k, m): one GEMM of (... * n, k) @ (k, m)
    a2 = pa if len(pa) == 2 else (_prod(pa[:-1]), pa[-1])
    kern = a._kern
    (ad, ta), (bd, tb) = _gemm_operand(a), _gemm_operand(b)
    out = buffers.take(kern, out_shape, ad.dtype)
    work = a2[0] * a2[1] * pb[1]   # multiply-adds: the size that picks gemm's threaded twin
    if a2 is sa and pb is sb:
        kernels.call(kern, "gemm", work, ad, bd, out, ta, tb, 1.0, 0.0)
        shapes = None
    else:   # gemm sees a vector as a one-row or one-column matrix, a stack as its rows
        kernels.call(kern, "gemm", work, _as_matrix(ad, a2, ta), _as_matrix(bd, pb, tb),
                     _as_matrix(out, (a2[0], pb[1])), ta, tb, 1.0, 0.0)
        shapes = (a2, pb)
    return result(out, kern, (a, b), _matmul_backward, (ad, ta, bd, tb, shapes))


def _prod(dims: tuple) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _batch_shape(a: Tensor, b: Tensor, ba: tuple, bb: tuple) -> tuple:
    """NumPy's broadcast of the two operands' batch dims, or a clear error."""
    n = max(len(ba), len(bb))
    pa, pb = (1,) * (n - len(ba)) + ba, (1,) * (n - len(bb)) + bb
    if any(x != y and x != 1 and y != 1 for x, y in zip(pa, pb)):
        raise ValueError(f"matmul: batch dims {ba} and {bb} cannot be broadcast together; "
                         f"operands {describe(a)} and {describe(b)}")
    return tuple(y if x == 1 else x for x, y in zip(pa, pb))


def _swapped(t: Tensor) -> Any:
    """For a strided ``t`` whose last two dims are swapped relative to C
    order (``x.mT``), the C-contiguous array that is its data with those
    dims swapped back (a view); None for any other ``t``."""
    data, kern = t._data, t._kern
    nd = len(data.shape)
    if nd < 2 or kern.is_c_contiguous(data):
        return None
    base = permuted(data, tuple(range(nd - 2)) + (nd - 1, nd - 2))
    return base if kern.is_c_contiguous(base) else None


def _divisor(shape: tuple, batch: tuple) -> int | None:
    """How an operand's batch slice follows from a product index o: slice
    (o // div) % size when the dims it does not broadcast form one run of
    ``batch`` (after dropping size-1 dims); None when they do not."""
    shape = (1,) * (len(batch) - len(shape)) + shape
    full = [i for i, n in enumerate(batch) if n != 1 and shape[i] == n]
    bcast = [i for i, n in enumerate(batch) if n != 1 and shape[i] != n]
    if not full:
        return 1
    if any(full[0] < i < full[-1] for i in bcast):
        return None
    return _prod(batch[full[-1] + 1:])


def _bmm_operand(t: Tensor, shape: tuple, batch: tuple) -> tuple:
    """(3-D C-contiguous stack, transposed?, div, expanded?) for a batched
    operand of padded matrix shape ``shape``: a view whose last two dims are
    swapped is read through the flag; one whose batch dims cannot be indexed
    by a divisor is first expanded to the full ``batch``."""
    rows, cols = shape[-2:]
    div = _divisor(shape[:-2], batch)
    if div is None:   # (only an operand of 3 or more dims: its shape is t's)
        full = broadcast_into(t._kern, t._data, batch + (rows, cols))
        return reshaped(full, (_prod(batch), rows, cols)), 0, 1, True
    count = _prod(shape[:-2])
    base = _swapped(t)
    if base is not None:
        return reshaped(base, (count, cols, rows)), 1, div, False
    return reshaped(contiguous(t), (count, rows, cols)), 0, div, False


def _bmm(a: Tensor, b: Tensor, pa: tuple, pb: tuple, batch: tuple, out_shape: tuple) -> Tensor:
    """Batched matmul: one ``bgemm`` over the broadcast batch."""
    kern = a._kern
    a3, ta, a_div, a_full = _bmm_operand(a, pa, batch)
    b3, tb, b_div, b_full = _bmm_operand(b, pb, batch)
    count = _prod(batch)
    out = buffers.take(kern, out_shape, a3.dtype)
    out3 = reshaped(out, (count, pa[-2], pb[-1]))
    work = count * pa[-2] * pa[-1] * pb[-1]   # multiply-adds: picks bgemm's threaded twin
    kernels.call(kern, "bgemm", work, a3, b3, out3, ta, tb, 1.0, 0.0, a_div, b_div, 1, count)
    saved = (a3, ta, a_div, a_full, pa, b3, tb, b_div, b_full, pb, batch,
             (count, pa[-2], pb[-1]))
    return result(out, kern, (a, b), _bmm_backward, saved)


def _bmm_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    # dA[i] += G[o] @ op(B[.])^T and dB[i] += op(A[.])^T @ G[o], summed over
    # the products o that read slice i (a broadcast operand's shared slices)
    a, b = node.inputs
    a3, ta, a_div, a_full, pa, b3, tb, b_div, b_full, pb, batch, o3 = node.saved
    kern = a._kern
    count = o3[0]
    g = ones(kern, o3, a3.dtype) if gout is None else gout
    g3 = reshaped(g, o3)
    if a.requires_grad:
        dest, beta = ctx.dest(a)
        _bmm_grad(kern, g3, b3, 0, 1 - tb, a_div, 1, b_div, dest, beta, a_full, pa, batch,
                  count)
    if b.requires_grad:
        dest, beta = ctx.dest(b)
        _bmm_grad(kern, a3, g3, 1 - ta, 0, b_div, a_div, 1, dest, beta, b_full, pb, batch,
                  count)


def _bmm_grad(kern: Any, x3: Any, y3: Any, tx: int, ty: int, div: int, x_div: int,
              y_div: int, dest: Any, beta: float, full: bool, shape: tuple, batch: tuple,
              count: int) -> None:
    """One operand's gradient: a bgemm straight into ``dest``, or, for an
    operand that was expanded, into the full batch and then summed down."""
    rows, cols = shape[-2:]
    work = count * rows * cols * (x3.shape[1] if tx else x3.shape[2])   # multiply-adds
    if not full:
        d3 = reshaped(dest, (_prod(shape[:-2]), rows, cols))
        kernels.call(kern, "bgemm", work, x3, y3, d3, tx, ty, 1.0, beta, x_div, y_div, div,
                     count)
        return
    tmp = buffers.take(kern, batch + (rows, cols), dest.dtype)
    kernels.call(kern, "bgemm", work, x3, y3, reshaped(tmp, (count, rows, cols)), tx, ty, 1.0,
                 0.0, x_div, y_div, 1, count)
    reduce_into(kern, tmp, dest, 1.0, beta)


def _matmul_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    # saved: each operand as the GEMM read it (array, transposed?) and, when
    # one of them is a vector, both operands' shapes as matrices.
    a, b = node.inputs
    ad, ta, bd, tb, shapes = node.saved
    kern = a._kern
    if shapes is None and not ta and not tb and gout is not None and kern.is_c_contiguous(gout):
        # Two C-contiguous matrices (the fast path's) and a C-contiguous gradient
        # of the output's shape, as every gradient is: the typed calls at once.
        dtype, work = gout.dtype, gout.size * bd.shape[0]
        gemm = _HOT_GEMM.get(dtype) if kern is _HOST and work < _HOST.MT_MIN else None
        if gemm is None:
            gemm = kernels.typed(kern, "gemm", work, dtype, _HOT_GEMM)
        if a.requires_grad:   # dA = G @ B^T
            dest, beta = ctx.dest(a)
            gemm(gout, bd, dest, 0, 1, 1.0, beta)
        if b.requires_grad:   # dB = A^T @ G
            dest, beta = ctx.dest(b)
            gemm(ad, gout, dest, 1, 0, 1.0, beta)
        return
    if shapes is not None:
        a2, b2 = shapes
        am, bm = _as_matrix(ad, a2, ta), _as_matrix(bd, b2, tb)
        o2 = (a2[0], b2[1])
    else:
        a2 = b2 = None
        am, bm = ad, bd
        o2 = (ad.shape[1] if ta else ad.shape[0], bd.shape[0] if tb else bd.shape[1])
    # g holds the pooled gradient itself while its matrix view is in use: a
    # view of a device array does not reference its parent, so the pool
    # would see g idle and could hand it out as a destination below.
    g = ones(kern, o2, ad.dtype) if gout is None else gout
    g2 = g if g.shape == o2 else reshaped(g, o2)
    # the saved operands, the destinations (accumulators or pooled) and a
    # C-contiguous g2 are C-contiguous matrices of one dtype: the typed call
    run = kernels.call_typed if kern.is_c_contiguous(g2) else _call_untyped
    work = g2.size * (am.shape[0] if ta else am.shape[1])
    if a.requires_grad:   # dA = G @ op(B)^T
        dest, beta = ctx.dest(a)
        run(kern, "gemm", work, g2.dtype, g2, bm, dest if a2 is None else _as_matrix(dest, a2), 0,
            1 - tb, 1.0, beta)
    if b.requires_grad:   # dB = op(A)^T @ G
        dest, beta = ctx.dest(b)
        run(kern, "gemm", work, g2.dtype, am, g2, dest if b2 is None else _as_matrix(dest, b2),
            1 - ta, 0, 1.0, beta)


def _call_untyped(kern: Any, name: str, size: int, key: Any, *args: Any) -> None:
    kernels.call(kern, name, size, *args)


# ------------------------------------------------------------------ linear
# linear's activations, name -> kernel code: the unary codes whose record
# (kernels/codes.py) says ``fuse``. The GEMM's epilogue applies those whose
# gradient is a function of the output; for the others (``codes.PRE_KEPT``)
# the GEMM writes the pre-activation, which the backward needs, and one
# unary pass applies the activation.
ACTIVATIONS = codes.ACTIVATIONS
_PRE_KEPT = codes.PRE_KEPT


def linear(x: Any, weight: Any, bias: Any = None, activation: str | None = None,
           negative_slope: float = 0.01) -> Tensor:
    """``x @ weight.T + bias``, PyTorch's ``F.linear``: x (..., in) (any
    number of leading dims, or (in,)), weight (out, in), bias (out,) or None;
    the result is (..., out). The leading dims are flattened into one GEMM
    with the bias folded in (a contiguous x is not copied); the backward
    writes dW with one GEMM, db as column sums and dx with one GEMM, each
    straight into its destination.

    ``activation`` ("relu", "leaky_relu" with ``negative_slope`` >= 0,
    "tanh" or "sigmoid") is applied in the same kernel: the GEMM writes the
    output and one epilogue pass adds the bias and applies it (on CUDA, the
    GEMM's own epilogue), as ``relu(linear(x, W, b))`` computes in three
    passes. "gelu" and "silu" need the pre-activation for their gradient:
    the GEMM writes it, bias added, and one unary pass applies them.
    ``ng.nn.Sequential`` uses it for a ``Linear`` followed by one of these
    activations.
    """
    code, p = (codes.IDENT, 0.0) if activation is None else _activation(activation,
                                                                         negative_slope)
    # The common case (contiguous 2-D tensors of one device and float dtype)
    # skips the general checks: this op runs twice per layer per micro-step.
    if type(x) is Tensor and type(weight) is Tensor and (bias is None or type(bias) is Tensor):
        xd, wd, kern = x._data, weight._data, x._kern
        xs, ws, dtype = xd.shape, wd.shape, xd.dtype
        if weight._kern is kern and (dtype is _F32 or dtype is _F64) and wd.dtype is dtype \
                and type(xs) is tuple \
                and len(xs) == 2 and len(ws) == 2 and xs[1] == ws[1] \
                and (bias is None or (bias._kern is kern and bias._data.dtype is dtype
                                      and bias._data.shape == (ws[0],))) \
                and kern.is_c_contiguous(xd) and kern.is_c_contiguous(wd):
            return _linear(x, weight, bias, xd, wd, kern, xd, (xs[0], ws[0]), code, p)
    return _linear_checked(x, weight, bias, code, p)


def _activation(activation: Any, negative_slope: Any) -> tuple[int, float]:
    code = ACTIVATIONS.get(activation) if isinstance(activation, str) else None
    if code is None:
        raise ValueError(f"linear: activation must be None or one of "
                         f"{', '.join(map(repr, ACTIVATIONS))}, got {activation!r}")
    if code != codes.LEAKY_RELU:
        return code, 0.0
    if not is_scalar(negative_slope) or not negative_slope >= 0:
        raise ValueError(f"linear: activation='leaky_relu' needs a negative_slope >= 0 (its "
                         f"gradient is then read from the output), got {negative_slope!r}; "
                         f"use ng.leaky_relu(ng.linear(...)) for a negative slope")
    return code, float(negative_slope)


def _linear_checked(x: Any, weight: Any, bias: Any, code: int, p: float) -> Tensor:
    op = "linear"
    x, weight = pair(x, weight, op, ("input", "weight"), promote=False)
    if weight.ndim != 2 or x.ndim == 0:
        raise ValueError(f"{op}: needs input of at least 1 dim and a 2-D weight, got input "
                         f"{describe(x)} and weight {describe(weight)}")
    features = x.shape[x.ndim - 1]
    if features != weight.shape[1]:
        raise ValueError(f"{op}: input {describe(x)} has {features} features but weight "
                         f"{describe(weight)} expects {weight.shape[1]}")
    if bias is not None:
        _, bias = pair(x, bias, op, ("input", "bias"), promote=False)
        if bias.shape != (weight.shape[0],):
            raise ValueError(f"{op}: bias {describe(bias)} does not match weight "
                             f"{describe(weight)}; expected shape ({weight.shape[0]},)")
    xd, wd = contiguous(x), contiguous(weight)
    x2 = xd if x.ndim == 2 else reshaped(xd, (_prod(x.shape[:-1]), features))
    out_shape = x.shape[:-1] + (weight.shape[0],)
    return _linear(x, weight, bias, xd, wd, x._kern, x2, out_shape, code, p)


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None, xd: Any, wd: Any, kern: Any,
            x2: Any, out_shape: tuple, code: int, p: float) -> Tensor:
    dtype = xd.dtype
    out = buffers.take(kern, out_shape, dtype)
    out2 = out if len(out_shape) == 2 else reshaped(out, (x2.shape[0], out_shape[-1]))
    kept = code in _PRE_KEPT
    pre = buffers.take(kern, out2.shape, dtype) if kept else out2
    fused = codes.IDENT if kept else code
    work = x2.size * wd.shape[0]   # multiply-adds (gemm's and linear's threaded twins)
    if bias is None:
        inputs = (x, weight)
        if pre.size:   # (a weight of no rows has no row 0 to stand in for the bias)
            # C-contiguous x2, wd, its row wd[0] and pre of one dtype, ints, a dtype scalar
            kernels.typed(kern, "linear", work, dtype)(x2, wd, wd[0], pre, 0, fused,
                                                    scalar_of(dtype, p))
    else:
        bd = bias._data
        run = kernels.call_typed if kern.is_c_contiguous(bd) else _call_untyped
        run(kern, "linear", work, dtype, x2, wd, bd, pre, 1, fused, scalar_of(dtype, p))
        inputs = (x, weight, bias)
    if kept:
        kernels.call(kern, "unary", out2.size, code, pre, out2, scalar_of(dtype, p),
                     scalar_of(dtype, 1.0), scalar_of(dtype, 0.0))
    return result(out, kern, inputs, _linear_backward, (x2, wd, out2, code, p, pre))


def _linear_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    x, weight = node.inputs[:2]
    x2, wd, y2, code, p, pre_act = node.saved
    kern = x._kern
    o2 = y2.shape
    g2 = ones(kern, o2, wd.dtype) if gout is None else reshaped(gout, o2)
    if code != codes.IDENT:   # through the activation, its gradient read from the output
        pre = buffers.take(kern, o2, wd.dtype)
        kernels.call(kern, "unary_backward", pre.size, code, pre_act, y2, g2, pre, 0.0,
                     scalar_of(wd.dtype, p))
        g2 = pre
    # x2, wd and the destinations are C-contiguous matrices: typed when g2 is
    run = kernels.call_typed if kern.is_c_contiguous(g2) else _call_untyped
    work = g2.size * x2.shape[1]
    if weight.requires_grad:   # dW = G^T @ x
        dest, beta = ctx.dest(weight)
        run(kern, "gemm", work, g2.dtype, g2, x2, dest, 1, 0, 1.0, beta)
    if len(node.inputs) == 3 and node.inputs[2].requires_grad:   # db = column sums of G
        bias = node.inputs[2]
        dest, beta = ctx.dest(bias)
        kernels.call(kern, "sum_to", 0, g2, reshaped(dest, (1, dest.size)), 1.0, beta)
    if x.requires_grad:   # dx = G @ W
        dest, beta = ctx.dest(x)
        run(kern, "gemm", work, g2.dtype, g2, wd, reshaped(dest, x2.shape), 0, 0, 1.0, beta)
