"""An optimizer's micro-step split for ``ng.compile``: the window's
``Boundary`` (``window.py``) run inside the compiled step.

``begin()`` runs before the compiled step and changes nothing: it says
whether this micro-step can be fused and, when it closes the window, arms
the boundary kernel. ``commit()`` runs after it and does what
``Optimizer.step()`` would have: count the micro-step, finish the window
the kernel closed, or call ``opt.step()`` itself for a micro-step that
cannot be fused (another spelling inside the window, ``average="samples"``,
a distributed hook, a non-finite total), so every error and warning is
eager mode's.
"""
from __future__ import annotations

from typing import Any

from ..tensor import Tensor
from .optimizer import Optimizer
from .window import Boundary


class FusedUpdate:
    """The window boundary of ``opt`` as one kernel call inside a compiled step.

    Build it with ``FusedUpdate.build``, which returns None unless the
    window has a ``Boundary`` (a numbagrad optimizer with one small CPU
    group and a rule with a boundary kernel) and every param is reached by
    the step (so every param holds a gradient at every boundary, as the
    compiled step marks them). ``kernel``, ``args`` and ``ctl`` are the
    boundary's, for the code generator.
    """

    __slots__ = ("all_live", "args", "boundary", "ctl", "kernel", "opt", "win")

    # begin()'s answers
    PYTHON, COUNT, CLOSE = 0, 1, 2

    def __init__(self, opt: Optimizer, boundary: Boundary) -> None:
        self.opt = opt
        self.win = opt._window
        self.boundary = boundary
        self.kernel, self.args, self.ctl = boundary.kernel, boundary.args, boundary.ctl
        self.all_live = (True,) * len(boundary.group.params)

    @classmethod
    def build(cls, opt: Any, reached: list[Tensor]) -> FusedUpdate | None:
        if not isinstance(opt, Optimizer):
            return None
        boundary = opt._window.fused_boundary(opt._rule)
        if not boundary:
            return None
        ids = {id(p) for p in reached}
        if any(id(p) not in ids for p in boundary.group.params):
            return None
        return cls(opt, boundary)

    def begin(self) -> int:
        """What this micro-step is, changing no state: COUNT (fused, inside the
        window), CLOSE (fused, closing it: the kernel is armed) or PYTHON
        (``opt.step()`` after the compiled step)."""
        win = self.win
        if win.hook is not None or win.mode == "map" or win.average == "samples" \
                or self.opt._taken:
            return self.PYTHON
        if win.pos + 1 < win.accumulate_steps:
            return self.COUNT
        try:
            lr = self.opt._lr_for(win.t)[0]
        except Exception:  # noqa: BLE001 (opt.step() raises it after the backward, as eager)
            return self.PYTHON
        self.boundary.arm(lr, win.accumulate_steps, self.all_live)
        return self.CLOSE

    def disarm(self) -> None:
        """The compiled step did not run: no boundary is pending."""
        self.boundary.disarm()

    def commit(self, begun: int) -> None:
        """After a compiled step that began with ``begun``: count it, finish the
        window its kernel closed, or else run ``opt.step()`` (a non-finite
        total then takes eager mode's path from the start)."""
        if begun == self.COUNT:
            win = self.win
            win.mode = "grad"
            win.pos += 1
            win.fed = False
        elif begun != self.CLOSE or not self.boundary.applied():
            self.win.fed = True   # the compiled step's backward wrote every param's .grad
            self.opt.step()
