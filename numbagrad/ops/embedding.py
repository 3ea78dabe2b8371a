"""Embedding lookups: ``embedding`` selects rows with ``index_select`` (one
launch) and writes the weight's gradient with one ``embedding_backward``,
which skips the padding row.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import buffers, kernels
from ..tape import Node, _Backward
from ..tensor import Tensor
from ._common import describe, ones, operand, reshaped, result
from .indexing import _grouped, _indices


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
