"""Fused scaled-dot-product attention: one kernel forward, one backward.

The forward keeps only the output and each query row's log-sum-exp; the
backward recomputes the probabilities (``kernels/cpu/attention.py``), so an
attention over T keys costs O(T * d) memory per head, not the O(T**2) of a
materialised score matrix. Dropout on the probabilities draws from
numbagrad's generator (``ng.manual_seed``): the forward saves the seed and
counter it used (two words) and the backward regenerates the same mask.
"""
from __future__ import annotations

import functools
import math
from types import ModuleType
from typing import Any

import numba
import numpy as np

from .. import buffers, kernels, tape
from .. import random as _random
from ..tape import Node, _Backward
from ..tensor import Tensor
from ._common import (broadcast_shape, contiguous, describe, is_scalar, ones, operand, reshaped,
                      result)
from .masks import astype, where

_OP = "scaled_dot_product_attention"
BLOCK = 32    # query rows per CPU task: the scratch is BLOCK x S per thread


@functools.lru_cache(maxsize=64)
def _maps(kern: ModuleType, batch: tuple, *shapes: tuple) -> Any:
    """(len(shapes), prod(batch)) int64 on ``kern``'s device: for each batch of
    the broadcast ``batch`` shape, its flat batch index in each operand of
    batch shape ``shapes`` (NumPy broadcasting). Made once per shape key."""
    rows = [np.broadcast_to(np.arange(math.prod(s)).reshape((1,) * (len(batch) - len(s)) + s),
                            batch).ravel() for s in shapes]
    return kernels.from_host(kern, np.array(rows, np.int64).reshape(len(shapes), -1))


@functools.lru_cache(maxsize=8)
def _zeros(kern: ModuleType, dtype: np.dtype) -> Any:
    """A (1, 1, 1) zero of ``dtype``: the absent mask, and the stand-in for a
    gradient nobody wants (never written)."""
    return kernels.from_host(kern, np.zeros((1, 1, 1), dtype))


def _mask(mask: Any, q: Tensor, full: tuple) -> Tensor:
    """``attn_mask`` as an additive float tensor of q's dtype and device
    (a boolean mask: 0 where True, -inf where False), checked to broadcast to
    ``full`` = batch + (L, S)."""
    kern = q._kern
    if not isinstance(mask, Tensor):
        if kern.is_device_array(mask):
            mask = Tensor(mask, kern)
        else:
            array = np.asarray(mask)
            if kern.name != "cpu":
                raise ValueError(f"{_OP}: attn_mask is host data (shape {array.shape}) but the "
                                 f"query is on {kern.name}; pass a tensor on that device")
            if array.dtype not in (np.bool_, q.dtype):
                raise TypeError(f"{_OP}: attn_mask must be boolean or of the query's dtype "
                                f"{q.dtype}, got {array.dtype} (query of {describe(q)})")
            mask = Tensor(np.ascontiguousarray(array), kern)
    if mask._data.dtype not in (np.bool_, q.dtype):
        raise TypeError(f"{_OP}: attn_mask must be boolean or of the query's dtype {q.dtype}, "
                        f"got a tensor of {describe(mask)}")
    if mask._kern is not kern:
        raise ValueError(f"{_OP}: attn_mask is on {mask.device} but the query is on "
                         f"{kern.name} (query of {describe(q)})")
    try:
        fits = len(mask.shape) <= len(full) and broadcast_shape(mask.shape, full, _OP) == full
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"{_OP}: attn_mask of shape {mask.shape} does not broadcast to "
                         f"(..., L, S) = {full}")
    if mask.requires_grad and tape._state.depth > 0:
        raise NotImplementedError(f"{_OP}: attn_mask gets no gradient here; pass a tensor "
                                  "that does not require one")
    if mask._data.dtype == np.bool_:
        mask = astype(where(mask, 0.0, -math.inf), q.dtype)
    return mask


def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention``:
    ``dropout(softmax(q @ k^T * scale + mask)) @ v`` for q (..., L, E),
    k (..., S, E), v (..., S, Ev) -> (..., L, Ev), batch dims broadcast.
    ``attn_mask`` is boolean (True takes part) or of q's dtype (added; it
    gets no gradient), broadcastable to (..., L, S); ``is_causal`` keeps key j
    for query i where j <= i (PyTorch's top-left alignment) and, as in
    PyTorch, refuses an ``attn_mask`` too; ``scale`` defaults to 1/sqrt(E).
    A query row with every key masked gives zeros (and zero gradients), as
    PyTorch does; a nan score, or a +inf one (from an inf in q or k, or
    ``scale=inf``), makes its row nan, and its gradients, as PyTorch's. ``dropout_p`` > 0 drops probabilities with numbagrad's
    generator (always: like PyTorch's function this takes no ``training``)."""
    q = operand(query, _OP, "query")
    k = operand(key, _OP, "key")
    v = operand(value, _OP, "value")
    for name, t in (("key", k), ("value", v)):
        if t._kern is not q._kern:
            raise ValueError(f"{_OP}: query is on {q.device} but {name} on {t.device} "
                             f"(query of {describe(q)}, {name} of {describe(t)})")
        if t.dtype != q.dtype:
            raise TypeError(f"{_OP}: dtypes differ: query {describe(q)}, {name} {describe(t)}")
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.ndim < 2:
            raise ValueError(f"{_OP}: {name} must have at least 2 dims (..., T, d), got "
                             f"{describe(t)}")
    (L, E), (S, Ek), (Sv, Ev) = q.shape[-2:], k.shape[-2:], v.shape[-2:]
    if Ek != E:
        raise ValueError(f"{_OP}: query and key must have the same embedding size E (last "
                         f"dim): query {describe(q)}, key {describe(k)}")
    if Sv != S:
        raise ValueError(f"{_OP}: key and value must have the same length S (dim -2): key "
                         f"{describe(k)}, value {describe(v)}")
    try:
        batch = broadcast_shape(broadcast_shape(q.shape[:-2], k.shape[:-2], _OP), v.shape[:-2],
                                _OP)
    except ValueError:
        raise ValueError(f"{_OP}: the batch dims of query {q.shape}, key {k.shape} and value "
                         f"{v.shape} do not broadcast together") from None
    if not is_scalar(dropout_p) or not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"{_OP}: dropout_p must be a probability in [0, 1], got {dropout_p!r}")
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"{_OP}: is_causal must be a bool, got {is_causal!r}")
    if scale is not None and not is_scalar(scale):
        raise TypeError(f"{_OP}: scale must be a number or None, got {scale!r}")
    if is_causal and attn_mask is not None:
        raise ValueError(f"{_OP}: an explicit attn_mask should not be set when is_causal=True "
                         "(as PyTorch); pass one of them")
    kern, dtype = q._kern, q._data.dtype
    if attn_mask is None:
        mask3, mask_batch = _zeros(kern, dtype), ()
    else:
        m = _mask(attn_mask, q, batch + (L, S))
        shape = (1,) * (len(batch) + 2 - m.ndim) + m.shape
        mask_batch = shape[:-2]
        mask3 = reshaped(contiguous(m), (math.prod(mask_batch),) + shape[-2:])
    q3, k3, v3 = (reshaped(contiguous(t), (math.prod(t.shape[:-2]),) + t.shape[-2:])
                  for t in (q, k, v))
    maps = _maps(kern, batch, q.shape[:-2], k.shape[:-2], v.shape[:-2], mask_batch)
    b = math.prod(batch)
    out = buffers.take(kern, batch + (L, Ev), dtype)
    out3 = reshaped(out, (b, L, Ev))
    lse = buffers.take(kern, (b, L), np.float64)
    seeds = buffers.take(kern, (2,), np.uint64)
    p = float(dropout_p)
    keep = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    sc = float(scale) if scale is not None else (1.0 / math.sqrt(E) if E else math.inf)
    args = (q3, k3, v3, mask3, maps, bool(is_causal), sc, p, keep)
    size = b * L * S * (E + Ev)
    kernels.call(kern, "attention", size, *args, _random.state(kern), seeds, out3, lse,
                 _work(kern, size, 1, S, dtype), BLOCK)
    return result(out, kern, (q, k, v), _backward, (args, seeds, out3, lse, size))


def _work(kern: ModuleType, size: int, per_slot: int, s: int, dtype: Any) -> Any:
    """The kernels' scratch: ``per_slot`` (BLOCK, S) blocks for each thread the
    call may run on (one when ``kernels.call`` picks the serial kernel)."""
    slots = numba.config.NUMBA_NUM_THREADS if size >= kern.MT_MIN else 1
    return buffers.take(kern, (slots * per_slot, max(1, BLOCK * s)), dtype)


def _backward(ctx: _Backward, node: Node, gout: Any) -> None:
    args, seeds, out3, lse, size = node.saved
    kern = node.inputs[0]._kern
    dtype = out3.dtype
    if gout is None:
        gout = ones(kern, out3.shape, dtype)
    g3 = reshaped(gout, out3.shape)
    dests = []
    for t, x3 in zip(node.inputs, args[:3]):
        if t.requires_grad:
            dest, beta = ctx.dest(t)
            dests.append((dest, reshaped(dest, x3.shape), beta))
        else:
            dests.append(None)
    # One call writes every wanted gradient, unless two of them share an array
    # (attention(x, x, x)): then one call each, in order, each adding to the last.
    calls, batch = [], []
    for i, d in enumerate(dests):
        if d is None:
            continue
        if any(dests[j][0] is d[0] for j in batch):
            calls.append(batch)
            batch = []
        batch.append(i)
    calls.append(batch)
    zero = _zeros(kern, dtype)
    work = _work(kern, size, 2, args[1].shape[1], dtype)
    for batch in calls:
        grads = [dests[i][1] if i in batch else zero for i in range(3)]
        betas = [dests[i][2] if i in batch else 0.0 for i in range(3)]
        kernels.call(kern, "attention_backward", size, *args, seeds, out3, lse, g3, *grads,
                     *betas, *(i in batch for i in range(3)), work, BLOCK)
