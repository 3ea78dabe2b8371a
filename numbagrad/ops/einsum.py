"""``einsum``, lowered to the ops that have kernels: a repeated index within
one operand is its ``diagonal``, an index only one operand has and the
output lacks is summed first, and each pair of operands is one batched
``matmul`` (batch indices, the left operand's, the contracted ones, the
right operand's), with permutes and reshapes around it. So an einsum is as
differentiable as those ops, on every device, and a contraction runs on the
GEMM kernels. Operands are folded left to right (no path optimisation).
"""
from __future__ import annotations

import math
from typing import Any

from ..tensor import Tensor
from ._common import operand
from .layout import diagonal
from .matmul import matmul
from .reductions import sum as _sum
from .shape import permute, reshape

_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _parse(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """The operands' index strings and the output's, with ``...`` expanded."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"einsum: the equation {equation!r} names {len(terms)} operands, "
                         f"got {len(ranks)}")
    used = set(eq) - set(".,->")
    if not used <= _LETTERS:
        raise ValueError(f"einsum: indices must be letters, got {sorted(used - _LETTERS)} in "
                         f"{equation!r}")
    spare = [c for c in sorted(_LETTERS) if c not in used]
    widest = 0
    for t, r in zip(terms, ranks):
        if t.count("...") > 1 or ("." in t.replace("...", "")):
            raise ValueError(f"einsum: bad ellipsis in {t!r} of {equation!r}")
        widest = max(widest, r - len(t.replace("...", "")) if "..." in t else 0)
    ell = "".join(spare[:widest])
    expanded = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            n = r - len(t.replace("...", ""))
            if n < 0:
                raise ValueError(f"einsum: {t!r} has more indices than its operand's {r} dims")
            t = t.replace("...", ell[widest - n:])
        if len(t) != r:
            raise ValueError(f"einsum: {t!r} names {len(t)} dims, its operand has {r}")
        expanded.append(t)
    if arrow:
        if "..." in out:
            out = out.replace("...", ell)
        if len(set(out)) != len(out) or not set(out) <= set("".join(expanded)):
            raise ValueError(f"einsum: output {out!r} of {equation!r} repeats an index or "
                             "names one no operand has")
    else:      # implicit output: the ellipsis, then the indices seen once, sorted
        counts = "".join(expanded)
        out = ell + "".join(sorted(c for c in set(counts) if counts.count(c) == 1
                                   and c not in ell))
    return expanded, out


def _undiagonal(x: Tensor, idx: str) -> tuple[Tensor, str]:
    """Repeated indices of one operand replaced by their diagonal."""
    while len(set(idx)) != len(idx):
        c = next(c for c in idx if idx.count(c) > 1)
        i = idx.index(c)
        j = idx.index(c, i + 1)
        x = diagonal(x, 0, i, j)          # the diagonal becomes the last dim
        idx = "".join(ch for k, ch in enumerate(idx) if k not in (i, j)) + c
    return x, idx


def _reduce(x: Tensor, idx: str, keep: set) -> tuple[Tensor, str]:
    """Indices not in ``keep`` summed out."""
    gone = tuple(k for k, c in enumerate(idx) if c not in keep)
    if gone:
        x = _sum(x, gone)
        idx = "".join(c for c in idx if c in keep)
    return x, idx


def _arranged(x: Tensor, idx: str, order: str) -> Tensor:
    perm = tuple(idx.index(c) for c in order)
    return x if perm == tuple(range(len(perm))) else permute(x, *perm)


def _contract(a: Tensor, ia: str, b: Tensor, ib: str, keep: set) -> tuple[Tensor, str]:
    """a and b over their shared indices: one batched matmul."""
    batch = "".join(c for c in ia if c in ib and c in keep)
    summed = "".join(c for c in ia if c in ib and c not in keep)
    left = "".join(c for c in ia if c not in ib)
    right = "".join(c for c in ib if c not in ia)
    da, db = dict(zip(ia, a.shape)), dict(zip(ib, b.shape))
    for c in batch + summed:
        if da[c] != db[c]:
            raise ValueError(f"einsum: index {c!r} has size {da[c]} in one operand and "
                             f"{db[c]} in another")
    size = {**da, **db}

    def n(s: str) -> int:
        return math.prod(size[c] for c in s)

    a3 = reshape(_arranged(a, ia, batch + left + summed), (n(batch), n(left), n(summed)))
    b3 = reshape(_arranged(b, ib, batch + summed + right), (n(batch), n(summed), n(right)))
    out = reshape(matmul(a3, b3), tuple(size[c] for c in batch + left + right))
    return out, batch + left + right


def einsum(equation: str, *operands: Any) -> Tensor:
    """Einstein summation, as ``torch.einsum``/``np.einsum``: ``"ij,jk->ik"``,
    ``"bhqd,bhkd->bhqk"``, ``"ii->i"``, ``"...ij->...ji"``, an implicit output
    (the indices seen once, sorted), any number of operands (also given as
    one list). Lowered to diagonals, sums and batched matmuls (see the
    module), so every piece is differentiable on every device."""
    if not isinstance(equation, str):
        raise TypeError(f"einsum: the equation must be a string, got {equation!r}")
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise ValueError("einsum: needs at least one operand")
    ts = [operand(t, "einsum") for t in operands]
    terms, out = _parse(equation, [t.ndim for t in ts])
    pieces = []
    for i, (t, idx) in enumerate(zip(ts, terms)):
        t, idx = _undiagonal(t, idx)
        others = set(out).union(*(terms[j] for j in range(len(ts)) if j != i))
        pieces.append(_reduce(t, idx, others))
    x, ix = pieces[0]
    for k, (y, iy) in enumerate(pieces[1:], 1):
        later = set(out).union(*(p[1] for p in pieces[k + 1:]))
        x, ix = _contract(x, ix, y, iy, later)
    x, ix = _reduce(x, ix, set(out))
    return _arranged(x, ix, out)
