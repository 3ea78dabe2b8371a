"""Differentiable ops, each forward beside its backward.

A forward validates its operands (raising before anything is written),
takes its output from the buffer pool, runs one kernel and, when recording,
attaches a ``Node``. A backward receives the output's gradient (``None``
for the loss itself, meaning ones) and writes each input's gradient where
the pass's ``dest`` says, with beta=1 adding into what is already there.
"""
from __future__ import annotations

from typing import Any

from . import buffers, kernels, tape
from .tape import Node
from .tensor import Tensor, coerce


def _pair(a: Any, b: Any, op: str, names: tuple = ("first operand", "second operand")
          ) -> tuple[Tensor, Tensor]:
    """Both operands as tensors on one device with one dtype."""
    if type(a) is Tensor and type(b) is Tensor and a._kern is b._kern \
            and a._data.dtype == b._data.dtype:
        return a, b
    if isinstance(a, Tensor):
        b = coerce(b, a._kern, f"{op}: {names[1]}")
    else:
        if not isinstance(b, Tensor):
            b = coerce(b, kernels.get("cpu"), f"{op}: {names[1]}")
        a = coerce(a, b._kern, f"{op}: {names[0]}")
    if a._kern is not b._kern:
        raise ValueError(f"{op}: operands are on different devices: {names[0]} on "
                         f"{a.device} (shape {a.shape}), {names[1]} on {b.device} "
                         f"(shape {b.shape})")
    if a.dtype != b.dtype:
        raise TypeError(f"{op}: dtypes differ: {names[0]} {a.dtype} (shape {a.shape}), "
                        f"{names[1]} {b.dtype} (shape {b.shape}); convert one with "
                        "ng.tensor(x, dtype=...)")
    return a, b


# ------------------------------------------------------------------ matmul
def _as_matrix(array: Any, shape2: tuple) -> Any:
    return array if array.shape == shape2 else array.reshape(shape2)


def matmul(a: Any, b: Any) -> Tensor:
    """``a @ b`` for 1-D and 2-D operands, with NumPy's shape rules."""
    a, b = _pair(a, b, "matmul")
    ad, bd = a._data, b._data
    sa, sb = ad.shape, bd.shape
    if len(sa) == 2 and len(sb) == 2:
        a2, b2, out_shape = sa, sb, (sa[0], sb[1])
    elif len(sa) in (1, 2) and len(sb) in (1, 2):
        a2 = sa if len(sa) == 2 else (1, sa[0])
        b2 = sb if len(sb) == 2 else (sb[0], 1)
        out_shape = (a2[0],) * (len(sa) == 2) + (b2[1],) * (len(sb) == 2)
    else:
        raise ValueError(f"matmul: operands must be 1-D or 2-D, got shapes {sa} and {sb}")
    if a2[1] != b2[0]:
        raise ValueError(f"matmul: shapes {sa} and {sb} are not aligned: "
                         f"{a2[1]} (last dim of first) != {b2[0]} (first dim of second)")
    kern = a._kern
    out = buffers.take(kern, out_shape, ad.dtype)
    if a2 is sa and b2 is sb:
        kern.gemm(ad, bd, out, False, False, 1.0, 0.0)
        vector_shapes = ()
    else:
        kern.gemm(_as_matrix(ad, a2), _as_matrix(bd, b2), _as_matrix(out, (a2[0], b2[1])),
                  False, False, 1.0, 0.0)
        vector_shapes = (a2, b2)
    if tape._depth and (a.requires_grad or b.requires_grad):
        return Tensor(out, kern, True, Node(_matmul_backward, (a, b), vector_shapes))
    return Tensor(out, kern)


def _matmul_backward(ctx: tape._Backward, node: Node, gout: Any) -> None:
    # node.saved holds the operands' shapes as matrices when one of them is
    # a vector (so views get reshaped); it is empty for two matrices.
    a, b = node.inputs
    kern = a._kern
    ad, bd = a._data, b._data
    if node.saved:
        a2, b2 = node.saved
        o2 = (a2[0], b2[1])
        ad, bd = _as_matrix(ad, a2), _as_matrix(bd, b2)
    else:
        a2, b2, o2 = None, None, (ad.shape[0], bd.shape[1])
    if gout is None:
        gout = buffers.take(kern, o2, ad.dtype)
        kern.fill(gout, 1.0)
    elif a2 is not None:
        gout = _as_matrix(gout, o2)
    if a.requires_grad:   # dA = G @ B^T
        dest, beta = ctx.dest(a)
        kern.gemm(gout, bd, dest if a2 is None else _as_matrix(dest, a2),
                  False, True, 1.0, beta)
    if b.requires_grad:   # dB = A^T @ G
        dest, beta = ctx.dest(b)
        kern.gemm(ad, gout, dest if b2 is None else _as_matrix(dest, b2),
                  True, False, 1.0, beta)


# ---------------------------------------------------------------- mse_loss
_SCALES = {"mean": None, "sum": 1.0}   # None: 1 / number of elements


def mse_loss(pred: Any, target: Any, reduction: str = "mean") -> Tensor:
    """Squared error of ``pred`` against ``target``, averaged or summed.

    ``reduction="mean"`` averages over all elements, ``"sum"`` adds them.
    The target never receives a gradient. One fused kernel computes the
    loss and, for the backward pass, the residual gradient.
    """
    if reduction not in _SCALES:
        raise ValueError(f"mse_loss: reduction must be 'mean' or 'sum', got {reduction!r}")
    pred, target = _pair(pred, target, "mse_loss", ("pred", "target"))
    pd, td = pred._data, target._data
    if pd.shape != td.shape:
        raise ValueError(f"mse_loss: pred shape {pd.shape} and target shape "
                         f"{td.shape} differ")
    n = pd.size
    if n == 0:
        raise ValueError("mse_loss: pred and target are empty")
    kern = pred._kern
    loss = buffers.take(kern, (), pd.dtype)
    resid = buffers.take(kern, pd.shape, pd.dtype)
    scale = _SCALES[reduction] or 1.0 / n
    kern.mse(pd, td, loss, resid, scale)
    if tape._depth and pred.requires_grad:
        return Tensor(loss, kern, True, Node(_mse_backward, (pred,), (resid,)))
    return Tensor(loss, kern)


def _mse_backward(ctx: tape._Backward, node: Node, gout: Any) -> None:
    # A loss value feeds no other op yet, so it is always the root (gout is
    # None, meaning 1) and the residual is pred's gradient as it stands.
    assert gout is None, "mse_loss output used as an op input"
    ctx.give(node.inputs[0], node.saved[0])
