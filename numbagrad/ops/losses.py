"""Losses: each forward computes the loss and its input gradient in one fused
kernel; the backward hands that gradient on (scaled when the loss feeds
further ops, say ``mse + 0.01 * reg``).

Targets are differentiated as PyTorch differentiates them: a float target
that requires a gradient (a param, or an op's output inside a tape) gets
it through the per-element losses' kernels (``_pointwise``); the integer
class indices of ``cross_entropy`` and ``nll_loss`` get none."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import buffers, kernels
from ..kernels import codes
from ..kernels.cpu.losses import first_bad_label, label_message
from ..tape import Node, _Backward, output
from ..tape import _state as _tape_state
from ..tensor import Tensor
from ._common import (_F32, _F64, check_reduction, contiguous, describe, index_data, is_scalar,
                      kept_copy, mean_scale, ones, operand, pair, reshaped, result, scalar_of)
from .indexing import _note_checked, _note_unreplayable

_HOST = buffers.HOST
# (dtype, ndim) -> the CPU mse kernel's specialisation (kernels.hot_table)
_HOT_MSE = kernels.hot_table()


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
    PyTorch), ``"sum"`` adds them, ``"none"`` gives the per-element losses.
    One fused kernel computes the loss and, for the backward pass, the
    residual gradient. A target that requires a gradient gets PyTorch's,
    minus the input's: -2 (pred - target) times the reduction's scale (1/N
    for "mean") and the output's gradient.
    """
    if isinstance(target, Tensor) and target.requires_grad and _tape_state.box[0] > 0:
        return _pointwise(codes.SQUARED, pred, target, reduction, 0.0, "mse_loss")
    if reduction != "mean":
        if reduction == "none":
            return _pointwise(codes.SQUARED, pred, target, reduction, 0.0, "mse_loss")
        check_reduction("mse_loss", reduction)
    # The common case (a contiguous pred, and a target of the same device,
    # dtype and shape, or a matching host array on the CPU) skips `pair`.
    fast = False
    if type(pred) is Tensor:
        pd, kern = pred._data, pred._kern
        td = target._data if type(target) is Tensor and target._kern is kern else \
            (target if kern.name == "cpu" and type(target) is np.ndarray else None)
        if td is not None:
            dtype, shape = pd.dtype, pd.shape
            fast = (dtype is _F32 or dtype is _F64) and td.dtype is dtype \
                and type(shape) is tuple and td.shape == shape and kern.is_c_contiguous(pd) \
                and kern.is_c_contiguous(td)
    if not fast:
        pred, pd, td = _mse_operands(pred, target)
        kern, dtype, shape = pred._kern, pd.dtype, pred.shape
    n = pd.size
    key = (dtype, len(shape))
    if kern is _HOST and n <= buffers.FRESH and kernels._observer is None:
        loss, resid = buffers.fresh((), dtype), buffers.fresh(shape, dtype)
        mse = _HOT_MSE.get(key) if n < _HOST.MT_MIN else None
    else:
        loss, resid = buffers.take(kern, (), dtype), buffers.take(kern, shape, dtype)
        mse = None
    if mse is None:
        mse = kernels.typed(kern, "mse", n, key, _HOT_MSE)
    # _scale(reduction, n), inline
    scale = 1.0 if reduction == "sum" else (1.0 / n if n else math.nan)
    # pd, td and resid: C-contiguous of one rank and dtype; loss: 0-d; a float
    mse(pd, td, loss, resid, scale)
    # result(loss, kern, (pred,), _loss_backward, (resid,)), inline
    if pred.requires_grad and _tape_state.box[0] > 0:
        return output(loss, kern, loss, _loss_backward, (pred,), (resid,))
    return output(loss, kern, loss)


def _mse_operands(pred: Any, target: Any) -> tuple[Tensor, Any, Any]:
    """``mse_loss``'s checked operands: pred as a Tensor, and pred's and
    target's data, C-contiguous (copies where strided)."""
    pred, target = pair(pred, target, "mse_loss", ("pred", "target"), promote=False)
    if pred._data.shape != target._data.shape:
        raise ValueError(f"mse_loss: pred shape {pred._data.shape} and target shape "
                         f"{target._data.shape} differ")
    return pred, contiguous(pred), contiguous(target)


def binary_cross_entropy_with_logits(logits: Any, target: Any,
                                     reduction: str = "mean") -> Tensor:
    """PyTorch's ``F.binary_cross_entropy_with_logits``: the sigmoid and the
    binary cross-entropy in one stable formula (fine for logits of +-1000).
    ``target`` holds probabilities in [0, 1], same shape as ``logits``; the
    mean over no elements is nan, as PyTorch. A target that requires a
    gradient gets PyTorch's, -logits times the reduction's scale (1/N for
    "mean") and the output's gradient."""
    if reduction == "none" or (isinstance(target, Tensor) and target.requires_grad
                               and _tape_state.box[0] > 0):
        return _pointwise(codes.LOGITS_BCE, logits, target, reduction, 0.0,
                          "binary_cross_entropy_with_logits")
    check_reduction("binary_cross_entropy_with_logits", reduction)
    x, t = pair(logits, target, "binary_cross_entropy_with_logits", ("logits", "target"),
                promote=False)
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


def cross_entropy(logits: Any, target: Any, reduction: str = "mean", ignore_index: int = -100,
                  label_smoothing: float = 0.0) -> Tensor:
    """PyTorch's ``F.cross_entropy`` for logits (N, C) or (N, C, d1, ...) and
    integer class indices ``target`` (N,) or (N, d1, ...): log-softmax and
    negative log-likelihood fused in one stable kernel, whose backward is
    softmax minus one-hot; the mean is over every (sample, position). The
    mean over nothing is nan, as PyTorch.

    PyTorch's options, with its formulas: targets equal to ``ignore_index``
    add nothing and the mean is over the others (nan when all are ignored);
    ``label_smoothing`` = e mixes the target with the uniform distribution,
    (1 - e) * nll + e * mean over classes of -log p; ``reduction="none"``
    gives the per-(sample, position) losses, 0 where ignored. These run as
    the composition log_softmax, gather, mean and products (a few kernels
    each way); the default call, with no target ignored, is the fused kernel.

    ``target`` is a NumPy integer array on either device (on "cuda" it is
    uploaded once per call; a label outside [0, C) that is not
    ``ignore_index`` raises ValueError before anything runs) or, on "cuda", a
    Numba device array of integers (no upload; its values are not read on the
    host, so none is taken as ``ignore_index``: the kernel checks that each
    lies in [0, C), negative ones included, and a bad one raises IndexError
    naming it once the kernel has run, after one 4-byte read back; nothing is
    read or written outside the logits). With positions (d1, ...), the kernel
    reads the logits in place as (N, C, d1 * ...), the classes at stride
    d1 * ..., and writes the gradient in their layout: one launch either way.

    The target gets no gradient (class indices are integers, as in
    PyTorch). A float ``target`` of the logits' shape holds class
    probabilities instead, PyTorch's other form: -sum over classes of
    target * log_softmax(logits), smoothed as target (1 - e) + e / C, the
    mean over every (sample, position); ``ignore_index`` does not apply, and
    a target that requires a gradient gets -log_softmax's (composed ops).
    """
    target = index_data(target)     # an int64 tensor: its array
    op = "cross_entropy"
    if reduction != "mean":
        check_reduction(op, reduction)
    if type(ignore_index) is not int:
        ignore_index = _ignore_index(op, ignore_index)
    if label_smoothing != 0.0 and not (is_scalar(label_smoothing) and 0.0 <= label_smoothing <= 1.0):
        raise ValueError(f"{op}: label_smoothing must be a number in [0, 1], got "
                         f"{label_smoothing!r}")
    x = operand(logits, op, "logits")
    if _probabilities(target, x.shape):
        return _cross_entropy_soft(x, target, reduction, float(label_smoothing))
    kern, shape, dtype = x._kern, x._data.shape, x._data.dtype
    if reduction == "none" or label_smoothing != 0.0 \
            or (len(shape) >= 2 and 0 <= ignore_index < shape[1]):   # a class is ignored
        return _cross_entropy_composed(x, target, reduction, ignore_index, label_smoothing)
    try:
        return _cross_entropy_fused(x, kern, shape, dtype, target, reduction, ignore_index)
    except _Ignored:
        return _cross_entropy_composed(x, target, reduction, ignore_index, 0.0)


def _probabilities(target: Any, shape: tuple) -> bool:
    """Whether ``target`` is cross_entropy's float form: class probabilities,
    of the logits' ``shape`` (any other float target is refused as class
    indices of the wrong dtype)."""
    dtype = getattr(target, "dtype", None)
    return dtype is not None and np.dtype(dtype).kind == "f" \
        and tuple(getattr(target, "shape", ())) == tuple(shape)


def _cross_entropy_soft(x: Tensor, target: Any, reduction: str, smoothing: float) -> Tensor:
    from . import reductions
    op = "cross_entropy"
    if x.ndim < 2:
        raise ValueError(f"{op}: logits must be (N, C) or (N, C, d1, ...), got {describe(x)}")
    t = pair(x, target, op, ("logits", "target"), promote=False)[1]   # (x's shape: _probabilities)
    if smoothing:
        t = t * (1.0 - smoothing) + smoothing / x.shape[1]
    per = -reductions.sum(t * reductions.log_softmax(x, 1), axis=1)
    if reduction == "none":
        return per
    return reductions.sum(per) if reduction == "sum" else reductions.mean(per)


def _nll_loss_positions(x: Tensor, target: Any, reduction: str, ignore_index: int) -> Tensor:
    from . import shape as shape_ops
    want = (x.shape[0],) + x.shape[2:]
    if isinstance(target, np.ndarray) and target.shape != want:
        raise ValueError(f"nll_loss: target has shape {target.shape} but log_probs of shape "
                         f"{x.shape} need {want}")
    if isinstance(target, np.ndarray) and target.dtype.kind in "iu":
        # checked here, so the error names the caller's position and shapes
        _check_nll_labels(target, x.shape, ignore_index)
    rows = shape_ops.reshape(shape_ops.permute(x, 0, *range(2, x.ndim), 1), (-1, x.shape[1]))
    flat = target.reshape(-1) if isinstance(target, np.ndarray) else target
    loss = nll_loss(rows, flat, reduction, ignore_index)
    return shape_ops.reshape(loss, want) if reduction == "none" else loss


def _check_nll_labels(target: np.ndarray, shape: tuple, ignore_index: int) -> None:
    """A ValueError naming the first label of ``target`` (integers) outside
    [0, C) and not ``ignore_index``, for log_probs of ``shape`` (N, C, ...)."""
    classes = shape[1]
    bad = np.flatnonzero((target != ignore_index) & ((target < 0) | (target >= classes)))
    if bad.size:
        where = ", ".join(str(int(i)) for i in np.unravel_index(bad[0], target.shape))
        raise ValueError(f"nll_loss: target[{where}] is class {target.reshape(-1)[bad[0]]}, "
                         f"outside [0, {classes}) for log_probs of shape {shape} (and not "
                         f"ignore_index {ignore_index})")


class _Ignored(Exception):
    """A host target holds ``ignore_index``: the fused kernel cannot take it."""


def _ignore_index(op: str, value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{op}: ignore_index must be an int, got {value!r}")
    return int(value)


def _cross_entropy_fused(x: Tensor, kern: Any, shape: tuple, dtype: Any, target: Any,
                         reduction: str, ignore_index: int) -> Tensor:
    op = "cross_entropy"
    if len(shape) == 2:
        n, classes = shape
        labels, source = _labels(kern, target, (n,), classes, ignore_index)
        loss = buffers.take(kern, (), dtype)
        grad = buffers.take(kern, shape, dtype)
        # C-contiguous logits and gradient of one dtype, int64 labels, a 0-d loss
        kernels.typed(kern, "cross_entropy", grad.size, dtype)(contiguous(x), labels, loss,
                                                               grad, _scale(reduction, n),
                                                               *source)
        return result(loss, kern, (x,), _loss_backward, (grad,))
    if len(shape) < 2:
        raise ValueError(f"{op}: logits must be (N, C) or (N, C, d1, ...), got {describe(x)}")
    shape = tuple(shape)
    n, classes, rest = shape[0], shape[1], shape[2:]
    positions = math.prod(rest)
    labels, source = _labels(kern, target, (n, *rest), classes, ignore_index)
    loss = buffers.take(kern, (), dtype)
    grad = buffers.take(kern, shape, dtype)
    scale = _scale(reduction, n * positions)
    lanes3 = (n, classes, positions)
    kernels.call(kern, "cross_entropy3", grad.size, reshaped(contiguous(x), lanes3),
                 reshaped(labels, (n * positions,)), loss, reshaped(grad, lanes3), scale,
                 *source)
    return result(loss, kern, (x,), _loss_backward, (grad,))


def _labels(kern: Any, target: Any, shape: tuple, classes: int, ignore: int | None = None
            ) -> tuple:
    """Class indices of ``shape`` as an int64 array on ``kern``'s device, host
    ones checked first (``_Ignored`` when a host target holds ``ignore``), and
    the extra arguments of the kernel's launch: ``(target,)`` for CUDA device
    labels, whose range the kernel checks, else none."""
    op = "cross_entropy"
    if isinstance(target, Tensor):
        raise TypeError(f"{op}: target must be integer class indices (a NumPy integer "
                        f"array), got a {target.dtype} Tensor")
    if kern.name != "cpu" and kern.is_device_array(target):
        if target.dtype.kind not in "iu" or tuple(target.shape) != shape:
            raise ValueError(f"{op}: device target must be integers of shape {shape}, got "
                             f"{target.dtype} of shape {target.shape}")
        return target, (target,)
    host = np.asarray(target)
    if host.dtype.kind not in "iu":
        soft = " (a float target holds class probabilities, in the logits' shape)" \
            if host.dtype.kind == "f" else ""
        raise TypeError(f"{op}: target must be integer class indices, got dtype {host.dtype} "
                        f"of shape {host.shape}{soft}")
    if host.shape != shape:
        raise ValueError(f"{op}: target has shape {host.shape} but logits of shape "
                         f"{(shape[0], classes, *shape[1:])} need {shape}")
    flat = host if host.ndim == 1 else host.reshape(-1)
    bad = first_bad_label(flat, classes)
    if bad >= 0 and ignore is not None and flat[bad] == ignore:
        raise _Ignored
    if bad >= 0:
        raise ValueError(label_message(op, host, bad, classes, (shape[0], classes, *shape[1:])))
    checked = host if host.dtype == np.int64 and (kern.name != "cpu" or host.flags.c_contiguous) \
        else _as_int64(host)
    if kernels._observer is not None:
        _note_checked(checked, 0, classes)
    if kern.name == "cpu":
        return checked, ()
    labels = buffers.take(kern, shape, np.int64)
    kernels.call(kern, "upload", 0, checked, labels)
    return labels, ()


@kernels.host_copy
def _as_int64(host: np.ndarray) -> np.ndarray:
    """A C-contiguous int64 copy of host labels (``ng.compile`` records
    which argument such a copy came from)."""
    return np.ascontiguousarray(host, np.int64)


def _cross_entropy_composed(x: Tensor, target: Any, reduction: str, ignore: int,
                            smoothing: float) -> Tensor:
    """``cross_entropy`` with ``reduction="none"``, ``label_smoothing`` or an
    ignored target, as PyTorch computes it, from differentiable ops."""
    from . import elementwise as ew, indexing, reductions, shape as shape_ops
    op = "cross_entropy"
    shape = tuple(x.shape)
    if len(shape) < 2:
        raise ValueError(f"{op}: logits must be (N, C) or (N, C, d1, ...), got {describe(x)}")
    n, classes, rest = shape[0], shape[1], shape[2:]
    kern, dtype = x._kern, x._data.dtype
    if kern.name != "cpu" and kern.is_device_array(target):   # checked by gather's kernel
        _labels(kern, target, (n, *rest), classes)
        valid = None
        index = target
    else:
        host = np.asarray(target)
        if isinstance(target, Tensor) or host.dtype.kind not in "iu":
            _labels(kern, target, (n, *rest), classes)   # raises, naming the problem
        if host.dtype != np.int64 or not host.flags.c_contiguous:
            host = _as_int64(host)    # (a copy ng.compile re-makes from the argument)
        valid = host != ignore
        # with nothing ignored the labels are used as they are, so a compiled
        # step reads each call's (and runs one that holds ignore_index eagerly);
        # with some ignored, the mask, the safe labels and the count below are
        # this call's own constants: a step recorded so runs eagerly, or, when
        # this call ignores every label, replays only calls that do too
        everything = bool(valid.all())
        safe = host if everything else np.where(valid, host, 0)
        _labels(kern, safe, (n, *rest), classes)          # shape and range, checked
        if kernels._observer is not None:
            if everything:
                _note_checked(host, 0, classes, exclude=ignore)
            elif valid.any():
                _note_unreplayable("cross_entropy's target holds ignore_index")
            else:
                _note_checked(host, ignore, ignore, allow=ignore)
        index = safe
    lp = reductions.log_softmax(x, axis=1)
    picked = indexing._gather(lp, 1, index.reshape((n, 1) + rest), op)
    per = ew.neg(shape_ops.reshape(picked, (n,) + rest))
    if smoothing:
        smooth = ew.neg(reductions.mean(lp, axis=1))
        per = ew.add(ew.mul(per, 1.0 - smoothing), ew.mul(smooth, float(smoothing)))
    count = n * math.prod(rest)
    if valid is not None and not valid.all():
        weights = valid.astype(dtype)
        per = ew.mul(per, weights if kern.name == "cpu" else
                     Tensor(kernels.from_host(kern, weights), kern))
        count = int(valid.sum())
    if reduction == "none":
        return per
    total = reductions.sum(per)
    if reduction == "sum":
        return total
    if count == 0:   # PyTorch: a nan loss, and zero gradients (a window is not lost)
        return ew.add(ew.mul(total, 0.0), math.nan)
    return ew.mul(total, mean_scale(count))


# ------------------------------------------- issue 17: more losses, reduction="none"
# (cross_entropy and mse_loss above take "mean" and "sum" only, for now)
def _flat(array: Any) -> Any:
    return reshaped(array, (array.size,))


def _pointwise(code: int, pred: Any, target: Any, reduction: str, p: float, op: str) -> Tensor:
    reduce = check_reduction(op, reduction)
    x, t = pair(pred, target, op, ("input", "target"), promote=False)
    if x.shape != t.shape:
        raise ValueError(f"{op}: input shape {x.shape} and target shape {t.shape} differ "
                         "(no broadcasting, as mse_loss)")
    kern, dtype = x._kern, x._data.dtype
    xd, td = contiguous(x), contiguous(t)
    if code == codes.BCE and kern.name == "cpu" and xd.size and \
            not (np.all(xd >= 0) and np.all(xd <= 1)):
        raise ValueError(f"{op}: every input element must be a probability in [0, 1] "
                         f"(input {describe(x)} has {xd.min()} .. {xd.max()}); for logits use "
                         "binary_cross_entropy_with_logits")
    out = buffers.take(kern, () if reduce else x.shape, dtype)
    scale = _scale(reduction, x.size) if reduce else 1.0
    kernels.call(kern, "loss_terms", x.size, code, _flat(xd), _flat(td), _flat(out), reduce,
                 scale, scalar_of(dtype, p))
    return result(out, kern, (x, t), _pointwise_backward, (code, xd, td, scale, p, out.shape))


def _pointwise_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    code, xd, td, scale, p, shape = node.saved
    for wrt_target, x in enumerate(node.inputs):   # (input, target): each that needs it
        if not x.requires_grad:
            continue
        kern = x._kern
        g = ones(kern, shape, xd.dtype) if gout is None else gout
        dest, beta = ctx.dest(x)
        kernels.call(kern, "loss_terms_backward", dest.size, code, _flat(xd), _flat(td),
                     _flat(g), _flat(dest), scale, scalar_of(xd.dtype, p), beta,
                     bool(wrt_target))


def l1_loss(input: Any, target: Any, reduction: str = "mean") -> Tensor:  # noqa: A002
    """|input - target|, PyTorch's ``F.l1_loss`` (gradient 0 where they are
    equal); ``reduction`` "mean", "sum" or "none" (the per-element losses).
    Same shapes. A target that requires a gradient gets PyTorch's, minus
    the input's: -sign(input - target) times the reduction's scale and the
    output's gradient."""
    return _pointwise(codes.L1, input, target, reduction, 0.0, "l1_loss")


def smooth_l1_loss(input: Any, target: Any, reduction: str = "mean",  # noqa: A002
                   beta: float = 1.0) -> Tensor:
    """PyTorch's ``F.smooth_l1_loss``: 0.5 d^2 / beta where |d| < beta, else
    |d| - 0.5 beta (d = input - target; beta = 0 is l1_loss); see ``l1_loss``.
    A target that requires a gradient gets minus the input's, as PyTorch."""
    op = "smooth_l1_loss"
    if not is_scalar(beta) or not beta >= 0:
        raise ValueError(f"{op}: beta must be a real number >= 0, got {beta!r}")
    if beta == 0:
        return _pointwise(codes.L1, input, target, reduction, 0.0, op)
    return _pointwise(codes.SMOOTH_L1, input, target, reduction, float(beta), op)


def huber_loss(input: Any, target: Any, reduction: str = "mean",  # noqa: A002
               delta: float = 1.0) -> Tensor:
    """PyTorch's ``F.huber_loss``: 0.5 d^2 where |d| < delta, else
    delta (|d| - 0.5 delta); see ``l1_loss``. A target that requires a
    gradient gets minus the input's, as PyTorch."""
    op = "huber_loss"
    if not is_scalar(delta) or not delta > 0:
        raise ValueError(f"{op}: delta must be a real number > 0, got {delta!r}")
    return _pointwise(codes.HUBER, input, target, reduction, float(delta), op)


def binary_cross_entropy(input: Any, target: Any, reduction: str = "mean") -> Tensor:  # noqa: A002
    """PyTorch's ``F.binary_cross_entropy`` of probabilities ``input``:
    -(t log(x) + (1 - t) log(1 - x)), each log clamped at -100, its gradient's
    denominator x (1 - x) at 1e-12. Inputs outside [0, 1] are an error on the
    CPU (checked on the host; on "cuda" they are not read back: nan or
    garbage). See ``l1_loss`` for shapes and ``reduction``. A target that
    requires a gradient gets PyTorch's, (log(1 - x) - log(x)) times the
    reduction's scale and the output's gradient, unclamped (+-inf at x = 0
    or 1, as PyTorch)."""
    return _pointwise(codes.BCE, input, target, reduction, 0.0, "binary_cross_entropy")


def nll_loss(log_probs: Any, target: Any, reduction: str = "mean",
             ignore_index: int = -100) -> Tensor:
    """PyTorch's ``F.nll_loss`` for log-probabilities (N, C) and integer class
    indices ``target`` (N,) (a NumPy integer array, uploaded on "cuda"), or
    (N, C, d1, ...) and (N, d1, ...) (the classes moved last, one (N * d1 *
    ..., C) call; "none" gives the (N, d1, ...) losses):
    -log_probs[i, target[i]], 0 where target[i] == ignore_index; "mean"
    divides by the count of targets not ignored (nan when all are), as
    PyTorch, "none" gives the (N,) losses. The target (integers) gets no
    gradient, as in PyTorch."""
    target = index_data(target)
    op = "nll_loss"
    reduce = check_reduction(op, reduction)
    x = operand(log_probs, op, "log_probs")
    if x.ndim > 2:
        return _nll_loss_positions(x, target, reduction, ignore_index)
    if x.ndim != 2:
        raise ValueError(f"{op}: log_probs must be (N, C) or (N, C, d1, ...), got {describe(x)}")
    if isinstance(ignore_index, (bool, np.bool_)) or not isinstance(ignore_index,
                                                                     (int, np.integer)):
        raise TypeError(f"{op}: ignore_index must be an int, got {ignore_index!r}")
    n, classes = x.shape
    if isinstance(target, Tensor) or not isinstance(target, np.ndarray) \
            or target.dtype.kind not in "iu":
        raise TypeError(f"{op}: target must be a NumPy integer array of class indices, got "
                        f"{type(target).__name__} {getattr(target, 'dtype', '')}")
    if target.shape != (n,):
        raise ValueError(f"{op}: target has shape {target.shape} but log_probs of shape "
                         f"{(n, classes)} need ({n},)")
    _check_nll_labels(target, (n, classes), ignore_index)
    kern, dtype = x._kern, x._data.dtype
    host = target if target.dtype == np.int64 and target.flags.c_contiguous \
        else _as_int64(target)
    if kernels._observer is not None:
        _note_checked(host, 0, classes, allow=int(ignore_index))
    if kern.name == "cpu":
        labels = kept_copy(host, target)     # (the backward reads them again)
    else:
        labels = buffers.take(kern, (n,), np.int64)
        kernels.call(kern, "upload", 0, host, labels)
    out = buffers.take(kern, () if reduce else (n,), dtype)
    count = buffers.take(kern, (1,), dtype)
    mean = reduction == "mean"
    kernels.call(kern, "nll", x.size, contiguous(x), labels, _flat(out), count, reduce, mean,
                 int(ignore_index))
    return result(out, kern, (x,), _nll_backward,
                  (labels, count, reduce, mean, int(ignore_index), out.shape))


def _nll_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    labels, count, reduce, mean, ignore, shape = node.saved
    kern = x._kern
    g = ones(kern, shape, x._data.dtype) if gout is None else gout
    dest, beta = ctx.dest(x)
    kernels.call(kern, "nll_backward", dest.size, labels, _flat(g), count, dest, reduce, mean,
                 ignore, beta)
