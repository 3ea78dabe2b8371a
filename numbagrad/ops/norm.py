"""Normalisation ops (``layer_norm``, ``group_norm``, ``batch_norm``), each
forward beside its backward.

Each runs one fused kernel forward (statistics, normalisation and the affine
weight and bias together; the mean and rstd are saved in float64) and one
backward, which writes the input, weight and bias gradients together, each
straight into its destination (beta=1 adds into a param's accumulator).
CUDA launches: 1 per forward and 1 per backward for a C-contiguous input
(a strided one adds its copy), 1 per gradient written where two of the
inputs are the same tensor. A layer norm is a group norm of one group.

With gradient accumulation (``accumulate_steps=k``) a batch norm in training
uses each micro-batch's statistics, as PyTorch does (pytorch#46516): k
micro-batches are not the full batch, and the running statistics are
updated once per micro-batch. Layer and group norm normalise each example
on its own, so for them k micro-batches give the full batch's gradients.
"""
from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from .. import buffers, kernels
from ..tape import Node, _Backward
from ..tensor import Tensor
from ._common import contiguous, describe, is_scalar, ones, operand, pair, reshaped, result


def _eps(eps: Any, op: str, x: Tensor) -> float:
    if not is_scalar(eps) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"{op}: eps must be a finite real number >= 0, got {eps!r} (input of "
                         f"{describe(x)})")
    return float(eps)


def _affine(x: Tensor, t: Any, shape: tuple, op: str, what: str) -> Tensor | None:
    """The weight or bias ``t`` (None, or a tensor of ``shape`` on x's device
    with x's dtype)."""
    if t is None:
        return None
    _, t = pair(x, t, op, ("input", what), promote=False)
    if t.shape != shape:
        raise ValueError(f"{op}: {what} of {describe(t)} must have shape {shape} for the "
                         f"input of {describe(x)}")
    return t


def _inputs(x: Tensor, weight: Tensor | None, bias: Tensor | None) -> tuple:
    return (x,) + tuple(t for t in (weight, bias) if t is not None)


def _backward_calls(ctx: _Backward, node: Node, shapes: tuple, dummies: tuple,
                    launch: Any) -> None:
    """``launch(arrays, betas, need)`` for the gradients to write, (dx, dw, db)
    each: a destination of ``shapes[i]`` (an unwanted one is ``dummies[i]``,
    never touched), its beta and whether it is written. One call for all, or
    one per gradient where two inputs are the same tensor (so their sums
    never race)."""
    x, has_w, has_b = node.inputs[0], node.saved[-2], node.saved[-1]
    slots = [(x, 0)]
    if has_w:
        slots.append((node.inputs[1], 1))
    if has_b:
        slots.append((node.inputs[1 + has_w], 2))
    wanted = [(t, i) for t, i in slots if t.requires_grad]
    distinct = len({id(t) for t, _ in wanted}) == len(wanted)
    for group in ([wanted] if distinct else [[w] for w in wanted]):
        arrays, betas, need = list(dummies), [0.0] * 3, [False] * 3
        for t, i in group:
            dest, beta = ctx.dest(t)
            arrays[i], betas[i], need[i] = reshaped(dest, shapes[i]), beta, True
        launch(arrays, betas, need)


# ------------------------------------------------------- group and layer norm
def _group_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
                shape4: tuple, affine2: tuple) -> Tensor:
    """x seen as ``shape4`` = (N, G, K, S) normalised per (n, g); the weight
    and bias seen as ``affine2`` = (G, K)."""
    kern, dtype = x._kern, x._data.dtype
    x4 = reshaped(contiguous(x), shape4)
    # stands in for an absent weight, bias or unwanted gradient: never touched
    dummy2 = reshaped(x4, (shape4[0] * shape4[1] * shape4[2], shape4[3]))
    w2 = dummy2 if weight is None else reshaped(contiguous(weight), affine2)
    b2 = dummy2 if bias is None else reshaped(contiguous(bias), affine2)
    out = buffers.take(kern, x.shape, dtype)
    mean = buffers.take(kern, shape4[:2], np.float64)
    rstd = buffers.take(kern, shape4[:2], np.float64)
    kernels.call(kern, "group_norm", x.size, x4, w2, b2, reshaped(out, shape4), mean, rstd, eps,
                 weight is not None, bias is not None)
    return result(out, kern, _inputs(x, weight, bias), _group_norm_backward,
                  (x4, w2, dummy2, mean, rstd, weight is not None, bias is not None))


def _group_norm_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    x4, w2, dummy2, mean, rstd, has_w, _ = node.saved
    kern = node.inputs[0]._kern
    shape4 = tuple(x4.shape)
    g4 = ones(kern, shape4, x4.dtype) if gout is None else reshaped(gout, shape4)
    affine2 = tuple(w2.shape) if has_w else shape4[1:3]

    def launch(arrays: list, betas: list, need: list) -> None:
        kernels.call(kern, "group_norm_backward", x4.size, x4, w2, g4, mean, rstd, arrays[0],
                     betas[0], need[0], arrays[1], betas[1], need[1], arrays[2], betas[2],
                     need[2], has_w)
    _backward_calls(ctx, node, (shape4, affine2, affine2), (x4, dummy2, dummy2), launch)


def layer_norm(x: Any, normalized_shape: Any, weight: Any = None, bias: Any = None,
               eps: float = 1e-5) -> Tensor:
    """PyTorch's ``F.layer_norm``: x normalised over its trailing dims
    ``normalized_shape`` (an int or a tuple of ints) by their mean and biased
    variance, (x - mean) / sqrt(var + eps), times ``weight`` plus ``bias``
    (each None or of shape ``normalized_shape``). Each example is normalised
    on its own, so accumulated micro-batches equal the full batch."""
    op = "layer_norm"
    x = operand(x, op)
    items = tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list)) \
        else (normalized_shape,)
    try:
        if any(isinstance(n, (bool, np.bool_)) for n in items):
            raise TypeError
        shape = tuple(operator.index(n) for n in items)
    except TypeError:
        raise TypeError(f"{op}: normalized_shape must be an int or a tuple of ints, got "
                        f"{normalized_shape!r}") from None
    if not shape:
        raise ValueError(f"{op}: normalized_shape must have at least 1 dim, got () (input of "
                         f"{describe(x)})")
    if len(shape) > x.ndim or x.shape[x.ndim - len(shape):] != shape:
        raise ValueError(f"{op}: normalized_shape {shape} does not match the last dims of the "
                         f"input of {describe(x)}")
    weight = _affine(x, weight, shape, op, "weight")
    bias = _affine(x, bias, shape, op, "bias")
    eps = _eps(eps, op, x)
    d = math.prod(shape)
    rows = math.prod(x.shape[:x.ndim - len(shape)])
    return _group_norm(x, weight, bias, eps, (rows, 1, d, 1), (1, d))


def group_norm(x: Any, num_groups: int, weight: Any = None, bias: Any = None,
               eps: float = 1e-5) -> Tensor:
    """PyTorch's ``F.group_norm``: x (N, C, *) with its C channels split into
    ``num_groups`` groups, each example's group normalised by its mean and
    biased variance, then times ``weight`` plus ``bias`` per channel (each
    None or of shape (C,)). Each example is normalised on its own, so
    accumulated micro-batches equal the full batch."""
    op = "group_norm"
    x = operand(x, op)
    if x.ndim < 2:
        raise ValueError(f"{op}: input must have at least 2 dims (N, C, *), got {describe(x)}")
    if isinstance(num_groups, (bool, np.bool_)) or not isinstance(num_groups,
                                                                  (int, np.integer)) \
            or num_groups < 1:
        raise ValueError(f"{op}: num_groups must be a positive int, got {num_groups!r}")
    groups, channels = int(num_groups), x.shape[1]
    if channels % groups:
        raise ValueError(f"{op}: num_groups={groups} must divide the input's {channels} "
                         f"channels (input of {describe(x)})")
    weight = _affine(x, weight, (channels,), op, "weight")
    bias = _affine(x, bias, (channels,), op, "bias")
    eps = _eps(eps, op, x)
    return _group_norm(x, weight, bias, eps,
                       (x.shape[0], groups, channels // groups, math.prod(x.shape[2:])),
                       (groups, channels // groups))


# ----------------------------------------------------------------- batch norm
def _running(x: Tensor, stat: Any, op: str, what: str) -> Any:
    """``stat`` (a tensor or a device array of x's device: a module's buffer)
    as the C-contiguous (C,) array of x's dtype the kernel updates in place."""
    channels = x.shape[1]
    if isinstance(stat, Tensor):
        if stat.requires_grad:
            raise ValueError(f"{op}: {what} must not require a gradient ({describe(stat)})")
        if stat._kern is not x._kern:
            raise ValueError(f"{op}: {what} is on {stat.device}, the input on {x.device}")
        data = stat._data
    elif x._kern.is_device_array(stat):
        data = stat
    else:
        raise TypeError(f"{op}: {what} must be None, a tensor or an array on the input's "
                        f"device ({x.device}), got {type(stat).__name__}")
    if tuple(data.shape) != (channels,) or data.dtype != x.dtype:
        raise ValueError(f"{op}: {what} (shape {tuple(data.shape)}, {data.dtype}) must have "
                         f"shape ({channels},) and dtype {x.dtype} for the input of "
                         f"{describe(x)}")
    if not x._kern.is_c_contiguous(data) or (isinstance(data, np.ndarray)
                                              and not data.flags.writeable):
        raise ValueError(f"{op}: {what} must be a writeable C-contiguous array (it is "
                         "updated in place)")
    return data


def batch_norm(x: Any, running_mean: Any, running_var: Any, weight: Any = None,
               bias: Any = None, training: bool = False, momentum: float = 0.1,
               eps: float = 1e-5) -> Tensor:
    """PyTorch's ``F.batch_norm`` on x (N, C) or (N, C, *): each channel
    normalised over the batch and the other dims, then times ``weight`` plus
    ``bias`` (each None or (C,)). ``training``: by the batch's mean and biased
    variance, and ``running_mean`` / ``running_var`` (the module's buffers: C
    values on x's device with x's dtype, or None) are updated in place,
    running = (1 - momentum) * running + momentum * batch statistic, with
    the UNBIASED variance, as PyTorch; else by the running statistics.

    With ``accumulate_steps=k`` the statistics are per micro-batch, as in
    PyTorch (pytorch#46516): k micro-batches are not the full batch, and
    the running statistics see each micro-batch. Where the exact k-micro ==
    full-batch promise matters, use ``layer_norm`` or ``group_norm``.
    """
    return _batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps,
                       None, "batch_norm")


def _batch_norm(x: Any, running_mean: Any, running_var: Any, weight: Any, bias: Any,
                training: bool, momentum: float, eps: float, count: Any, op: str) -> Tensor:
    """``batch_norm``; ``count`` (an int64 0-d tensor: num_batches_tracked, or
    None) is incremented in the same kernel, so compiled steps count too."""
    x = operand(x, op)
    if x.ndim < 2:
        raise ValueError(f"{op}: input must be (N, C) or (N, C, *), got {describe(x)}")
    if not isinstance(training, (bool, np.bool_)):
        raise TypeError(f"{op}: training must be a bool, got {training!r}")
    if not is_scalar(momentum) or not 0.0 <= momentum <= 1.0:
        raise ValueError(f"{op}: momentum must be a real number in [0, 1], got {momentum!r}")
    eps = _eps(eps, op, x)
    if training and eps == 0.0:   # as PyTorch: a constant channel would divide 0 by 0
        raise ValueError(f"{op}: eps must be positive during training, got {eps!r} (input "
                         f"of {describe(x)})")
    if (running_mean is None) != (running_var is None):
        raise ValueError(f"{op}: give both running_mean and running_var or neither")
    if running_mean is None and not training:
        raise ValueError(f"{op}: running_mean and running_var are needed when not training "
                         f"(input of {describe(x)})")
    rmean = None if running_mean is None else _running(x, running_mean, op, "running_mean")
    rvar = None if running_var is None else _running(x, running_var, op, "running_var")
    channels = x.shape[1]
    weight = _affine(x, weight, (channels,), op, "weight")
    bias = _affine(x, bias, (channels,), op, "bias")
    per_channel = x.size // channels if channels else 0
    if training and per_channel == 1:
        raise ValueError(f"{op}: expected more than 1 value per channel when training, got "
                         f"input of {describe(x)}")
    kern, dtype = x._kern, x._data.dtype
    shape3 = (x.shape[0], channels, math.prod(x.shape[2:]))
    x3 = reshaped(contiguous(x), shape3)
    dummy1 = reshaped(x3, (x.size,))     # an absent weight, bias or statistic: never touched
    w1 = dummy1 if weight is None else contiguous(weight)
    b1 = dummy1 if bias is None else contiguous(bias)
    update = training and rmean is not None and per_channel > 0
    out = buffers.take(kern, x.shape, dtype)
    mean = buffers.take(kern, (channels,), np.float64)
    rstd = buffers.take(kern, (channels,), np.float64)
    counter = buffers.take(kern, (), np.int64) if count is None else count._data
    kernels.call(kern, "batch_norm", x.size, x3, w1, b1, reshaped(out, shape3), mean, rstd,
                 dummy1 if rmean is None else rmean, dummy1 if rvar is None else rvar, counter,
                 float(momentum), eps, bool(training), weight is not None, bias is not None,
                 update, count is not None and training)
    return result(out, kern, _inputs(x, weight, bias), _batch_norm_backward,
                  (x3, w1, dummy1, mean, rstd, bool(training), weight is not None,
                   bias is not None))


def _batch_norm_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    x3, w1, dummy1, mean, rstd, training, has_w, _ = node.saved
    kern = node.inputs[0]._kern
    shape3 = tuple(x3.shape)
    g3 = ones(kern, shape3, x3.dtype) if gout is None else reshaped(gout, shape3)
    channels = (shape3[1],)

    def launch(arrays: list, betas: list, need: list) -> None:
        kernels.call(kern, "batch_norm_backward", x3.size, x3, w1, g3, mean, rstd, training,
                     has_w, arrays[0], betas[0], need[0], arrays[1], betas[1], need[1],
                     arrays[2], betas[2], need[2])
    _backward_calls(ctx, node, (shape3, channels, channels), (x3, dummy1, dummy1), launch)
