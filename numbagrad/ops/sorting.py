"""``sort``, ``argsort``, ``topk``: the order of each lane along a dim comes
from one ``argsort_rows`` kernel (stable; nan sorts as the largest, as
PyTorch), and the values are ``gather``'s, so they are differentiable
exactly as gather is (the gradient goes back to where each value came
from). Indices are int64 NumPy arrays on "cpu" and device arrays on "cuda",
as ``argmax``'s; on "cuda" they pass once through the host to be moved to
their dim (or cut to k), where the kernel wrote them lane by lane.
"""
from __future__ import annotations

import operator
from collections import namedtuple
from typing import Any

import numpy as np

from .. import kernels
from ._common import axis_of, contiguous, describe, operand, reshaped
from .indexing import gather
from .shape import permute

SortResult = namedtuple("sort", ("values", "indices"))
TopkResult = namedtuple("topk", ("values", "indices"))


def _order(x: Any, dim: int, descending: bool, k: int | None, op: str) -> tuple:
    """(values, indices) of the first k (all: None) of each lane along dim."""
    x = operand(x, op, ints=True)
    if not isinstance(descending, (bool, np.bool_)):
        raise TypeError(f"{op}: descending must be a bool, got {descending!r}")
    if x.ndim == 0:
        return x, np.zeros((), np.int64) if x.device == "cpu" else \
            kernels.from_host(x._kern, np.zeros((), np.int64))
    a = axis_of(dim, x.ndim, op, "dim")
    n = x.shape[a]
    if k is not None and not 0 <= k <= n:
        raise ValueError(f"{op}: k={k} is out of range for dim {a} of size {n} "
                         f"(tensor of {describe(x)})")
    last = x.ndim - 1
    perm = tuple(d for d in range(x.ndim) if d != a) + (a,)
    moved = permute(x, *perm) if a != last else x
    kern = moved._kern
    rows = moved.size // n if n else 0
    order = kernels.empty(kern, moved.shape, np.int64)
    if moved.size:
        kernels.call(kern, "argsort_rows", moved.size, reshaped(contiguous(moved), (rows, n)),
                     reshaped(order, (rows, n)), bool(descending))
    if k is not None and k < n:
        order = _on_host(kern, order, lambda h: h[..., :k])
    values = gather(moved, last, order)
    if a == last:
        return values, order
    back = tuple(perm.index(d) for d in range(x.ndim))
    return permute(values, *back), _on_host(kern, order, lambda h: np.transpose(h, back))


def _on_host(kern: Any, order: Any, fn: Any) -> Any:
    """``fn`` applied to the index array ``order`` on the host, C-contiguous,
    on ``kern``'s device again (one round trip on "cuda")."""
    host = np.ascontiguousarray(fn(kernels.to_host(kern, order) if kern.name != "cpu" else order))
    return host if kern.name == "cpu" else kernels.from_host(kern, host)


def sort(x: Any, dim: int = -1, descending: bool = False, stable: bool = False) -> SortResult:
    """The values along ``dim`` in order, and where each came from: the named
    tuple ``(values, indices)`` of ``torch.sort`` (always stable: equal
    values keep their order, which ``stable=False`` also allows; nan sorts
    last ascending, first descending). NumPy's ``np.sort`` gives the values
    only and puts nan last either way."""
    return SortResult(*_order(x, dim, descending, None, "sort"))


def argsort(x: Any, dim: int = -1, descending: bool = False, stable: bool = False) -> Any:
    """``sort``'s indices alone (``torch.argsort``; an index array, no gradient)."""
    return _order(x, dim, descending, None, "argsort")[1]


def topk(x: Any, k: int, dim: int = -1, largest: bool = True, sorted: bool = True  # noqa: A002
         ) -> TopkResult:
    """The k largest (``largest=False``: smallest) values along ``dim`` and
    their indices, as ``torch.topk``, in order (``sorted`` is always honoured;
    ties keep the lower index first). Differentiable through the values."""
    try:
        k = operator.index(k)
    except TypeError:
        raise TypeError(f"topk: k must be an int, got {k!r}") from None
    return TopkResult(*_order(x, dim, bool(largest), k, "topk"))

