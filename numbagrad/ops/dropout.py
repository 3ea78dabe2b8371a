"""Dropout and embedding lookups.

``dropout`` draws its mask on the device from numbagrad's counter-based
generator (``numbagrad/random.py``): one launch forward (mask and output
together), one backward. ``embedding`` selects rows with ``index_select``
(one launch) and writes the weight's gradient with one
``embedding_backward``, which skips the padding row.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import buffers, kernels
from .. import random as _random
from ..tape import Node, _Backward
from ..tensor import Tensor
from ._common import contiguous, describe, is_scalar, ones, operand, reshaped, result
from .indexing import _grouped, _indices


def _flat(array: Any) -> Any:
    return reshaped(array, (math.prod(array.shape),))


def dropout(x: Any, p: float = 0.5, training: bool = True, *,
            generator: np.random.Generator | None = None) -> Tensor:
    """``torch.nn.functional.dropout``: each element is zeroed with probability
    ``p`` and the kept ones are scaled by 1 / (1 - p); ``p == 0``, ``training=
    False`` and an empty ``x`` return ``x`` itself (as PyTorch), ``p == 1``
    zeros. The mask comes from numbagrad's generator (``ng.manual_seed``,
    ``ng.random.get_state``), advanced on the device by every call, so
    compiled steps draw fresh masks too. ``generator=`` (a NumPy Generator)
    draws the call's seed from it on the host instead: that generator is the
    caller's to save and restore. A compiled step (``ng.compile``) cannot
    replay such a host-side draw, so its first verification call raises
    ``GraphChangedError``: compiled steps use numbagrad's generator."""
    op = "dropout"
    x = operand(x, op)
    if not is_scalar(p) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{op}: p must be a probability in [0, 1], got {p!r} (input of "
                         f"{describe(x)})")
    if not isinstance(training, (bool, np.bool_)):
        raise TypeError(f"{op}: training must be a bool, got {training!r}")
    if generator is not None and not isinstance(generator, np.random.Generator):
        raise TypeError(f"{op}: generator must be a NumPy Generator "
                        f"(np.random.default_rng(seed)) or None, got {type(generator).__name__}")
    if not training or p == 0 or x.size == 0:
        return x
    kern, dtype = x._kern, x._data.dtype
    state = _random.state(kern) if generator is None else _random.drawn_state(kern, generator)
    out = buffers.take(kern, x.shape, dtype)
    mask = buffers.take(kern, x.shape, dtype)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - float(p))
    kernels.call(kern, "dropout", out.size, _flat(contiguous(x)), _flat(out), _flat(mask), state,
                 float(p), scale)
    return result(out, kern, (x,), _dropout_backward, (mask,))


def _dropout_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    (mask,) = node.saved
    kern = x._kern
    if gout is None:
        gout = ones(kern, x.shape, x._data.dtype)
    dest, beta = ctx.dest(x)
    kernels.call(kern, "dropout_backward", dest.size, _flat(gout), _flat(mask), _flat(dest),
                 beta)


def embedding(idx: Any, weight: Any, padding_idx: int | None = None) -> Tensor:
    """``torch.nn.functional.embedding``: ``weight[idx]``, rows of a (num, dim)
    ``weight`` for integer ``idx`` of any shape (a NumPy array or list, or on
    "cuda" a Numba device array), shape ``idx.shape + (dim,)``. Indices must
    lie in [0, num): any other, a negative one too (as in PyTorch, unlike
    NumPy's indexing), raises IndexError, host indices before anything runs,
    a device array's once the selecting kernel has run (it reads nothing
    outside the weight). The gradient adds repeated indices up, and the
    ``padding_idx`` row (negative counts from the end) gets none."""
    op = "embedding"
    weight = operand(weight, op, "weight")
    if weight.ndim != 2:
        raise ValueError(f"{op}: weight must be 2-D (num_embeddings, embedding_dim), got "
                         f"{describe(weight)}")
    num, dim = weight.shape
    pad = -1
    if padding_idx is not None:
        if isinstance(padding_idx, (bool, np.bool_)) or not isinstance(padding_idx,
                                                                       (int, np.integer)):
            raise TypeError(f"{op}: padding_idx must be an int or None, got {padding_idx!r}")
        if not -num <= padding_idx < num:
            raise ValueError(f"{op}: padding_idx {padding_idx} is out of range for "
                             f"{num} embeddings (expected [{-num}, {num - 1}])")
        pad = int(padding_idx) % num
    kern = weight._kern
    index, check = _indices(kern, idx, op, 0, num, 0)
    m = math.prod(index.shape)
    flat = reshaped(index, (m,))
    shape = tuple(index.shape) + (dim,)
    out = buffers.take(kern, shape, weight.dtype)
    kernels.call(kern, "index_select", out.size, _grouped(kern, weight._data, 0), flat,
                 reshaped(out, (1, m, dim)), *check)
    return result(out, kern, (weight,), _embedding_backward, (flat, shape, pad))


def _embedding_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (weight,) = node.inputs
    flat, shape, pad = node.saved
    kern = weight._kern
    if gout is None:
        gout = ones(kern, shape, weight._data.dtype)
    dest, beta = ctx.dest(weight)
    kernels.call(kern, "embedding_backward", dest.size, reshaped(gout, (flat.shape[0],
                                                                        shape[-1])),
                 flat, dest, beta, pad)
