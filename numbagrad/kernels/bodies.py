"""Loop bodies shared by both devices: plain Python, compiled per device.

What one CUDA thread computes is what one iteration of a CPU loop computes,
so it is written once here and compiled by ``kernels/cpu`` with ``njit`` and
by ``kernels/cuda`` with ``cuda.jit(device=True)`` (as ``codes``' formulas
are). The devices only differ in how they walk the elements: blocks of
them on the CPU, a grid-stride loop on CUDA. Each caller passes operands in
the dtype it computes in, so float32 stays float32 and the sums below, which
start from a float64 0.0, stay float64.

Numba's disk cache does not see changes here: delete
``numbagrad/kernels/cpu/__pycache__`` after editing this file.
"""
import math


def reduced_grad(grad_a, grad_b):
    """The element function ``(code, which, a, b, gout, i, j) -> float64``: the sum
    of gout * d(out)/d(operand) over the output elements that read element
    (i, j) of operand ``which`` (0: ``a``, 1: ``b``), both broadcast to
    ``gout``'s shape. ``grad_a``/``grad_b`` are ``codes.binary_grad_a``/``_b``
    as compiled for the device."""
    def reduced_grad(code, which, a, b, gout, i, j):
        src = a if which == 0 else b
        rows, cols = gout.shape
        r0, r1 = (0, rows) if src.shape[0] == 1 else (i, i + 1)
        c0, c1 = (0, cols) if src.shape[1] == 1 else (j, j + 1)
        ba0, ba1 = a.shape[0] == 1, a.shape[1] == 1
        bb0, bb1 = b.shape[0] == 1, b.shape[1] == 1
        total = 0.0   # (not gout[0, 0] * 0: nan for an infinite or absent gout[0, 0])
        for r in range(r0, r1):
            for c in range(c0, c1):
                av = a[0 if ba0 else r, 0 if ba1 else c]
                bv = b[0 if bb0 else r, 0 if bb1 else c]
                d = grad_a(code, av, bv) if which == 0 else grad_b(code, av, bv)
                total += gout[r, c] * d
        return total
    return reduced_grad


def softmax_backward_lane(y, gout, dest, beta, axis, log, lane):
    """dest = J^T gout + beta * dest along one lane (slice ``lane`` along ``axis``)
    of y = softmax(x): y * (g - sum(g * y)); for log_softmax g - exp(y) * sum(g).
    The sum is float64; beta == 0 never reads ``dest``."""
    length = y.shape[axis]
    acc = 0.0
    for k in range(length):
        g = gout[k, lane] if axis == 0 else gout[lane, k]
        acc += g if log else g * (y[k, lane] if axis == 0 else y[lane, k])
    for k in range(length):
        g = gout[k, lane] if axis == 0 else gout[lane, k]
        yv = y[k, lane] if axis == 0 else y[lane, k]
        d = g - math.exp(yv) * acc if log else yv * (g - acc)
        if axis == 0:
            dest[k, lane] = d if beta == 0 else d + beta * dest[k, lane]
        else:
            dest[lane, k] = d if beta == 0 else d + beta * dest[lane, k]


def adam_element(w, g, m, v, step_size, bc2_sqrt, one_m_b1, beta2, one_m_b2, eps, scale,
                 decay):
    """One element of Adam/AdamW (``torch.optim.AdamW``'s arithmetic): the new
    (w, m, v) for weight ``w``, window gradient ``g`` (times ``scale``) and
    moments ``m``, ``v``. ``decay`` is 1 - lr * weight_decay (decoupled), and
    ``step_size``, ``bc2_sqrt`` the param's bias corrections, all in the
    buffers' dtype."""
    gi = scale * g
    mi = m + one_m_b1 * (gi - m)
    vi = v * beta2 + one_m_b2 * gi * gi
    return w * decay - step_size * (mi / (math.sqrt(vi) / bc2_sqrt + eps)), mi, vi


# Lanes of the axis reductions (kernels/*/reduce_axis.py): ``x`` is viewed as
# (outer, n, inner) and lane (o, i) is x[o, :, i]; its result is out[o, i].
# Sums are float64; beta == 0 never reads ``dest``.
def extrema_lane(x, out, idx, want_max, o, i):
    """The max (``want_max``) or min of a lane and the first index holding it;
    nan wins (the first nan), as torch.amax and NumPy."""
    best = x[o, 0, i]
    at = 0
    for k in range(1, x.shape[1]):
        v = x[o, k, i]
        if best == best and (v != v or (v > best if want_max else v < best)):
            best = v
            at = k
    out[o, i] = best
    idx[o, i] = at


def extrema_backward_lane(x, y, gout, dest, beta, o, i):
    """torch.amax's gradient: gout shared evenly by the lane's elements equal
    to its extremum ``y`` (nan ones when it is nan), 0 elsewhere."""
    m = y[o, i]
    nan = m != m
    count = 0
    for k in range(x.shape[1]):
        v = x[o, k, i]
        if v == m or (nan and v != v):
            count += 1
    share = gout[o, i] / count
    for k in range(x.shape[1]):
        v = x[o, k, i]
        d = share if v == m or (nan and v != v) else 0.0
        dest[o, k, i] = d if beta == 0 else d + beta * dest[o, k, i]


def logsumexp_lane(x, out, o, i):
    """log(sum(exp(x))) over a lane, PyTorch's way: the max subtracted first
    unless it is infinite; -inf for an empty lane."""
    m = -math.inf
    for k in range(x.shape[1]):
        if x[o, k, i] > m:
            m = x[o, k, i]
    if m == math.inf or m == -math.inf:
        m = 0.0
    acc = 0.0
    for k in range(x.shape[1]):
        acc += math.exp(x[o, k, i] - m)
    out[o, i] = (-math.inf if acc == 0 else math.log(acc)) + m


def logsumexp_backward_lane(x, y, gout, dest, beta, o, i):
    """dest = gout * exp(x - logsumexp(x)) (softmax) along the lane."""
    g, lse = gout[o, i], y[o, i]
    for k in range(x.shape[1]):
        d = g * math.exp(x[o, k, i] - lse)
        dest[o, k, i] = d if beta == 0 else d + beta * dest[o, k, i]


def variance_lane(x, out, mean, inv_n, inv_div, root, o, i):
    """The lane's mean (into ``mean``) and sum of squared deviations times
    ``inv_div`` (1 / (n - correction)), its square root when ``root``: two passes."""
    s = 0.0
    for k in range(x.shape[1]):
        s += x[o, k, i]
    mu = s * inv_n
    ss = 0.0
    for k in range(x.shape[1]):
        d = x[o, k, i] - mu
        ss += d * d
    v = ss * inv_div
    mean[o, i] = mu
    out[o, i] = math.sqrt(v) if root else v


def variance_backward_lane(x, mean, y, gout, dest, scale, root, beta, o, i):
    """PyTorch's var/std gradient: scale * g * (x - mean), scale = 2 / (n -
    correction), g = gout (var) or gout / (2 std), 0 where std is 0."""
    g = gout[o, i]
    if root:
        g = 0.0 if y[o, i] == 0 else g / (2 * y[o, i])
    c = scale * g
    mu = mean[o, i]
    for k in range(x.shape[1]):
        d = c * (x[o, k, i] - mu)
        dest[o, k, i] = d if beta == 0 else d + beta * dest[o, k, i]


def cumsum_lane(x, out, reverse, beta, o, i):
    """Running float64 sums along the lane (from its end when ``reverse``: the
    gradient of a cumsum)."""
    n = x.shape[1]
    acc = 0.0
    for t in range(n):
        k = n - 1 - t if reverse else t
        acc += x[o, k, i]
        out[o, k, i] = acc if beta == 0 else acc + beta * out[o, k, i]


# ------------------------------------------------------------ scans (kernels/*/scan.py)
def cumprod_lane(x, out, o, i):
    """Running float64 products along the lane."""
    acc = 1.0
    for k in range(x.shape[1]):
        acc *= x[o, k, i]
        out[o, k, i] = acc


def cumprod_backward_lane(x, y, gout, dest, beta, o, i):
    """The gradient of y = cumprod(x) along the lane without dividing by x
    (exact where x is 0, as PyTorch's): dest[k] = y[k - 1] * s[k] with
    s[k] = gout[k] + x[k + 1] * s[k + 1], from the end."""
    n = x.shape[1]
    s = 0.0
    for t in range(n):
        k = n - 1 - t
        if t > 0:
            s *= x[o, k + 1, i]
        s += gout[o, k, i]
        d = s if k == 0 else y[o, k - 1, i] * s
        dest[o, k, i] = d if beta == 0 else d + beta * dest[o, k, i]


def cumextrema_lane(x, out, idx, want_max, o, i):
    """Running max (min) along the lane and where it was taken: ties take
    the later index and nan sticks once seen, a later nan taking over its
    index (a tie), as PyTorch's cummax/cummin."""
    best = 0.0
    at = 0
    for k in range(x.shape[1]):
        v = x[o, k, i]
        if k == 0 or v != v or (best == best and (v >= best if want_max else v <= best)):
            best = v
            at = k
        out[o, k, i] = best
        idx[o, k, i] = at


def cumextrema_backward_lane(idx, gout, dest, beta, o, i):
    """dest = gout added at the indices the values came from + beta * dest."""
    n = idx.shape[1]
    for k in range(n):
        dest[o, k, i] = 0.0 if beta == 0 else beta * dest[o, k, i]
    for k in range(n):
        dest[o, idx[o, k, i], i] += gout[o, k, i]


def log_add(acc, v):
    """log(exp(acc) + exp(v)) in float64 without overflow: the larger plus
    log1p(exp(smaller - larger)); -inf adds nothing, +inf and nan stick."""
    if v != v or acc != acc:
        return math.nan
    hi = acc if acc > v else v
    lo = v if acc > v else acc
    return hi if lo == -math.inf or hi == math.inf else hi + math.log1p(math.exp(lo - hi))


def logcumsumexp_lanes(log_add):
    """The lane bodies ``(logcumsumexp_lane, logcumsumexp_backward_lane)``
    calling ``log_add`` (the function above as compiled for the device)."""
    def logcumsumexp_lane(x, out, o, i):
        """Running log(sum(exp)) along the lane, in float64, one ``log_add``
        a step."""
        acc = -math.inf
        for k in range(x.shape[1]):
            acc = log_add(acc, x[o, k, i])
            out[o, k, i] = acc

    def logcumsumexp_backward_lane(x, y, gout, dest, beta, o, i):
        """PyTorch's logcumsumexp gradient, sum over k >= j of gout[k] exp(x[j] -
        y[k]), as exp(x[j] + L+) - exp(x[j] + L-): L+- running reverse log-sums
        of log(+-gout[k]) - y[k] over the positive (negative) gout, the others
        counting as the lowest finite value (so nan where PyTorch's is)."""
        n = x.shape[1]
        low = -1.7976931348623157e308
        pos = -math.inf
        neg = -math.inf
        for t in range(n):
            k = n - 1 - t
            g = gout[o, k, i]
            lg = math.log(abs(g)) if g != 0 else low
            yk = y[o, k, i]
            pos = log_add(pos, (lg if g > 0 else low) - yk)
            neg = log_add(neg, (lg if g < 0 else low) - yk)
            xv = x[o, k, i]
            d = math.exp(pos + xv) - math.exp(neg + xv)
            dest[o, k, i] = d if beta == 0 else d + beta * dest[o, k, i]

    return logcumsumexp_lane, logcumsumexp_backward_lane


def lstm_cell_element(sigmoid, tanh):
    """The element function ``(xp, rec, has_rec, cprev, has_c, hc, act, i, j)``
    of one LSTM step at batch row i, unit j: the gates xp[i] (+ rec[i] when
    ``has_rec``) in PyTorch's order i, f, g, o (column blocks of H =
    hc.shape[2]), their activations into act[i], c = f * c_prev + i * g
    (c_prev = cprev[i, j] when ``has_c``, else 0) into hc[1, i, j] and
    h = o * tanh(c) into hc[0, i, j]. ``sigmoid``/``tanh`` are ``codes``'
    formulas as compiled for the device (``(x, p)``, x of the arrays' dtype:
    the CPU's take a vectorisable form for float32)."""
    def lstm_cell_element(xp, rec, has_rec, cprev, has_c, hc, act, i, j):
        n = hc.shape[2]
        pi, pf, pg, po = xp[i, j], xp[i, n + j], xp[i, 2 * n + j], xp[i, 3 * n + j]
        if has_rec:
            pi = pi + rec[i, j]
            pf = pf + rec[i, n + j]
            pg = pg + rec[i, 2 * n + j]
            po = po + rec[i, 3 * n + j]
        gi, gf, gg, go = sigmoid(pi, 0.0), sigmoid(pf, 0.0), tanh(pg, 0.0), sigmoid(po, 0.0)
        act[i, j] = gi
        act[i, n + j] = gf
        act[i, 2 * n + j] = gg
        act[i, 3 * n + j] = go
        c = gi * gg
        if has_c:
            c += gf * cprev[i, j]
        hc[1, i, j] = c
        hc[0, i, j] = go * tanh(hc[1, i, j], 0.0)
    return lstm_cell_element


def lstm_cell_backward_element(tanh):
    """The element function of an LSTM step's backward at (i, j), from the
    gradient ``gout`` of hc = [h; c] and the step's ``act`` and ``hc``: the
    gates' gradient (i, f, g, o blocks) into dxp[i] and drec[i] (each when
    its ``want_*``; dest = d + beta * dest, beta 0 never reading dest), and
    c_prev's, d c * f, into dc[1, i, j] (dc[0, i, j], h_prev's part, set to 0
    when beta_c is 0: this step adds none)."""
    def lstm_cell_backward_element(gout, act, hc, cprev, has_c, dxp, beta_x, want_x, drec,
                                   beta_r, want_r, dc, beta_c, want_c, i, j):
        n = hc.shape[2]
        gi, gf, gg, go = (1.0 * act[i, j], 1.0 * act[i, n + j], 1.0 * act[i, 2 * n + j],
                          1.0 * act[i, 3 * n + j])
        tc = 1.0 * tanh(hc[1, i, j], 0.0)
        dh = 1.0 * gout[0, i, j]
        dcn = gout[1, i, j] + dh * go * (1.0 - tc * tc)
        cp = 1.0 * cprev[i, j] if has_c else 0.0
        for k in range(4):
            if k == 0:
                d = dcn * gg * gi * (1.0 - gi)
            elif k == 1:
                d = dcn * cp * gf * (1.0 - gf)
            elif k == 2:
                d = dcn * gi * (1.0 - gg * gg)
            else:
                d = dh * tc * go * (1.0 - go)
            col = k * n + j
            if want_x:
                dxp[i, col] = d if beta_x == 0 else d + beta_x * dxp[i, col]
            if want_r:
                drec[i, col] = d if beta_r == 0 else d + beta_r * drec[i, col]
        if want_c:
            d = dcn * gf
            if beta_c == 0:
                dc[0, i, j] = 0.0
                dc[1, i, j] = d
            else:
                dc[1, i, j] = d + beta_c * dc[1, i, j]
    return lstm_cell_backward_element
