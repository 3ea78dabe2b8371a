"""Losses: each forward computes the loss and its input gradient in one fused
kernel; the backward hands that gradient on (scaled when the loss feeds
further ops, say ``mse + 0.01 * reg``)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import buffers, kernels
from ..kernels import scalar as codes
from ..kernels.cpu.losses import first_bad_label
from ..tape import Node, _Backward
from ..tape import _state as _tape_state
from ..tensor import Tensor
from ._common import (check_reduction, contiguous, describe, mean_scale, operand, pair,
                      reshaped, result)


def _loss_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    # node.saved[0] is d loss / d input; gout (a 0-d array) scales it.
    x = node.inputs[0]
    grad = node.saved[0]
    if gout is None:
        below = x._node
        if below is not None and below not in ctx.pending:   # ctx.give's common case, inline
            ctx.pending[below] = grad
        else:
            ctx.give(x, grad)
        return
    dest, beta = ctx.dest(x)
    kern = x._kern
    kernels.call(kern, "scaled_add", grad.size, gout, grad, beta, dest)


def _scale(reduction: str, count: int) -> float:
    """The loss sum's scale: 1 for "sum", ``mean_scale(count)`` for "mean"."""
    return 1.0 if reduction == "sum" else mean_scale(count)


def mse_loss(pred: Any, target: Any, reduction: str = "mean") -> Tensor:
    """Squared error of ``pred`` against ``target``, averaged or summed.

    ``reduction="mean"`` averages over all elements (nan for none, as
    PyTorch), ``"sum"`` adds them.
    The target never receives a gradient. One fused kernel computes the
    loss and, for the backward pass, the residual gradient.
    """
    if reduction != "mean":
        check_reduction("mse_loss", reduction)
    # The common case (a contiguous pred, and a target of the same device,
    # dtype and shape, or a matching host array on the CPU) skips `pair`.
    if type(pred) is Tensor:
        pd, kern = pred._data, pred._kern
        td = target._data if type(target) is Tensor and target._kern is kern else \
            (target if kern.name == "cpu" and type(target) is np.ndarray else None)
        if td is not None and td.dtype == pd.dtype and td.shape == pd.shape \
                and type(pd.shape) is tuple and kern.is_c_contiguous(pd) \
                and kern.is_c_contiguous(td):
            return _mse(pred, pd, td, kern, reduction)
    pred, target = pair(pred, target, "mse_loss", ("pred", "target"))
    pd, td = pred._data, target._data
    if pd.shape != td.shape:
        raise ValueError(f"mse_loss: pred shape {pd.shape} and target shape "
                         f"{td.shape} differ")
    return _mse(pred, contiguous(pred), contiguous(target), pred._kern, reduction)


def _mse(pred: Tensor, pd: Any, td: Any, kern: Any, reduction: str) -> Tensor:
    dtype, n = pd.dtype, pd.size
    loss = buffers.take(kern, (), dtype)
    resid = buffers.take(kern, pd.shape, dtype)
    # _scale(reduction, n), inline
    scale = 1.0 if reduction == "sum" else (1.0 / n if n else math.nan)
    # pd, td and resid: C-contiguous of one rank and dtype; loss: 0-d; a float
    kernels.call_typed(kern, "mse", n, (dtype, len(pd.shape)), pd, td, loss, resid, scale)
    # result(loss, kern, (pred,), _loss_backward, (resid,)), inline
    if pred.requires_grad and _tape_state.depth > 0:
        return Tensor(loss, kern, True, Node(_loss_backward, (pred,), (resid,)), loss)
    return Tensor(loss, kern, False, None, loss)


def binary_cross_entropy_with_logits(logits: Any, target: Any,
                                     reduction: str = "mean") -> Tensor:
    """PyTorch's ``F.binary_cross_entropy_with_logits``: the sigmoid and the
    binary cross-entropy in one stable formula (fine for logits of +-1000).
    ``target`` holds probabilities in [0, 1], same shape as ``logits``; the
    mean over no elements is nan, as PyTorch."""
    check_reduction("binary_cross_entropy_with_logits", reduction)
    x, t = pair(logits, target, "binary_cross_entropy_with_logits", ("logits", "target"))
    if x.shape != t.shape:
        raise ValueError(f"binary_cross_entropy_with_logits: logits shape {x.shape} and "
                         f"target shape {t.shape} differ")
    kern, dtype = x._kern, x._data.dtype
    loss = buffers.take(kern, (), dtype)
    grad = buffers.take(kern, x.shape, dtype)
    scale = _scale(reduction, x.size)
    kernels.call(kern, "pointwise_loss", grad.size, codes.BCE_LOGITS, contiguous(x), contiguous(t),
                 loss, grad, scale)
    return result(loss, kern, (x,), _loss_backward, (grad,))


def cross_entropy(logits: Any, target: Any, reduction: str = "mean") -> Tensor:
    """PyTorch's ``F.cross_entropy`` for logits (N, C) or (N, C, d1, ...) and
    integer class indices ``target`` (N,) or (N, d1, ...): log-softmax and
    negative log-likelihood fused in one stable kernel, whose backward is
    softmax minus one-hot; the mean is over every (sample, position). The
    mean over nothing is nan, as PyTorch.

    ``target`` is a NumPy integer array on either device (on "cuda" it is
    uploaded once per call) or, on "cuda", a Numba device array of integers
    (no upload; its values are not checked on the host). With positions
    (d1, ...), the kernel reads the logits in place as (N, C, d1 * ...), the
    classes at stride d1 * ..., and writes the gradient in their layout: one
    launch either way.
    """
    op = "cross_entropy"
    check_reduction(op, reduction)
    x = operand(logits, op, "logits")
    kern, shape, dtype = x._kern, x._data.shape, x._data.dtype
    if len(shape) == 2:
        n, classes = shape
        labels = _labels(kern, target, (n,), classes)
        loss = buffers.take(kern, (), dtype)
        grad = buffers.take(kern, shape, dtype)
        # C-contiguous logits and gradient of one dtype, int64 labels, a 0-d loss
        kernels.call_typed(kern, "cross_entropy", grad.size, dtype, contiguous(x), labels, loss,
                           grad, _scale(reduction, n))
        return result(loss, kern, (x,), _loss_backward, (grad,))
    if len(shape) < 2:
        raise ValueError(f"{op}: logits must be (N, C) or (N, C, d1, ...), got {describe(x)}")
    shape = tuple(shape)
    n, classes, rest = shape[0], shape[1], shape[2:]
    positions = math.prod(rest)
    labels = _labels(kern, target, (n, *rest), classes)
    loss = buffers.take(kern, (), dtype)
    grad = buffers.take(kern, shape, dtype)
    scale = _scale(reduction, n * positions)
    lanes3 = (n, classes, positions)
    kernels.call(kern, "cross_entropy3", grad.size, reshaped(contiguous(x), lanes3),
                 reshaped(labels, (n * positions,)), loss, reshaped(grad, lanes3), scale)
    return result(loss, kern, (x,), _loss_backward, (grad,))


def _labels(kern: Any, target: Any, shape: tuple, classes: int) -> Any:
    """Class indices of ``shape`` as an int64 array on ``kern``'s device, checked first."""
    op = "cross_entropy"
    if isinstance(target, Tensor):
        raise TypeError(f"{op}: target must be integer class indices (a NumPy integer "
                        f"array), got a {target.dtype} Tensor")
    if kern.name != "cpu" and kern.is_device_array(target):
        if target.dtype.kind not in "iu" or tuple(target.shape) != shape:
            raise ValueError(f"{op}: device target must be integers of shape {shape}, got "
                             f"{target.dtype} of shape {target.shape}")
        return target
    host = np.asarray(target)
    if host.dtype.kind not in "iu":
        raise TypeError(f"{op}: target must be integer class indices, got dtype {host.dtype}")
    if host.shape != shape:
        raise ValueError(f"{op}: target has shape {host.shape} but logits of shape "
                         f"{(shape[0], classes, *shape[1:])} need {shape}")
    flat = host if host.ndim == 1 else host.reshape(-1)
    bad = first_bad_label(flat, classes)
    if bad >= 0:
        where = np.unravel_index(bad, shape)
        where = where[0] if len(shape) == 1 else tuple(int(i) for i in where)
        raise ValueError(f"{op}: target[{where}] is class {flat[bad]}, outside "
                         f"[0, {classes}) for logits of shape "
                         f"{(shape[0], classes, *shape[1:])}")
    if kern.name == "cpu":
        return host if host.dtype == np.int64 and host.flags.c_contiguous else _as_int64(host)
    labels = buffers.take(kern, shape, np.int64)
    kernels.call(kern, "upload", 0, host if host.dtype == np.int64 else _as_int64(host), labels)
    return labels


@kernels.host_copy
def _as_int64(host: np.ndarray) -> np.ndarray:
    """A C-contiguous int64 copy of host labels (``ng.compile`` records
    which argument such a copy came from)."""
    return np.ascontiguousarray(host, np.int64)
