"""CUDA kernels of ``nn.LSTM``'s fused time step (see ``kernels.cpu.rnn``):
one launch each, a grid-stride loop over the (batch, hidden) elements."""
from __future__ import annotations

# the kernels this module registers
__all__ = ["lstm_cell", "lstm_cell_backward"]

from numba import cuda, float64, types

from .. import bodies, codes
from ._core import THREADS, Config, array_type, grid, kernel, launch

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
