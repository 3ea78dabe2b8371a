"""Flat buffers: an optimizer's params of one device and dtype, packed together.

Each param's ``.data`` and ``.grad`` become views into its group's weight
and gradient buffers, so one kernel call updates the whole group and a
data-parallel allreduce is one call.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import kernels
from ..tensor import Tensor

if TYPE_CHECKING:
    from .optimizer import Optimizer

# Gradient buffers end in TAIL spare elements, zero between windows: under
# DistributedOptimizer the window's sample count rides in them through the
# same allreduce, as base-256 digits (exact in float32 for up to 65793 ranks).
TAIL = 5
COUNT_LIMIT = 256 ** TAIL


def encode_count(count: int) -> np.ndarray:
    """``count`` (< COUNT_LIMIT) as TAIL base-256 digits, lowest first."""
    return np.array([(count >> (8 * j)) & 255 for j in range(TAIL)], np.float64)


def decode_count(digits: np.ndarray) -> int:
    """The count whose (summed) digits these are."""
    return sum(round(float(d)) << (8 * j) for j, d in enumerate(digits))


class Group:
    """The params of one device and dtype and their flat buffers.

    ``w`` holds the weights, ``g`` the ``.grad`` accumulators and ``win``
    (made on first use) the ``step(grads)`` window; ``slots`` is the update
    rule's per-element state (saved in state dicts), ``scratch`` its work
    arrays (not saved), ``hyper`` the ``opt.param_groups`` entry whose
    hyper-parameters (lr, weight_decay, ...) its updates use.
    """

    def __init__(self, params: list[Tensor], owner: Optimizer) -> None:
        first = params[0]
        kern = self.kern = first._kern
        self.dtype = first.dtype
        self.params = params
        bounds = np.zeros(len(params) + 1, np.int64)
        np.cumsum([p.size for p in params], out=bounds[1:])
        self.bounds = bounds
        self.size = int(bounds[-1])
        self.seg = kernels.from_host(kern, bounds)
        self.w = kernels.empty(kern, (self.size,), self.dtype)
        self.g = self.zeros()
        self.g_body = self.g[:self.size]
        for p, view_w, view_g in zip(params, self.views(self.w), self.views(self.g)):
            kernels.call(kern, "axpby", p.size, 1.0, p._data, 0.0, view_w)
            if p._live:
                kernels.call(kern, "axpby", p.size, 1.0, p._acc, 0.0, view_g)
            if p._owner is not None:
                p._owner._taken = True
            p._data, p._acc, p._owner = view_w, view_g, owner
        self.win = None           # the step(grads) window buffer, made on first use
        self.win_body = None
        self.win_views: list = []
        self.seen = [False] * len(params)
        self.live_flags: tuple | None = None   # the flags uploaded to self.live
        self.live = kernels.from_host(kern, np.zeros(len(params), np.uint8))
        self.sq = kernels.from_host(kern, np.zeros(1, np.float64))   # sumsq's result
        self.slots: dict[str, Any] = {}
        self.scratch: dict[str, Any] = {}
        self.hyper: dict[str, Any] = {}   # the user's param group (a ParamGroup) it is part of

    def zeros(self, tail: int = TAIL) -> Any:
        """A new zeroed flat buffer of the group's size (plus ``tail``) and dtype."""
        array = kernels.empty(self.kern, (self.size + tail,), self.dtype)
        kernels.call(self.kern, "fill", 0, array, 0.0)
        return array

    def views(self, flat: Any) -> list:
        b = self.bounds
        return [flat[b[i]:b[i + 1]].reshape(p.shape) for i, p in enumerate(self.params)]

    def window(self) -> Any:
        if self.win is None:
            self.win = self.zeros()
            self.win_body = self.win[:self.size]
            self.win_views = self.views(self.win)
        return self.win

    def body(self, flat: Any) -> Any:
        """The params' part of a gradient buffer (``g`` or ``win``), without the tail."""
        return self.g_body if flat is self.g else self.win_body

    def grad_flags(self) -> tuple:
        """Which params hold a gradient in ``.grad`` (the live flags of a grad window)."""
        return tuple([p._live for p in self.params])   # (a list is cheaper than a generator)

    def set_live(self, flags: tuple) -> None:
        if flags != self.live_flags:
            kernels.call(self.kern, "upload", 0, np.array(flags, np.uint8), self.live)
            self.live_flags = flags

    def sum_of_squares(self, flat: Any) -> float:
        """One reduction pass over a gradient buffer's body (float64, may be NaN/inf)."""
        kernels.call(self.kern, "sumsq", 0, self.body(flat), self.sq)
        return float(kernels.to_host(self.kern, self.sq)[0])

    def nonfinite(self, flat: Any) -> list[int]:
        """Indices of the params whose part of ``flat`` holds NaN or infinity."""
        host = kernels.to_host(self.kern, self.body(flat))
        b = self.bounds
        return [i for i in range(len(self.params))
                if not np.isfinite(host[b[i]:b[i + 1]]).all()]
