"""An optimizer's micro-step split for ``ng.compile``: Python bookkeeping
around a boundary kernel that the compiled step calls itself.

``begin()`` runs before the compiled step and changes nothing: it says
whether this micro-step can be fused and, when it closes the window, fills
``ctl`` (learning rate, scale, clipping, hyper-parameters) for the boundary
kernel (``numbagrad/kernels/cpu/boundary.py``). ``commit()`` runs after it
and does the window's bookkeeping, exactly as ``Optimizer.step()`` would
have. A micro-step that cannot be fused (another spelling inside the
window, ``average="samples"``, a distributed hook, a non-finite total) runs
``opt.step()`` itself, so every error and warning is eager mode's.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..kernels.cpu import boundary as bk
from ..kernels.cpu import optim as optim_kernels
from ..tensor import Tensor
from .optimizer import Optimizer
from .window import CLIP_EPS


class FusedUpdate:
    """The window boundary of ``opt`` as one kernel call inside a compiled step.

    Build it with ``FusedUpdate.build``, which returns None unless the
    update can run inside the compiled step: a numbagrad optimizer with one
    CPU group (one dtype), every param reached by the step (so every param
    holds a gradient at every boundary, as the compiled step marks them),
    an update rule with a boundary kernel, and a group below the threaded
    kernels' size threshold (above it the update dominates the step and
    ``opt.step()`` picks the faster variant, as in eager mode).
    """

    __slots__ = ("all_live", "args", "ctl", "group", "kernel", "opt", "rule", "sent", "win")

    # begin()'s answers
    PYTHON, COUNT, CLOSE = 0, 1, 2

    def __init__(self, opt: Optimizer, kernel: Any, args: tuple, ctl: np.ndarray) -> None:
        self.opt = opt
        self.win = opt._window
        self.rule = opt._rule
        self.group = self.win.groups[0]
        self.kernel = kernel
        self.args = args
        self.ctl = ctl
        self.all_live = (True,) * len(self.group.params)
        self.sent: tuple = ()  # the values last written to ctl[LR:]

    @classmethod
    def build(cls, opt: Any, reached: list[Tensor]) -> FusedUpdate | None:
        if not isinstance(opt, Optimizer) or len(opt._window.groups) != 1:
            return None
        group = opt._window.groups[0]
        if group.kern.name != "cpu" or optim_kernels._threaded(group.size):
            return None
        ids = {id(p) for p in reached}
        if any(id(p) not in ids for p in group.params):
            return None
        sq = np.zeros(1, np.float64)
        ctl = np.zeros(bk.SIZE, np.float64)
        fused = opt._rule.fused(group, sq, ctl)
        if fused is None:
            return None
        return cls(opt, fused[0], fused[1], ctl)

    def begin(self) -> int:
        """What this micro-step is, changing no state: COUNT (fused, inside the
        window), CLOSE (fused, closing it: ``ctl`` is armed) or PYTHON (call
        ``opt.step()`` after the compiled step)."""
        win = self.win
        if win.hook is not None or win.mode == "map" or win.average == "samples" \
                or self.opt._taken:
            return self.PYTHON
        if win.pos + 1 < win.accumulate_steps:
            return self.COUNT
        try:
            lr = self.opt._lr_for(win.t)
        except Exception:  # noqa: BLE001 (opt.step() raises it after the backward, as eager)
            return self.PYTHON
        self._arm(lr, win.accumulate_steps, self.all_live)
        return self.CLOSE

    def _arm(self, lr: float, positions: int, live: tuple) -> None:
        """Fill ``ctl`` for a window of ``positions`` micro-steps closing now."""
        win, rule = self.win, self.rule
        values = (lr, 1.0 / win.divisor(positions),
                  -1.0 if win.max_grad_norm is None else win.max_grad_norm, CLIP_EPS,
                  1.0 if win.nonfinite != "ignore" else 0.0,
                  rule.fused_parity(self.group, self.args), *rule.fused_hyper())
        if values != self.sent:
            self.ctl[bk.LR:bk.LR + len(values)] = values
            self.sent = values
        self.group.set_live(live)
        self.ctl[bk.CLOSING] = 1.0    # the boundary kernel sets it back to 0

    def close_now(self, lr: float) -> bool:
        """Eager ``step()``'s boundary as one call of the same kernel: True when
        the update was applied and the window closed. False changes nothing
        that ``Window.close`` reads: a window of ``step(grads)`` or one with a
        distributed hook, ``average="samples"`` or a non-finite total (the
        kernel then writes nothing) is left to ``Window.close``, which finds
        the culprits and raises or skips."""
        win = self.win
        if win.mode != "grad" or win.hook is not None or win.average == "samples":
            return False
        self._arm(lr, win.pos, self.group.grad_flags())
        self.kernel(*self.args)
        if self.ctl[bk.STATUS] == 0.0:
            return False
        self._applied()
        return True

    def disarm(self) -> None:
        """The compiled step did not run: no boundary is pending."""
        self.ctl[bk.CLOSING] = 0.0

    def commit(self) -> None:
        """After a compiled step that began with CLOSE: close the window if the
        boundary kernel applied its update, else let ``opt.step()`` do it."""
        if self.ctl[bk.STATUS] == 0.0:     # non-finite: eager mode's path, from the start
            self.opt.step()
            return
        self._applied()

    def _applied(self) -> None:
        """The window's bookkeeping after the boundary kernel applied its update."""
        win = self.win
        self.rule.after_update(self.group)
        win.last_grad_norm = (float(self.ctl[bk.NORM]) if win.max_grad_norm is not None
                              or win.nonfinite != "ignore" else None)
        win.finish("grad")
