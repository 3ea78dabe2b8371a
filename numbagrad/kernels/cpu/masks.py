"""CPU kernels of the selection ops: comparisons, ``where`` and casts.

Operands are C-contiguous arrays of one rank R >= ``RANK`` (the op pads
shapes with leading 1s); an input whose dim is 1 where the output's is not is
broadcast along it. ``offset`` maps an output element to an input's, and
``joined`` an (unbroadcast, broadcast) pair of counters to an output
element, so ``where``'s gradient is summed one destination element at a
time, in the same order on both devices. The plain-Python helpers here are
jitted by ``kernels/cuda/masks.py`` too.
"""
from __future__ import annotations

__all__ = ["astype", "compare", "where", "where_backward"]   # the kernels this module registers

from numba import njit

LT, LE, GT, GE, EQ, NE = range(6)
N_COMPARE = 6
RANK = 6    # the ops view operands at least this rank: one compile per dtype


def compare_scalar(code, x, y):
    """x <op> y for comparison ``code`` (IEEE: any comparison with nan is
    False except !=)."""
    if code == LT:
        return x < y
    if code == LE:
        return x <= y
    if code == GT:
        return x > y
    if code == GE:
        return x >= y
    if code == EQ:
        return x == y
    if code == NE:
        return x != y
    raise ValueError("compare: unknown op code")


def offset(k, out, x):
    """The flat index in ``x`` of output element ``k`` (C order), ``x``
    broadcast to ``out``'s shape."""
    at = 0
    step = 1
    for d in range(len(out.shape) - 1, -1, -1):
        n = out.shape[d]
        i = k % n
        k //= n
        if x.shape[d] != 1:
            at += i * step
            step *= n
    return at


def joined(j, t, out, dest):
    """The output element whose unbroadcast dims are destination element
    ``j``'s and whose dims broadcast from ``dest`` count ``t`` (C order)."""
    k = 0
    step = 1
    for d in range(len(out.shape) - 1, -1, -1):
        n = out.shape[d]
        if dest.shape[d] == n:
            i = j % n
            j //= n
        else:
            i = t % n
            t //= n
        k += i * step
        step *= n
    return k


_compare = njit(compare_scalar)
_offset = njit(offset)
_joined = njit(joined)


@njit(cache=True, error_model="numpy")
def compare(code, a, b, out, s, b_scalar):
    """out = a <op> b (boolean), or a <op> s when ``b_scalar`` (``b`` unread)."""
    if code < 0 or code >= N_COMPARE:
        raise ValueError("compare: unknown op code")
    o, av, bv = out.ravel(), a.ravel(), b.ravel()
    same_a = a.shape == out.shape
    same_b = b.shape == out.shape
    for k in range(o.size):
        x = av[k if same_a else _offset(k, out, a)]
        y = s if b_scalar else bv[k if same_b else _offset(k, out, b)]
        o[k] = _compare(code, x, y)


@njit(cache=True, error_model="numpy")
def where(cond, a, b, out, sa, sb, mode):
    """out = a where cond else b; ``mode`` bit 1: a is the scalar ``sa``,
    bit 2: b is ``sb`` (that array unread)."""
    o, c, av, bv = out.ravel(), cond.ravel(), a.ravel(), b.ravel()
    same_c, same_a, same_b = cond.shape == out.shape, a.shape == out.shape, b.shape == out.shape
    for k in range(o.size):
        if c[k if same_c else _offset(k, out, cond)]:
            o[k] = sa if mode & 1 else av[k if same_a else _offset(k, out, a)]
        else:
            o[k] = sb if mode & 2 else bv[k if same_b else _offset(k, out, b)]


@njit(cache=True, error_model="numpy")
def where_backward(cond, g, dest, beta, pick):
    """dest = (g where cond == pick, else 0) summed over the dims ``dest``
    broadcasts along, + beta * dest; beta == 0 never reads ``dest``."""
    c, gv, d = cond.ravel(), g.ravel(), dest.ravel()
    n = d.size
    m = g.size // n if n else 0
    for j in range(n):
        total = 0.0    # float64, as sum_to adds
        for t in range(m):
            k = _joined(j, t, g, dest)
            if c[_offset(k, g, cond)] == pick:
                total += gv[k]
        d[j] = total if beta == 0 else total + beta * d[j]


@njit(cache=True, error_model="numpy")
def astype(x, out, beta):
    """out = x cast to out's dtype (+ beta * out), flat arrays of one size."""
    o, xv = out.ravel(), x.ravel()
    if beta == 0:
        for k in range(o.size):
            o[k] = xv[k]
    else:
        for k in range(o.size):
            o[k] = xv[k] + beta * o[k]
