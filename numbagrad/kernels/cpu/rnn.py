"""CPU kernels of ``nn.LSTM``'s fused time step (``bodies.lstm_cell_element``):
the gate activations and the cell update of one step forward, and their
gradient, one pass each over the (batch, hidden) elements."""
from __future__ import annotations

# the kernels this module registers
__all__ = ["lstm_cell", "lstm_cell_backward"]

from numba import njit

from .. import bodies, codes

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
    for i in range(hc.shape[1]):
        for j in range(hc.shape[2]):
            _cell(xp, rec, has_rec, cprev, has_c, hc, act, i, j)


@njit(cache=True, error_model="numpy")
def lstm_cell_backward(gout, act, hc, cprev, has_c, dxp, beta_x, want_x, drec, beta_r, want_r,
                       dc, beta_c, want_c):
    """``lstm_cell``'s gradient from gout (2, N, H): the gates' into dxp and
    drec (N, 4H), c_prev's into dc (2, N, H)'s block 1; see
    ``bodies.lstm_cell_backward_element``."""
    for i in range(hc.shape[1]):
        for j in range(hc.shape[2]):
            _cell_backward(gout, act, hc, cprev, has_c, dxp, beta_x, want_x, drec, beta_r,
                           want_r, dc, beta_c, want_c, i, j)
