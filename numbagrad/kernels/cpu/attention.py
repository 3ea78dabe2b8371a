"""CPU kernels of fused scaled-dot-product attention (``ops/attention.py``).

The forward keeps only the output and each query row's log-sum-exp (lse); the
backward recomputes every probability from q, k, the mask and the lse, so
memory is O(T * d) per head, never O(L * S). Dropout on the probabilities
draws its bits from ``kernels/cpu/random.py``'s counter-based generator: the
forward saves the (seed, counter) it used in ``seeds`` and advances the
generator's counter; the backward regenerates the mask from ``seeds``.

Layout: q (Bq, L, E), k (Bk, S, E), v (Bv, S, Ev), mask (Bm, 1 or L, 1 or S)
added to the scores (a boolean mask arrives as 0 / -inf), out (B, L, Ev), lse
(B, L) float64; ``maps`` (4, B) int64 holds, for each of the B broadcast
batches, its batch in q, k, v and mask. One row task computes one row of
out, dq, dk or dv alone, in a fixed order, so the ``_mt`` twins share rows
among threads and give the serial kernels' bits. ``rows`` builds the row
functions for any jit (the CUDA kernels compile the same ones).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .random import TWO32, generator

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
            if w != 0.0:
                for c in range(out.shape[2]):
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
                if p == 0.0:
                    continue
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
                if p == 0.0:
                    continue
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
_forward_row, _dq_row, _dkv_row = rows(_inline, _stream_key, _element_bits)


@njit(error_model="numpy", inline="always")
def _draw(p, state, seeds):
    """(key, key2, cut) of this call's dropout stream; seeds = state[:2]."""
    seeds[0] = state[0]
    seeds[1] = state[1]
    key, key2 = _stream_key(seeds[0], seeds[1])
    return key, key2, (p * TWO32 if p > 0.0 else -1.0)


@njit(cache=True, error_model="numpy")
def attention(q, k, v, mask, maps, causal, scale, p, keep_scale, state, seeds, out, lse):
    """out = dropout_p(softmax(scale * q k^T + mask, causal)) v per batch and lse
    the rows' log-sum-exp; seeds = state[:2], then state[1] += 1 when p > 0."""
    key, key2, cut = _draw(p, state, seeds)
    for r in range(out.shape[0] * out.shape[1]):
        _forward_row(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out, lse, r)
    if p > 0.0:
        state[1] += _ONE


@njit(cache=True, error_model="numpy", parallel=True)
def attention_mt(q, k, v, mask, maps, causal, scale, p, keep_scale, state, seeds, out, lse):
    """``attention`` with its rows shared among threads (the same bits)."""
    key, key2, cut = _draw(p, state, seeds)
    for r in prange(out.shape[0] * out.shape[1]):
        _forward_row(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out, lse, r)
    if p > 0.0:
        state[1] += _ONE


@njit(error_model="numpy", inline="always")
def _tasks(p, seeds, maps, want_k, want_v):
    """(key, key2, cut, joint): the stream to regenerate, and whether one task
    writes a row of dk and dv together (every batch reads k and v alike)."""
    key, key2 = _stream_key(seeds[0], seeds[1])
    joint = want_k and want_v
    for b in range(maps.shape[1]):
        if maps[1, b] != maps[2, b]:
            joint = False
    return key, key2, (p * TWO32 if p > 0.0 else -1.0), joint


@njit(cache=True, error_model="numpy")
def attention_backward(q, k, v, mask, maps, causal, scale, p, keep_scale, seeds, out, lse, g,
                       dq, dk, dv, beta_q, beta_k, beta_v, want_q, want_k, want_v):
    """dq, dk, dv (each = its gradient + beta * itself, where wanted) of the
    forward that saved out, lse and seeds; g is the output's gradient."""
    key, key2, cut, joint = _tasks(p, seeds, maps, want_k, want_v)
    nq = dq.shape[0] * dq.shape[1] if want_q else 0
    nk = dk.shape[0] * dk.shape[1] if want_k else 0
    nv = dv.shape[0] * dv.shape[1] if want_v and not joint else 0
    for r in range(nq):
        _dq_row(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out, lse, g,
                dq, beta_q, r)
    for r in range(nk):
        _dkv_row(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out, lse, g,
                 dk, dv, beta_k, beta_v, True, joint, 1, r)
    for r in range(nv):
        _dkv_row(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out, lse, g,
                 dk, dv, beta_k, beta_v, False, True, 2, r)


@njit(cache=True, error_model="numpy", parallel=True)
def attention_backward_mt(q, k, v, mask, maps, causal, scale, p, keep_scale, seeds, out, lse, g,
                          dq, dk, dv, beta_q, beta_k, beta_v, want_q, want_k, want_v):
    """``attention_backward`` with its rows shared among threads (the same bits)."""
    key, key2, cut, joint = _tasks(p, seeds, maps, want_k, want_v)
    nq = dq.shape[0] * dq.shape[1] if want_q else 0
    nk = dk.shape[0] * dk.shape[1] if want_k else 0
    nv = dv.shape[0] * dv.shape[1] if want_v and not joint else 0
    for r in prange(nq):
        _dq_row(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out, lse, g,
                dq, beta_q, r)
    for r in prange(nk):
        _dkv_row(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out, lse, g,
                 dk, dv, beta_k, beta_v, True, joint, 1, r)
    for r in prange(nv):
        _dkv_row(q, k, v, mask, maps, causal, scale, cut, keep_scale, key, key2, out, lse, g,
                 dk, dv, beta_k, beta_v, False, True, 2, r)
