"""Float32 master weights for half-precision params (``master_weights=True``).

A float16 or bfloat16 param cannot take a small update: bfloat16 keeps 8
significant bits, so ``w -= lr * g`` rounds back to ``w`` whenever the step
is below half a unit in its last place. The optimizer therefore updates a
float32 master copy of each half param: the master is what its flat
buffers hold (its state dict saves it, Adam's moments are float32), the
half param's ``.grad`` is the master's float32 accumulator (so a window of
micro-steps accumulates in float32: the half-to-float32 cast's backward
writes straight into it), and each applied update writes the master,
rounded to nearest even, back into the half param.

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
        return m

    def attach(self, opt: Any, kind: str) -> None:
        """Point each half param's accumulator at its master's, and wrap the
        optimizer's window methods to keep the pairs in step."""
        if not self.pairs:
            return
        for p, m in self.pairs:
            p._acc, p._owner = m._acc, opt
        if not self.keep:
            warnings.warn(f"{kind}: half-precision params without master_weights=True are "
                          f"updated in float32 and rounded back each step, so updates below "
                          f"the half format's resolution are lost; pass master_weights=True "
                          f"to keep float32 master weights", RuntimeWarning, stacklevel=4)
        opt.step = self._wrap(opt.step, grads=True)
        opt.flush = self._wrap(opt.flush)
        opt.zero_grad = self._wrap(opt.zero_grad)
        opt.load_state_dict = self._wrap_load(opt.load_state_dict)

    def _wrap(self, method: Callable, grads: bool = False) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            if grads and args and isinstance(args[0], Mapping):
                args = (self._remap(args[0]),) + args[1:]
            for p, m in self.pairs:
                if p._live:
                    m._live = True
                if not self.keep:
                    _half.widen(m._kern, p._data, m._data)
            applied = method(*args, **kwargs)
            for p, m in self.pairs:
                p._live = m._live
            if applied is True:
                self.write_back()
            return applied

        run.__doc__ = method.__doc__
        return run

    def _wrap_load(self, method: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            out = method(*args, **kwargs)
            self.write_back()
            return out

        run.__doc__ = method.__doc__
        return run

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
