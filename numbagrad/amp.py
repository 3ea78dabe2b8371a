"""Mixed precision: ``GradScaler``, PyTorch's dynamic loss scaling.

A half-precision loss's gradients underflow where they are small; scaling
the loss by S before ``backward`` scales every gradient by S, and the
optimizer step divides it out. ``GradScaler`` picks S as
``torch.amp.GradScaler`` does: a window whose gradients hold an inf or nan
is skipped (nothing applied, the window discarded) and S is multiplied by
``backoff_factor``; after ``growth_interval`` clean windows in a row S is
multiplied by ``growth_factor``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import kernels
from .tensor import Tensor


class GradScaler:
    """``torch.amp.GradScaler``'s interface for numbagrad's optimizers.

    ``scaler.scale(loss)`` (a recorded product, so call it inside the tape),
    ``loss.backward()``, then ``scaler.step(opt)`` in place of ``opt.step()``
    and ``scaler.update()``. With ``accumulate_steps=k`` the optimizer's
    window is k micro-steps: ``step`` only counts the first k-1 and, at the
    k-th, unscales the window's total, skips the whole window when it is not
    finite and otherwise applies it; ``update`` changes the scale only after
    such a window boundary. ``enabled=False`` makes every method a
    pass-through (scale 1, never skips).
    """

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        if not growth_factor > 1.0:
            raise ValueError(f"GradScaler: growth_factor must be > 1, got {growth_factor!r}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"GradScaler: backoff_factor must be in (0, 1), got "
                             f"{backoff_factor!r}")
        if not isinstance(growth_interval, int) or growth_interval < 1:
            raise ValueError(f"GradScaler: growth_interval must be a positive int, got "
                             f"{growth_interval!r}")
        if not init_scale > 0 or not math.isfinite(init_scale):
            raise ValueError(f"GradScaler: init_scale must be a positive finite number, got "
                             f"{init_scale!r}")
        self._scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = growth_interval
        self._growth_tracker = 0
        self._enabled = bool(enabled)
        self._found_inf: bool | None = None   # the last boundary's verdict, until update()

    def is_enabled(self) -> bool:
        return self._enabled

    def get_scale(self) -> float:
        """The current scale (1.0 when disabled)."""
        return self._scale if self._enabled else 1.0

    def scale(self, loss: Any) -> Any:
        """``loss * scale``: recorded on the tape when ``loss`` is."""
        return loss * self._scale if self._enabled else loss

    def step(self, optimizer: Any) -> bool:
        """``optimizer.step()`` on the unscaled window; False when it only
        counted a micro-step or skipped a non-finite window."""
        if not self._enabled:
            return optimizer.step()
        if optimizer.pending_steps + 1 < optimizer.accumulate_steps:
            return optimizer.step()
        masters = getattr(optimizer, "_masters", None)   # half params' float32 masters
        if masters is not None:
            masters.sync_flags()    # the backward flagged the half params, not the masters
        grads = [p for p in optimizer.params if p._live]
        inv = 1.0 / self._scale
        found = False
        for p in grads:     # (the accumulators are float32 or float64: checked as they are)
            if not np.isfinite(kernels.to_host(p._kern, p._acc)).all():
                found = True
                break
        self._found_inf = found
        if found:
            optimizer._window.discard("grad")
            if masters is not None:
                masters.flags_back()
            return False
        for p in grads:
            _scale_in_place(p, inv)
        return optimizer.step()

    def update(self, new_scale: float | None = None) -> None:
        """Back off after a skipped window, grow after ``growth_interval``
        clean ones; ``new_scale`` sets the scale instead. Nothing changes
        unless a window boundary was stepped since the last update."""
        if not self._enabled:
            return
        if new_scale is not None:     # (the growth count runs on, as PyTorch's)
            self._scale = float(new_scale)
        elif self._found_inf is not None:
            if self._found_inf:
                self._scale *= self._backoff_factor
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    self._scale *= self._growth_factor
                    self._growth_tracker = 0
        self._found_inf = None

    def state_dict(self) -> dict[str, Any]:
        """PyTorch's keys: scale, growth_factor, backoff_factor,
        growth_interval, _growth_tracker (empty when disabled)."""
        if not self._enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not self._enabled:
            return
        if not state:
            raise RuntimeError("GradScaler.load_state_dict: the state is empty (saved from a "
                               "disabled scaler)")
        self._scale = float(state["scale"])
        self._growth_factor = float(state["growth_factor"])
        self._backoff_factor = float(state["backoff_factor"])
        self._growth_interval = int(state["growth_interval"])
        self._growth_tracker = int(state["_growth_tracker"])


def _scale_in_place(p: Tensor, factor: float) -> None:
    """p's accumulated gradient (float32 or float64) times ``factor``, in place."""
    kernels.call(p._kern, "axpby", 0, 0.0, p._acc, factor, p._acc)
