"""The recurrent layers ``RNN``, ``LSTM`` and ``GRU`` with PyTorch's
constructor arguments, parameters, state-dict keys, gate order and init, so
a PyTorch state dict loads and gives PyTorch's outputs.

Each layer and direction projects the whole sequence with one GEMM
(``x @ weight_ih.T`` over every time step, the biases folded in where the
math allows); only the recurrent ``h @ weight_hh.T`` and the gate math run
inside the time loop: for RNN and GRU as ops, for LSTM as one op over the
sequence (``_lstm_layer``: its kernels run the loop).
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from .. import buffers, kernels, ops
from ..ops._common import (contiguous, contiguous_array, describe, is_scalar, ones, operand,
                           reshaped, result)
from ..ops.shape import _expand_into, _view
from ..tape import Node, _Backward
from ..tensor import Tensor, param
from .module import Module, _allocating, _dtype

__all__ = ["RNN", "LSTM", "GRU"]

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


class _RNNBase(Module):
    """The parameters and the layer/direction loop shared by the three layers;
    a subclass names its ``mode`` and runs one time step in ``_cell`` (LSTM,
    whose carry is h and c, in ``_step``)."""

    mode = ""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, *, dtype: Any = None,
                 device: str = "cpu", rng: np.random.Generator | None = None) -> None:
        name = type(self).__name__
        for what, n, low in (("input_size", input_size, 1), ("hidden_size", hidden_size, 1),
                             ("num_layers", num_layers, 1), ("proj_size", proj_size, 0)):
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < low:
                kind = "positive" if low else "non-negative"
                raise ValueError(f"{name}: {what} must be a {kind} integer, got {n!r}")
        if proj_size:
            raise NotImplementedError(f"{name}: proj_size={proj_size} (an LSTM with "
                                      f"projections) is not supported; use proj_size=0")
        if isinstance(dropout, bool) or not is_scalar(dropout) or not 0.0 <= dropout <= 1.0:
            raise ValueError(f"{name}: dropout must be a probability in [0, 1], got "
                             f"{dropout!r}")
        for what, flag in (("bias", bias), ("batch_first", batch_first),
                           ("bidirectional", bidirectional)):
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(f"{name}: {what} must be a bool, got {flag!r}")
        if dropout > 0 and num_layers == 1:
            warnings.warn(f"{name}: dropout={dropout} applies between layers, after all but "
                          f"the last, so it has no effect with num_layers=1", stacklevel=3)
        super().__init__()
        dtype = _dtype(dtype)
        rng = rng if rng is not None else np.random.default_rng()
        self.mode = mode
        self.input_size, self.hidden_size = int(input_size), int(hidden_size)
        self.num_layers, self.bias = int(num_layers), bool(bias)
        self.batch_first, self.dropout = bool(batch_first), float(dropout)
        self.bidirectional, self.proj_size = bool(bidirectional), 0
        gate = _GATES[mode] * self.hidden_size
        directions = 2 if self.bidirectional else 1
        bound = 1.0 / math.sqrt(self.hidden_size)
        # PyTorch's registration order, each drawn from U(-bound, bound) in that order
        for layer in range(self.num_layers):
            width = self.input_size if layer == 0 else self.hidden_size * directions
            for suffix in ("", "_reverse")[:directions]:
                shapes = [("weight_ih", (gate, width)), ("weight_hh", (gate, self.hidden_size))]
                if self.bias:
                    shapes += [("bias_ih", (gate,)), ("bias_hh", (gate,))]
                for kind, shape in shapes:
                    with _allocating(name, shape):
                        setattr(self, f"{kind}_l{layer}{suffix}",
                                param(rng.uniform(-bound, bound, shape), dtype=dtype,
                                      device=device))

    @property
    def _weight(self) -> Tensor:
        return self.weight_ih_l0

    def _params(self, layer: int, suffix: str) -> tuple:
        p = self._parameters
        tail = f"_l{layer}{suffix}"
        return (p["weight_ih" + tail], p["weight_hh" + tail],
                p.get("bias_ih" + tail), p.get("bias_hh" + tail))

    # ------------------------------------------------------------ forward
    def _check(self, x: Tensor, hx: Any) -> tuple[bool, Any]:
        """Validate the input and the initial state before anything runs;
        returns (unbatched, the initial state's tensors or None)."""
        name, w = type(self).__name__, self._weight
        if x.ndim not in (2, 3):
            layout = "(N, L, H_in)" if self.batch_first else "(L, N, H_in)"
            raise ValueError(f"{name}: input must be 3-D {layout} or 2-D unbatched (L, H_in), "
                             f"got {describe(x)}")
        if x.shape[-1] != self.input_size:
            raise ValueError(f"{name}: input.size(-1) must be equal to input_size: expected "
                             f"{self.input_size}, got input of shape {x.shape}")
        if x.dtype != w.dtype or x.device != w.device:
            raise TypeError(f"{name}: input ({describe(x)}) must have the parameters' dtype "
                            f"and device ({w.dtype}, on {w.device})")
        unbatched = x.ndim == 2
        steps = x.shape[0] if unbatched or not self.batch_first else x.shape[1]
        if steps == 0:
            raise ValueError(f"{name}: the input's sequence length is 0 ({describe(x)}); "
                             f"it must be at least 1")
        if hx is None:
            return unbatched, None
        batch = 1 if unbatched else x.shape[0 if self.batch_first else 1]
        layers = self.num_layers * (2 if self.bidirectional else 1)
        want = (layers, self.hidden_size) if unbatched else (layers, batch, self.hidden_size)
        states = self._states(hx)
        out = []
        for what, h in states:
            h = operand(h, name, what)
            if h.shape != want:
                raise ValueError(f"{name}: {what} must have shape {want} (num_layers * "
                                 f"num_directions{', N' * (not unbatched)}, hidden_size) for "
                                 f"input of shape {x.shape}, got {h.shape}")
            if h.dtype != w.dtype or h.device != w.device:
                raise TypeError(f"{name}: {what} ({describe(h)}) must have the parameters' "
                                f"dtype and device ({w.dtype}, on {w.device})")
            out.append(h.reshape((layers, 1, self.hidden_size)) if unbatched else h)
        return unbatched, out

    def _states(self, hx: Any) -> list[tuple[str, Any]]:
        """The initial state's parts, named for errors: h_0 (LSTM: h_0, c_0)."""
        return [("h_0", hx)]

    def forward(self, input: Any, hx: Any = None) -> tuple[Tensor, Any]:
        """(output, h_n) for input (L, N, H_in) (batch_first: (N, L, H_in);
        unbatched: (L, H_in)) and the initial state hx (num_layers *
        num_directions, N, H) (unbatched: without N), zeros when None.
        output holds the last layer's h_t for every t, both directions'
        concatenated; h_n each layer's and direction's last h."""
        x = operand(input, type(self).__name__)
        unbatched, states = self._check(x, hx)
        time_axis = 1 if self.batch_first and not unbatched else 0
        if unbatched:
            x = x.reshape((x.shape[0], 1, x.shape[1]))
        directions = 2 if self.bidirectional else 1
        finals: list[list[Tensor]] = []
        for layer in range(self.num_layers):
            outs = []
            for d, suffix in enumerate(("", "_reverse")[:directions]):
                k = layer * directions + d
                state = None if states is None else [s[k] for s in states]
                out, last = self._direction(x, self._params(layer, suffix), state, time_axis,
                                            reverse=d == 1)
                outs.append(out)
                finals = finals or [[] for _ in last]
                for kept, h in zip(finals, last):
                    kept.append(h)
            x = outs[0] if directions == 1 else ops.cat(outs, axis=-1)
            if self.training and self.dropout > 0 and layer < self.num_layers - 1:
                x = ops.dropout(x, self.dropout, True)
        if unbatched:
            x = x.reshape((x.shape[0], x.shape[2]))
        last = [ops.stack(kept, axis=0) for kept in finals]
        if unbatched:
            last = [h.reshape((h.shape[0], h.shape[2])) for h in last]
        return x, self._result(last)

    def _result(self, last: list[Tensor]) -> Any:
        return last[0]

    def _direction(self, x: Tensor, params: tuple, state: list | None, time_axis: int,
                   reverse: bool) -> tuple[Tensor, list[Tensor]]:
        """One layer in one direction over the sequence x (time on
        ``time_axis``): (its h_t for every t, stacked on that axis; its last
        state's parts)."""
        w_ih, w_hh, b_ih, b_hh = params
        proj = ops.linear(x, w_ih, self._input_bias(b_ih, b_hh))
        steps = x.shape[time_axis]
        hs: list[Tensor] = [None] * steps    # type: ignore[list-item]
        carry = self._initial(state)
        for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
            carry = self._step(proj, t, time_axis, carry, w_hh, b_hh)
            hs[t] = self._h(carry)
        return ops.stack(hs, axis=time_axis), self._finals(carry)

    def _initial(self, state: list | None) -> Any:
        """The time loop's carry before the first step (None: zeros)."""
        return None if state is None else state[0]

    def _step(self, proj: Tensor, t: int, time_axis: int, carry: Any, w_hh: Tensor,
              b_hh: Tensor | None) -> Any:
        """The carry after step t, from the input projection ``proj``."""
        return self._cell(proj[t] if time_axis == 0 else proj[:, t], carry, w_hh, b_hh)

    def _h(self, carry: Any) -> Tensor:
        return carry

    def _finals(self, carry: Any) -> list[Tensor]:
        return [carry]

    def _input_bias(self, b_ih: Tensor | None, b_hh: Tensor | None) -> Tensor | None:
        """The bias added with the input projection: both biases where they
        only ever add (RNN, LSTM)."""
        return None if b_ih is None else b_ih + b_hh

    def _cell(self, xp: Tensor, h: Tensor | None, w_hh: Tensor, b_hh: Tensor | None
              ) -> Tensor:
        """h_t from the step's input projection xp and h_{t-1} (None: zeros)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        extra = [f"{self.input_size}, {self.hidden_size}"]
        if self.num_layers != 1:
            extra.append(f"num_layers={self.num_layers}")
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            extra.append(f"nonlinearity={self.nonlinearity!r}")
        for what, value, default in (("bias", self.bias, True),
                                     ("batch_first", self.batch_first, False),
                                     ("dropout", self.dropout, 0.0),
                                     ("bidirectional", self.bidirectional, False)):
            if value != default:
                extra.append(f"{what}={value}")
        return f"{type(self).__name__}({', '.join(extra)})"


class RNN(_RNNBase):
    """PyTorch's ``nn.RNN``: h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh),
    act ``nonlinearity`` "tanh" or "relu"; params ``weight_ih_l{k}`` (H, H_in
    for k = 0, else H * num_directions), ``weight_hh_l{k}`` (H, H),
    ``bias_ih_l{k}``, ``bias_hh_l{k}`` (H,), ``_reverse`` for the backward
    direction, all U(-1/sqrt(H), 1/sqrt(H)) drawn from ``rng`` in that order.
    ``dropout`` applies to each layer's output but the last's, in training."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 nonlinearity: str = "tanh", bias: bool = True, batch_first: bool = False,
                 dropout: float = 0.0, bidirectional: bool = False, *, dtype: Any = None,
                 device: str = "cpu", rng: np.random.Generator | None = None) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN: nonlinearity must be 'tanh' or 'relu', got "
                             f"{nonlinearity!r}")
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size,
                         hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         dtype=dtype, device=device, rng=rng)
        self.nonlinearity = nonlinearity

    def _cell(self, xp: Tensor, h: Tensor | None, w_hh: Tensor, b_hh: Tensor | None
              ) -> Tensor:
        pre = xp if h is None else xp + ops.linear(h, w_hh)
        return ops.tanh(pre) if self.mode == "RNN_TANH" else ops.relu(pre)


class LSTM(_RNNBase):
    """PyTorch's ``nn.LSTM``, gates in PyTorch's order i, f, g, o:
    c_t = f * c_{t-1} + i * g, h_t = o * tanh(c_t) (i, f, o sigmoids, g a
    tanh of x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh); params as ``RNN``'s
    with 4H rows. ``forward(input, (h_0, c_0))`` returns
    ``(output, (h_n, c_n))``. ``proj_size`` other than 0 is refused."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, *, dtype: Any = None,
                 device: str = "cpu", rng: np.random.Generator | None = None) -> None:
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, proj_size, dtype=dtype, device=device, rng=rng)

    def _states(self, hx: Any) -> list[tuple[str, Any]]:
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(f"LSTM: hx must be a tuple (h_0, c_0), got {type(hx).__name__}")
        return [("h_0", hx[0]), ("c_0", hx[1])]

    def _result(self, last: list[Tensor]) -> Any:
        return last[0], last[1]

    def _direction(self, x: Tensor, params: tuple, state: list | None, time_axis: int,
                   reverse: bool) -> tuple[Tensor, list[Tensor]]:
        """The whole sequence as one op after the input projection (see
        ``_lstm_layer``): y = [h_t; c_t] for every t, of which the output and
        the last state are views."""
        w_ih, w_hh, b_ih, b_hh = params
        proj = ops.linear(x, w_ih, self._input_bias(b_ih, b_hh))
        y = _lstm_layer(proj, w_hh, state, time_axis, reverse)
        last = 0 if reverse else y.shape[1] - 1
        hs = y[0] if time_axis == 0 else ops.transpose(y[0], 0, 1)
        return hs, [y[0, last], y[1, last]]


def _lstm_layer(proj: Tensor, w_hh: Tensor, state: list | None, time_axis: int,
                reverse: bool) -> Tensor:
    """One LSTM layer and direction over the sequence as one op: y (2, T, N,
    H) = [h_t; c_t] for every step t from the input projection ``proj`` (time
    on ``time_axis``, biases in), W_hh and the initial [h0, c0] (None:
    zeros). The kernel runs the time loop: a small GEMM and the fused cell
    per step forward; backward the cell's gradient and a GEMM per step, then
    W_hh's gradient as one GEMM over every step, where separate ops per step
    took about four times as long."""
    kern = proj._kern
    xp = contiguous_array(kern, _view(kern, proj._data, _time_first(time_axis)))
    steps, batch, gates = xp.shape
    n, dtype = gates // 4, xp.dtype
    y = buffers.take(kern, (2, steps, batch, n), dtype)
    act = buffers.take(kern, (steps, batch, gates), dtype)
    wt = buffers.take(kern, (n, gates), dtype)
    rec = buffers.take(kern, (batch, gates), dtype)
    if state is None:
        h0 = c0 = _view(kern, y, lambda d: d[0, 0])   # never read
    else:
        h0, c0 = (contiguous(s) for s in state)
    kernels.call(kern, "lstm_layer", y.size, xp, contiguous(w_hh), wt, h0, c0, state is not None,
                 reverse, y, act, rec)
    inputs = (proj, w_hh) + tuple(state or ())
    return result(y, kern, inputs, _lstm_layer_backward, (time_axis, reverse, act, y, h0, c0))


def _time_first(time_axis: int) -> Any:
    """The view that puts ``time_axis`` first, of a (.., .., 4H) array."""
    return (lambda d: d) if time_axis == 0 else (lambda d: d.transpose(1, 0, 2))


def _lstm_layer_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    proj, w_hh = node.inputs[:2]
    state = node.inputs[2:]
    time_axis, reverse, act, y, h0, c0 = node.saved
    kern, dtype = proj._kern, act.dtype
    steps, batch, gates = act.shape
    if gout is None:
        gout = ones(kern, y.shape, dtype)
    dg, beta = None, 1.0
    if proj.requires_grad:
        dest, beta = ctx.dest(proj)
        if beta == 0.0 and time_axis == 0:   # the gates' gradient is proj's: write it there
            dg = dest
    if dg is None:
        dg = buffers.take(kern, act.shape, dtype)
    carry = buffers.take(kern, (2, batch, gates // 4), dtype)
    work = buffers.take(kern, (2, batch, gates // 4), dtype)
    kernels.call(kern, "lstm_layer_backward", dg.size, contiguous_array(kern, gout), y, act,
                 contiguous(w_hh), c0, bool(state), reverse, dg, carry, work)
    if proj.requires_grad and dg is not dest:
        _expand_into(kern, _view(kern, dg, _time_first(time_axis)), dest, beta)
    if w_hh.requires_grad:
        # dW_hh = sum over steps of dg[t]^T @ h_prev(t): the steps after the first
        # in one product, then the first step's with h0
        dest, beta = ctx.dest(w_hh)
        rows = (steps - 1) * batch
        if rows:
            cut = (lambda d: d[:-1]) if reverse else (lambda d: d[1:])
            keep = (lambda d: d[0, 1:]) if reverse else (lambda d: d[0, :-1])
            g2 = reshaped(_view(kern, dg, cut), (rows, gates))
            h2 = reshaped(_view(kern, y, keep), (rows, gates // 4))
            kernels.call(kern, "gemm", rows * gates * gates // 4, g2, h2, dest, True, False,
                         1.0, beta)
            beta = 1.0
        if state:
            first = steps - 1 if reverse else 0
            kernels.call(kern, "gemm", batch * gates * gates // 4,
                         _view(kern, dg, lambda d: d[first]), h0, dest, True, False, 1.0, beta)
        elif not rows and beta == 0.0:
            kernels.call(kern, "fill", 0, dest, 0.0)
    for t, k in zip(state, (0, 1)):
        if t.requires_grad:
            dest, beta = ctx.dest(t)
            _expand_into(kern, _view(kern, carry, lambda d: d[k]), dest, beta)


class GRU(_RNNBase):
    """PyTorch's ``nn.GRU``, gates in PyTorch's order r, z, n:
    r, z = sigmoid(x_t W_i^T + b_i + h W_h^T + b_h), n = tanh(x_t W_in^T +
    b_in + r * (h W_hn^T + b_hn)), h_t = (1 - z) * n + z * h_{t-1}; params as
    ``RNN``'s with 3H rows."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, *, dtype: Any = None, device: str = "cpu",
                 rng: np.random.Generator | None = None) -> None:
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, dtype=dtype, device=device, rng=rng)

    def _input_bias(self, b_ih: Tensor | None, b_hh: Tensor | None) -> Tensor | None:
        return b_ih     # b_hn is multiplied by r: it stays with the recurrent product

    def _cell(self, xp: Tensor, h: Tensor | None, w_hh: Tensor, b_hh: Tensor | None
              ) -> Tensor:
        n = self.hidden_size
        if h is None:    # h_{t-1} = 0: the recurrent product is its bias alone
            if b_hh is None:
                rz = ops.sigmoid(xp[:, :2 * n])
                new = ops.tanh(xp[:, 2 * n:])
            else:
                rz = ops.sigmoid(xp[:, :2 * n] + b_hh[:2 * n])
                new = ops.tanh(xp[:, 2 * n:] + rz[:, :n] * b_hh[2 * n:])
            return new - rz[:, n:] * new
        gh = ops.linear(h, w_hh, b_hh)
        rz = ops.sigmoid(xp[:, :2 * n] + gh[:, :2 * n])
        new = ops.tanh(xp[:, 2 * n:] + rz[:, :n] * gh[:, 2 * n:])
        return new + rz[:, n:] * (h - new)
