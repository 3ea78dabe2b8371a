"""CPU kernels of ``nn.LSTM``'s fused time step (``bodies.lstm_cell_element``):
the gate activations and the cell update of one step forward, and their
gradient. float64 runs the shared element functions with libm's functions;
float32 runs the same math in passes over rows with ``vmath``'s vectorisable
sigmoid and tanh (the libm loop took 3-4x as long, most of the LSTM step)."""
from __future__ import annotations

# the kernels this module registers
__all__ = ["lstm_cell", "lstm_cell_backward"]

import numpy as np
from numba import njit

from .. import bodies, codes
from .vmath import sigmoid64, tanh64

_sigmoid = njit(error_model="numpy", inline="always")(codes._sigmoid)
_tanh = njit(error_model="numpy", inline="always")(codes._tanh)
_cell = njit(error_model="numpy", inline="always")(bodies.lstm_cell_element(_sigmoid, _tanh))
_cell_backward = njit(error_model="numpy", inline="always")(
    bodies.lstm_cell_backward_element(_tanh))


@njit(cache=True, error_model="numpy")
def lstm_cell(xp, rec, has_rec, cprev, has_c, hc, act):
    """One LSTM step: xp (N, 4H) the step's input projection (biases in),
    rec (N, 4H) h_prev @ W_hh^T (read when ``has_rec``), cprev (N, H) (read
    when ``has_c``); writes hc (2, N, H) = [h; c] and the activations act (N, 4H)."""
    n = hc.shape[2]
    for i in range(hc.shape[1]):
        if hc.itemsize != 4:
            for j in range(n):
                _cell(xp, rec, has_rec, cprev, has_c, hc, act, i, j)
            continue
        # float32: the same math in passes of one or two rows each, which vectorise
        a, x, r, c, h, cp = act[i], xp[i], rec[i], hc[1, i], hc[0, i], cprev[i]
        if has_rec:
            for j in range(4 * n):
                a[j] = x[j] + r[j]
        else:
            for j in range(4 * n):
                a[j] = x[j]
        for j in range(2 * n):
            a[j] = sigmoid64(np.float64(a[j]))
        for j in range(2 * n, 3 * n):
            a[j] = tanh64(np.float64(a[j]))
        for j in range(3 * n, 4 * n):
            a[j] = sigmoid64(np.float64(a[j]))
        if has_c:
            for j in range(n):
                c[j] = a[j] * a[2 * n + j] + a[n + j] * cp[j]
        else:
            for j in range(n):
                c[j] = a[j] * a[2 * n + j]
        for j in range(n):
            h[j] = a[3 * n + j] * tanh64(np.float64(c[j]))


@njit(cache=True, error_model="numpy")
def lstm_cell_backward(gout, act, hc, cprev, has_c, dxp, beta_x, want_x, drec, beta_r, want_r,
                       dc, beta_c, want_c):
    """``lstm_cell``'s gradient from gout (2, N, H): the gates' into dxp and
    drec (N, 4H), c_prev's into dc (2, N, H)'s block 1; see
    ``bodies.lstm_cell_backward_element``."""
    n = hc.shape[2]
    d, dcp = np.empty(4 * n), np.empty(n)
    for i in range(hc.shape[1]):
        if hc.itemsize != 4:
            for j in range(n):
                _cell_backward(gout, act, hc, cprev, has_c, dxp, beta_x, want_x, drec, beta_r,
                               want_r, dc, beta_c, want_c, i, j)
            continue
        # float32: the gates' gradient into a row, then a pass per destination
        a, c, gh, gc, cp = act[i], hc[1, i], gout[0, i], gout[1, i], cprev[i]
        for j in range(n):
            tc = tanh64(np.float64(c[j]))
            gi, gf, gg, go = (np.float64(a[j]), np.float64(a[n + j]), np.float64(a[2 * n + j]),
                              np.float64(a[3 * n + j]))
            dh = np.float64(gh[j])
            dcn = gc[j] + dh * go * (1.0 - tc * tc)
            d[j] = dcn * gg * gi * (1.0 - gi)
            d[n + j] = dcn * (cp[j] if has_c else 0.0) * gf * (1.0 - gf)
            d[2 * n + j] = dcn * gi * (1.0 - gg * gg)
            d[3 * n + j] = dh * tc * go * (1.0 - go)
            dcp[j] = dcn * gf
        if want_x:
            _put(d, dxp[i], beta_x)
        if want_r:
            _put(d, drec[i], beta_r)
        if want_c:
            _put(dcp, dc[1, i], beta_c)
            if beta_c == 0:
                dc[0, i, :] = 0.0


@njit(error_model="numpy", inline="always")
def _put(d, dest, beta):
    """dest = d + beta * dest (beta 0: never reading dest)."""
    if beta == 0:
        for j in range(d.size):
            dest[j] = d[j]
    else:
        for j in range(d.size):
            dest[j] = d[j] + beta * dest[j]
