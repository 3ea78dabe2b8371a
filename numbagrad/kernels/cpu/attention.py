"""CPU kernels of fused scaled-dot-product attention (``ops/attention.py``).

The forward keeps only the output and each query row's log-sum-exp (lse); the
backward recomputes the probabilities from q, k, the mask and the lse, so
memory is O(T * d) per head plus one (block, S) scratch per thread, never
O(L * S). Dropout on the probabilities draws its bits from
``kernels/cpu/random.py``'s counter-based generator: the forward saves the
(seed, counter) it used in ``seeds`` and advances the generator's counter;
the backward regenerates the mask from ``seeds``.

Layout: q (Bq, L, E), k (Bk, S, E), v (Bv, S, Ev), mask (Bm, 1 or L, 1 or S)
added to the scores (a boolean mask arrives as 0 / -inf), out (B, L, Ev), lse
(B, L) float64; ``maps`` (4, B) int64 holds, for each of the B broadcast
batches, its batch in q, k, v and mask. The CPU works on blocks of ``block``
query rows with the BLAS (``matmul.gemm``): scores, softmax, then the
products. A block's result does not depend on which thread computes it, so
the ``_mt`` twins give the serial kernels' bits. ``rows`` builds the
one-row-per-thread functions the CUDA kernels compile.
"""
from __future__ import annotations

__all__ = ["attention", "attention_backward"]   # the kernels this module registers

import math

import numpy as np
from numba import njit, prange

from .matmul import _set_blas_threads
from .matmul import gemm as _gemm
from ._threads import _cast_like
from .random import TWO32, generator
from .vmath import exp_shifted

_ONE = np.uint64(1)


def rows(jit, stream_key, element_bits):
    """(forward_row, dq_row, dkv_row) compiled with ``jit`` (njit or a CUDA
    device jit), drawing dropout bits with ``element_bits``."""
    @jit
    def score(q, k, mask, qb, kb, mb, i, j, scale):
        acc = 0.0
        for c in range(q.shape[2]):
            acc += q[qb, i, c] * k[kb, j, c]
        mi = i if mask.shape[1] > 1 else 0
        mj = j if mask.shape[2] > 1 else 0
        return acc * scale + mask[mb, mi, mj]

    @jit
    def dot(a, ab, ai, b, bb, bi):
        acc = 0.0
        for c in range(a.shape[2]):
            acc += a[ab, ai, c] * b[bb, bi, c]
        return acc

    @jit
    def kept(cut, keep_scale, key, key2, n):
        """Dropout's factor for probability n: 1 without dropout (cut < 0)."""
        if cut < 0.0:
            return 1.0
        return keep_scale if element_bits(key, key2, np.uint64(n)) >= cut else 0.0

    @jit
    def forward_row(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out,
                    lse, r):
        big_l, big_s = q.shape[1], k.shape[1]
        b, i = r // big_l, r % big_l
        qb, kb, vb, mb = maps[0, b], maps[1, b], maps[2, b], maps[3, b]
        stop = min(big_s, i + 1) if causal else big_s
        peak, total = -math.inf, 0.0
        for j in range(stop):       # an online max and sum of exp(score - max)
            s = score(q, k, mask, qb, kb, mb, i, j, scale)
            if s != s or s == math.inf:   # the row is nan, as PyTorch's
                peak, total = math.nan, 1.0
                break
            if s > peak:
                total = total * math.exp(peak - s) + 1.0
                peak = s
            elif s > -math.inf:
                total += math.exp(s - peak)
        for c in range(out.shape[2]):
            out[b, i, c] = 0.0
        if peak == -math.inf:       # every key masked: a zero row, as PyTorch
            lse[b, i] = -math.inf
            return
        ls = peak + math.log(total)
        lse[b, i] = ls
        base = (b * big_l + i) * big_s
        for j in range(stop):
            w = math.exp(score(q, k, mask, qb, kb, mb, i, j, scale) - ls)
            w *= kept(cut, keep_scale, key, key2, base + j)
            for c in range(out.shape[2]):   # (w = 0 too: 0 * inf is nan, as the CPU's GEMM)
                out[b, i, c] += w * v[vb, j, c]

    @jit
    def dq_row(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out, lse, g,
               dq, beta, r):
        big_l, big_s = q.shape[1], k.shape[1]
        qb, i = r // big_l, r % big_l
        for c in range(q.shape[2]):
            dq[qb, i, c] = 0.0 if beta == 0.0 else beta * dq[qb, i, c]
        stop = min(big_s, i + 1) if causal else big_s
        for b in range(maps.shape[1]):
            ls = lse[b, i]
            if maps[0, b] != qb or ls == -math.inf:
                continue
            kb, vb, mb = maps[1, b], maps[2, b], maps[3, b]
            delta = dot(g, b, i, out, b, i)      # sum_j P_ij Z_ij (g_i . v_j)
            base = (b * big_l + i) * big_s
            for j in range(stop):
                p = math.exp(score(q, k, mask, qb, kb, mb, i, j, scale) - ls)
                z = kept(cut, keep_scale, key, key2, base + j)
                dp = z * dot(g, b, i, v, vb, j) if z != 0.0 else 0.0
                ds = p * (dp - delta) * scale
                for c in range(q.shape[2]):
                    dq[qb, i, c] += ds * k[kb, j, c]

    @jit
    def dkv_row(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out, lse, g,
                dk, dv, beta_k, beta_v, want_k, want_v, which, r):
        """Row r of dk (which == 1; also of dv when want_v: k and v batches
        coincide) or of dv (which == 2)."""
        big_l, big_s = q.shape[1], k.shape[1]
        xb, j = r // big_s, r % big_s
        if want_k:
            for c in range(k.shape[2]):
                dk[xb, j, c] = 0.0 if beta_k == 0.0 else beta_k * dk[xb, j, c]
        if want_v:
            for c in range(v.shape[2]):
                dv[xb, j, c] = 0.0 if beta_v == 0.0 else beta_v * dv[xb, j, c]
        start = j if causal else 0
        for b in range(maps.shape[1]):
            if maps[which, b] != xb:
                continue
            qb, kb, vb, mb = maps[0, b], maps[1, b], maps[2, b], maps[3, b]
            for i in range(start, big_l):
                ls = lse[b, i]
                if ls == -math.inf:
                    continue
                p = math.exp(score(q, k, mask, qb, kb, mb, i, j, scale) - ls)
                z = kept(cut, keep_scale, key, key2, (b * big_l + i) * big_s + j)
                if want_v and z != 0.0:
                    pz = p * z
                    for c in range(v.shape[2]):
                        dv[vb, j, c] += pz * g[b, i, c]
                if want_k:
                    dp = z * dot(g, b, i, v, vb, j) if z != 0.0 else 0.0
                    ds = p * (dp - dot(g, b, i, out, b, i)) * scale
                    for c in range(k.shape[2]):
                        dk[kb, j, c] += ds * q[qb, i, c]

    return forward_row, dq_row, dkv_row


_inline = njit(error_model="numpy", inline="always")
_stream_key, _element_bits = generator(_inline)


@_inline
def _kept(cut, keep_scale, key, key2, n):
    if cut < 0.0:
        return 1.0
    return keep_scale if _element_bits(key, key2, np.uint64(n)) >= cut else 0.0


@_inline
def _probabilities(q, k, mask, maps, causal, scale, lse, sv, b, i0, n, cols, write_lse):
    """sv (n, cols) = the softmax of query rows i0..i0+n of batch b over the
    first ``cols`` keys (one GEMM for the scores); the rows' log-sum-exp is
    written to ``lse`` (write_lse) or read from it. Exponentials are taken
    of the difference in the data's dtype (one per probability; float32's by
    vmath's vectorisable exp)."""
    qb, kb, mb = maps[0, b], maps[1, b], maps[3, b]
    _gemm(q[qb, i0:i0 + n], k[kb, :cols], sv, False, True, scale, 0.0)
    for r in range(n):
        i = i0 + r
        stop = min(cols, i + 1) if causal else cols
        mi = i if mask.shape[1] > 1 else 0
        if mask.size != 1 or mask[0, 0, 0] != 0.0:     # (no mask: a single 0)
            for j in range(stop):
                sv[r, j] += mask[mb, mi, j if mask.shape[2] > 1 else 0]
        if write_lse:
            peak = -math.inf
            for j in range(stop):     # a nan score makes the row nan, as PyTorch's
                if sv[r, j] > peak or sv[r, j] != sv[r, j]:
                    peak = sv[r, j]
            lse[b, i] = peak
        ls = lse[b, i]
        if ls == -math.inf:            # every key masked: a zero row, as PyTorch
            stop = 0
        elif write_lse:
            row, top, total = sv[r, :stop], _cast_like(sv, ls), 0.0
            exp_shifted(row, top)
            for j in range(stop):     # (apart: the exponentials' loop vectorises)
                total += row[j]
            lse[b, i] = ls + math.log(total)
            inv = _cast_like(sv, 1.0 / total)
            for j in range(stop):
                sv[r, j] *= inv
        else:
            exp_shifted(sv[r, :stop], _cast_like(sv, ls))
        for j in range(stop, cols):
            sv[r, j] = 0.0


@_inline
def _forward_block(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out, lse,
                   sv, t, block):
    """Task t: rows (t % blocks) * block.. of batch t // blocks."""
    big_l, big_s = q.shape[1], k.shape[1]
    blocks = (big_l + block - 1) // block
    b, i0 = t // blocks, (t % blocks) * block
    n = min(block, big_l - i0)
    cols = min(big_s, i0 + n) if causal else big_s
    p = sv[:n * cols].reshape((n, cols))
    _probabilities(q, k, mask, maps, causal, scale, lse, p, b, i0, n, cols, True)
    if cut >= 0.0:
        for r in range(n):
            base = (b * big_l + i0 + r) * big_s
            for j in range(cols):
                p[r, j] *= _kept(cut, keep_scale, key, key2, base + j)
    _gemm(p, v[maps[2, b], :cols], out[b, i0:i0 + n], False, False, 1.0, 0.0)


@njit(cache=True, error_model="numpy")
def attention(q, k, v, mask, maps, causal, scale, p, keep_scale, state, seeds, out, lse, work,
              block):
    """out = dropout_p(softmax(scale * q k^T + mask, causal)) v per batch and lse
    the rows' log-sum-exp; seeds = state[:2], then state[1] += 1 when p > 0.
    ``work`` (slots, block * S): the scores of one block of query rows per slot."""
    key, key2, cut = _draw(p, state, seeds)
    tasks = out.shape[0] * ((out.shape[1] + block - 1) // block)
    for t in range(tasks):
        _forward_block(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out, lse,
                       work[0], t, block)
    if p > 0.0:
        state[1] += _ONE


@njit(cache=True, error_model="numpy", parallel=True)
def attention_mt(q, k, v, mask, maps, causal, scale, p, keep_scale, state, seeds, out, lse,
                 work, block):
    """``attention`` with its blocks shared among the ``work`` slots' threads."""
    key, key2, cut = _draw(p, state, seeds)
    tasks = out.shape[0] * ((out.shape[1] + block - 1) // block)
    slots = work.shape[0]
    previous = _set_blas_threads(1)   # the workers' GEMMs then leave the count alone
    for w in prange(slots):
        for t in range(w, tasks, slots):
            _forward_block(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out,
                           lse, work[w], t, block)
    _set_blas_threads(previous)
    if p > 0.0:
        state[1] += _ONE


@_inline
def _draw(p, state, seeds):
    """(key, key2, cut) of this call's dropout stream; seeds = state[:2]."""
    seeds[0] = state[0]
    seeds[1] = state[1]
    key, key2 = _stream_key(seeds[0], seeds[1])
    return key, key2, (p * TWO32 if p > 0.0 else -1.0)


@_inline
def _scaled(dest, beta):
    """dest = beta * dest (beta == 0 never reads dest)."""
    for x in range(dest.shape[0]):
        for y in range(dest.shape[1]):
            for c in range(dest.shape[2]):
                dest[x, y, c] = 0.0 if beta == 0.0 else beta * dest[x, y, c]


@_inline
def _backward_batch(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out, lse, g,
                    dq, dk, dv, want_q, want_k, want_v, sv, tv, b, block):
    """Add batch b's share of dq, dk, dv, one block of query rows at a time."""
    big_l, big_s = q.shape[1], k.shape[1]
    qb, kb, vb = maps[0, b], maps[1, b], maps[2, b]
    for i0 in range(0, big_l, block):
        n = min(block, big_l - i0)
        cols = min(big_s, i0 + n) if causal else big_s
        p = sv[:n * cols].reshape((n, cols))
        d = tv[:n * cols].reshape((n, cols))
        _probabilities(q, k, mask, maps, causal, scale, lse, p, b, i0, n, cols, False)
        gb = g[b, i0:i0 + n]
        if want_v and cut < 0.0:
            _gemm(p, gb, dv[vb, :cols], True, False, 1.0, 1.0)
        elif want_v:
            for r in range(n):
                base = (b * big_l + i0 + r) * big_s
                for j in range(cols):
                    d[r, j] = p[r, j] * _kept(cut, keep_scale, key, key2, base + j)
            _gemm(d, gb, dv[vb, :cols], True, False, 1.0, 1.0)
        if want_q or want_k:
            _gemm(gb, v[vb, :cols], d, False, True, 1.0, 0.0)     # g_i . v_j
            for r in range(n):
                i = i0 + r
                delta = 0.0                  # sum_j P_ij Z_ij (g_i . v_j) = g_i . out_i
                for c in range(out.shape[2]):
                    delta += g[b, i, c] * out[b, i, c]
                base = (b * big_l + i) * big_s
                if cut < 0.0:
                    for j in range(cols):
                        d[r, j] = p[r, j] * (d[r, j] - delta) * scale
                else:
                    for j in range(cols):
                        z = _kept(cut, keep_scale, key, key2, base + j)
                        d[r, j] = p[r, j] * (z * d[r, j] - delta) * scale
            if want_q:
                _gemm(d, k[kb, :cols], dq[qb, i0:i0 + n], False, False, 1.0, 1.0)
            if want_k:
                _gemm(d, q[qb, i0:i0 + n], dk[kb, :cols], True, False, 1.0, 1.0)


@_inline
def _prepare(p, seeds, dq, dk, dv, beta_q, beta_k, beta_v, want_q, want_k, want_v):
    key, key2 = _stream_key(seeds[0], seeds[1])
    if want_q:
        _scaled(dq, beta_q)
    if want_k:
        _scaled(dk, beta_k)
    if want_v:
        _scaled(dv, beta_v)
    return key, key2, (p * TWO32 if p > 0.0 else -1.0)


@njit(cache=True, error_model="numpy")
def attention_backward(q, k, v, mask, maps, causal, scale, p, keep_scale, seeds, out, lse, g,
                       dq, dk, dv, beta_q, beta_k, beta_v, want_q, want_k, want_v, work, block):
    """dq, dk, dv (each = its gradient + beta * itself, where wanted) of the
    forward that saved out, lse and seeds; g is the output's gradient.
    ``work`` (2 * slots, block * S): two (block, S) scratch blocks per slot."""
    key, key2, cut = _prepare(p, seeds, dq, dk, dv, beta_q, beta_k, beta_v, want_q, want_k,
                              want_v)
    for b in range(out.shape[0]):
        _backward_batch(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out, lse,
                        g, dq, dk, dv, want_q, want_k, want_v, work[0], work[1], b, block)


@njit(cache=True, error_model="numpy", parallel=True)
def attention_backward_mt(q, k, v, mask, maps, causal, scale, p, keep_scale, seeds, out, lse, g,
                          dq, dk, dv, beta_q, beta_k, beta_v, want_q, want_k, want_v, work,
                          block):
    """``attention_backward`` with the batches shared among the slots' threads
    when no operand is broadcast (each batch then owns its gradient slices:
    the serial kernel's sums), else the serial order on one thread."""
    key, key2, cut = _prepare(p, seeds, dq, dk, dv, beta_q, beta_k, beta_v, want_q, want_k,
                              want_v)
    batches = out.shape[0]
    own = q.shape[0] == batches and k.shape[0] == batches and v.shape[0] == batches
    slots = work.shape[0] // 2 if own else 1
    previous = _set_blas_threads(1)
    for w in prange(slots):
        for b in range(w, batches, slots):
            _backward_batch(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out,
                            lse, g, dq, dk, dv, want_q, want_k, want_v, work[2 * w],
                            work[2 * w + 1], b, block)
    _set_blas_threads(previous)
