"""CUDA kernels of ``nn.LSTM`` (see ``kernels.cpu.rnn``): a layer's sequence
is a host loop of a GEMM and a fused cell launch per step (a grid-stride
loop over the (batch, hidden) elements), its backward the same in reverse."""
from __future__ import annotations

# the kernels this module registers
__all__ = ["lstm_layer", "lstm_layer_backward"]

from numba import cuda, float64, types

from .. import bodies, codes
from ._core import THREADS, Config, array_type, grid, kernel, launch
from .elementwise import fill
from .matmul import gemm
from .strided import expand_nd

_sigmoid = cuda.jit(device=True)(codes._sigmoid)
_tanh = cuda.jit(device=True)(codes._tanh)
_cell = cuda.jit(device=True)(bodies.lstm_cell_element(_sigmoid, _tanh))
_cell_backward = cuda.jit(device=True)(bodies.lstm_cell_backward_element(_tanh))


def _a(dt, ndim):
    return array_type(dt, ndim, "A")


@kernel("lstm_cell", lambda dt: (_a(dt, 2), _a(dt, 2), types.boolean, _a(dt, 2), types.boolean,
                                 _a(dt, 3), _a(dt, 2)))
def _lstm_cell_source(config: Config, dtype):
    def lstm_cell_kernel(xp, rec, has_rec, cprev, has_c, hc, act):
        n = hc.shape[2]
        q = cuda.grid(1)
        while q < hc.shape[1] * n:
            _cell(xp, rec, has_rec, cprev, has_c, hc, act, q // n, q % n)
            q += cuda.gridsize(1)
    return lstm_cell_kernel


@kernel("lstm_cell_backward", lambda dt: (_a(dt, 3), _a(dt, 2), _a(dt, 3), _a(dt, 2),
                                          types.boolean, _a(dt, 2), float64, types.boolean,
                                          _a(dt, 2), float64, types.boolean, _a(dt, 3), float64,
                                          types.boolean))
def _lstm_cell_backward_source(config: Config, dtype):
    def lstm_cell_backward_kernel(gout, act, hc, cprev, has_c, dxp, beta_x, want_x, drec, beta_r,
                                  want_r, dc, beta_c, want_c):
        n = hc.shape[2]
        q = cuda.grid(1)
        while q < hc.shape[1] * n:
            _cell_backward(gout, act, hc, cprev, has_c, dxp, beta_x, want_x, drec, beta_r,
                           want_r, dc, beta_c, want_c, q // n, q % n)
            q += cuda.gridsize(1)
    return lstm_cell_backward_kernel


# ------------------------------------------------------------ launchers
def lstm_cell(xp, rec, has_rec, cprev, has_c, hc, act) -> None:
    """See ``kernels.cpu.rnn.lstm_cell``."""
    if hc.size:
        launch("lstm_cell", hc.dtype, grid(hc.size // 2), THREADS, xp, rec, bool(has_rec), cprev,
               bool(has_c), hc, act)


def lstm_cell_backward(gout, act, hc, cprev, has_c, dxp, beta_x, want_x, drec, beta_r, want_r,
                       dc, beta_c, want_c) -> None:
    """See ``kernels.cpu.rnn.lstm_cell_backward``."""
    if hc.size:
        launch("lstm_cell_backward", hc.dtype, grid(hc.size // 2), THREADS, gout, act, hc, cprev,
               bool(has_c), dxp, float(beta_x), bool(want_x), drec, float(beta_r), bool(want_r),
               dc, float(beta_c), bool(want_c))


def lstm_layer(proj, w_hh, wt, h0, c0, has_h0, reverse, y, act, rec) -> None:
    """See ``kernels.cpu.rnn.lstm_layer`` (``wt`` unused: the GEMM reads
    W_hh transposed)."""
    steps = y.shape[1]
    for s in range(steps):
        t = steps - 1 - s if reverse else s
        tp = t + 1 if reverse else t - 1
        has_prev = s > 0 or bool(has_h0)
        if has_prev:
            gemm(h0 if s == 0 else y[0, tp], w_hh, rec, False, True, 1.0, 0.0)
        lstm_cell(proj[t], rec, has_prev, c0 if s == 0 else y[1, tp], has_prev, y[:, t], act[t])


def lstm_layer_backward(gy, y, act, w_hh, c0, has_h0, reverse, dg, carry, g) -> None:
    """See ``kernels.cpu.rnn.lstm_layer_backward``."""
    steps = y.shape[1]
    fill(carry, 0.0)
    for s in range(steps):
        t = s if reverse else steps - 1 - s
        tp = t + 1 if reverse else t - 1
        first = s == steps - 1
        has_prev = not first or bool(has_h0)
        expand_nd(gy[:, t], g, 1.0, 0.0)
        expand_nd(carry, g, 1.0, 1.0)
        lstm_cell_backward(g, act[t], y[:, t], c0 if first else y[1, tp], has_prev, dg[t], 0.0,
                           True, dg[t], 0.0, False, carry, 0.0, has_prev)
        if has_prev:
            gemm(dg[t], w_hh, carry[0], False, False, 1.0, 0.0)

