"""Float32 master weights for half-precision params (``master_weights=True``).

A float16 or bfloat16 param cannot take a small update: bfloat16 keeps 8
significant bits, so ``w -= lr * g`` rounds back to ``w`` whenever the step
is below half a unit in its last place. The optimizer therefore updates a
float32 master copy of each half param: the master is what its flat
buffers hold (its state dict saves it, Adam's moments are float32), the
half param's ``.grad`` is the master's float32 accumulator (so a window of
micro-steps accumulates in float32: the half-to-float32 cast's backward
writes straight into it), and each applied update writes the master,
rounded to nearest even, back into the half param. A half param written
from outside since (``load_state_dict``, ``p.data = ...``, an in-place op,
``nn.init``: its write stamp moved) is widened into its master again before
the next update, so the master never overwrites a newer weight. The
optimizer's ``state_dict`` saves the masters (``"masters"``) and its
``load_state_dict`` restores them (and writes them back); a state dict
without them leaves the masters as the params are.

``master_weights=False`` (the default, as PyTorch's optimizers update half
params in half): the master is re-read from the half param before every
update, so the update is computed in float32 but only its rounding is
kept; building such an optimizer warns, since that loses small updates.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .. import _dtypes, kernels
from ..ops import _half
from ..tensor import Tensor, note_writes

_F32 = np.dtype(np.float32)


class Masters:
    """The (half param, float32 master) pairs of one optimizer."""

    def __init__(self, keep: bool) -> None:
        self.keep = keep
        self.pairs: list[tuple[Tensor, Tensor]] = []
        # each half param's write stamp when its master last matched it
        self.synced: list[int] = []

    def master(self, p: Tensor) -> Tensor:
        """``p``'s float32 master (a new param), or ``p`` when it is not a half."""
        if p.dtype not in _dtypes.HALVES:
            return p
        kern = p._kern
        data = kernels.empty(kern, p.shape, _F32)
        _half.widen(kern, p._data, data)
        m = Tensor(data, kern, requires_grad=True)
        if p._live:   # a gradient given before the optimizer was built feeds its first step
            m._acc = kernels.empty(kern, p.shape, _F32)
            _half.widen(kern, p._acc, m._acc)
            m._live = True
        self.pairs.append((p, m))
        self.synced.append(getattr(p, "_stamp", 0))
        return m

    def attach(self, opt: Any, kind: str) -> None:
        """Point each half param's accumulator at its master's, and wrap the
        optimizer's window methods to keep the pairs in step."""
        if not self.pairs:
            return
        for p, m in self.pairs:
            p._acc, p._owner = m._acc, opt
        opt._masters = self     # (amp.GradScaler reads the pairs' gradient flags)
        if not self.keep:
            warnings.warn(f"{kind}: half-precision params without master_weights=True are "
                          f"updated in float32 and rounded back each step, so updates below "
                          f"the half format's resolution are lost; pass master_weights=True "
                          f"to keep float32 master weights", RuntimeWarning, stacklevel=4)
        opt.step = self._wrap(opt.step, grads=True)
        opt.flush = self._wrap(opt.flush)
        opt.zero_grad = self._wrap(opt.zero_grad)
        opt.load_state_dict = self._wrap_load(opt.load_state_dict)
        opt.state_dict = self._wrap_save(opt.state_dict)

    def _wrap(self, method: Callable, grads: bool = False) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            if grads and args and isinstance(args[0], Mapping):
                args = (self._remap(args[0]),) + args[1:]
            self.sync_flags()
            self.refresh()
            applied = method(*args, **kwargs)
            self.flags_back()
            if applied is True:
                self.write_back()
            return applied

        run.__doc__ = method.__doc__
        return run

    def sync_flags(self) -> None:
        """A half param's gradient flag (set by the backward) onto its master."""
        for p, m in self.pairs:
            if p._live:
                m._live = True

    def flags_back(self) -> None:
        """Each half param's gradient flag from its master's (after the window
        applied, dropped or cleared it)."""
        for p, m in self.pairs:
            p._live = m._live

    def refresh(self) -> None:
        """Widen into its master each half param written since the master last
        matched it (every one without ``keep``: re-read before each update)."""
        for i, (p, m) in enumerate(self.pairs):
            stamp = getattr(p, "_stamp", 0)
            if not self.keep or stamp != self.synced[i]:
                _half.widen(m._kern, p._data, m._data)
                self.synced[i] = stamp

    def _wrap_save(self, method: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            out = method(*args, **kwargs)
            self.refresh()
            out["masters"] = [kernels.to_host(m._kern, m._data) for _, m in self.pairs]
            return out

        run.__doc__ = method.__doc__
        return run

    def _wrap_load(self, method: Callable) -> Callable:
        def run(state: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
            saved = self._checked(state.get("masters") if isinstance(state, Mapping) else None)
            out = method(state, *args, **kwargs)
            if saved is None:      # a state dict without masters: they are the params
                self.refresh()
            else:
                for (p, m), array in zip(self.pairs, saved):
                    kernels.call(m._kern, "upload", 0, array, m._data)
                self.write_back()
            return out

        run.__doc__ = method.__doc__
        return run

    def _checked(self, saved: Any) -> list[np.ndarray] | None:
        """A state dict's masters as float32 host arrays, or None when it has
        none; a ValueError (before anything changes) when they do not fit."""
        if saved is None:
            return None
        if len(saved) != len(self.pairs):
            raise ValueError(f"state dict holds {len(saved)} master weights, this optimizer "
                             f"{len(self.pairs)} half params")
        out = []
        for (p, _), array in zip(self.pairs, saved):
            array = np.asarray(array)
            if array.shape != p.shape or array.dtype != _F32:
                raise ValueError(f"state dict master weight ({array.dtype}, shape "
                                 f"{array.shape}) does not fit a {p.dtype} param of shape "
                                 f"{p.shape} (float32 masters)")
            out.append(np.asarray(array, order="C"))     # (a 0-d one stays 0-d)
        return out

    def _remap(self, grads: Mapping) -> dict:
        """``{param.id: gradient}`` with each half param's entry moved to its master."""
        out = dict(grads)
        for p, m in self.pairs:
            g = out.pop(p.id, None)
            if g is not None:
                out[m.id] = _half.widen(p._kern, g) if g.dtype in _dtypes.HALVES else g
        return out

    def write_back(self) -> None:
        """Each half param = its master rounded to the param's format (a write
        in place, noted as such)."""
        for p, m in self.pairs:
            _half.narrow(p._kern, m._data, p._data)
        note_writes([p for p, _ in self.pairs])
        self.synced = [getattr(p, "_stamp", 0) for p, _ in self.pairs]
