"""The accumulation window: what happens between one applied update and the next.

A window collects ``accumulate_steps`` micro-steps (as optax's ``MultiSteps``
wraps a transformation): either each param's ``.grad`` (``step()``) or the
optimizer's own buffer (``step(grads)``), one spelling per window. At the
boundary it reduces across ranks (the distributed hook), works out the
scale (1/k, 1 or 1/samples), checks the total for NaN/infinity and clips
it in one reduction pass, and hands the update to the rule. One CPU group
below the threading threshold closes in one call of its rule's boundary
kernel (``Boundary``, which ``ng.compile``'s step runs too); the same
scalar rule (``boundary.clip_scale``) decides the scale either way.
"""
from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from .. import kernels
from ..kernels import cpu as cpu_kernels
from ..kernels.cpu import boundary as bk
from ..kernels.cpu import optim as optim_kernels
from ..tensor import Tensor, new_stamp
from . import _checks
from .groups import COUNT_LIMIT, Group
from .rules import BoundaryKernel, Rule

# taken while a thread claims a window (once per window), shared by all windows
_CLAIMING = threading.Lock()


class WindowHook(Protocol):
    """What ``numbagrad.distributed`` plugs into a window."""

    def reduce(self, buffers: list, sizes: list[int], pos: int, count: int
               ) -> tuple[int, int] | None:
        """Sum each gradient buffer across ranks in place (one allreduce each; the
        first also carries ``count``: the window's samples under average="samples",
        else its micro-steps ``pos``). Return (ranks, summed count), or None when
        there is nothing to apply (every rank's count is 0: an empty ``flush``)."""


class Window:
    """Positions, spellings, samples, flush, non-finite checks and clipping.

    A window belongs to one thread at a time (``claim``): the first thread
    that accumulates into it (backward, step, ...) holds it until the update
    that closes it, or ``zero_grad``; another thread's use meanwhile raises.
    """

    def __init__(self, groups: list[Group], names: dict[int, str], accumulate_steps: int,
                 average: bool | str, max_grad_norm: float | None, nonfinite: str,
                 kind: str = "optimizer") -> None:
        self.kind = kind             # the optimizer's class name, for messages
        self.groups = groups
        self.names = names
        self.index = {p.id: (group, i) for group in groups for i, p in enumerate(group.params)}
        self.accumulate_steps = accumulate_steps
        self.average = average
        self.max_grad_norm = max_grad_norm
        self.nonfinite = nonfinite
        self.t = 0                   # applied updates
        self.pos = 0                 # micro-steps in the current window
        self.mode: str | None = None  # "grad" or "map" inside a window
        self.samples = 0             # samples= summed over the current window
        self.skipped = 0             # windows dropped by nonfinite="skip"
        self.last_grad_norm: float | None = None
        self.hook: WindowHook | None = None
        self.all_live = False        # update every param, reached or not (distributed)
        self.boundary: Boundary | bool | None = None   # built on the first close; False: none
        # Whether a gradient reached a param's .grad since the last step()
        # (backward's ``_Backward.dest``, ``run_backward``, the .grad setter):
        # a step() without one is not counted (``warn_unfed``).
        self.fed = False
        # The ident of the thread holding the window, or None (see claim).
        self.thread: int | None = None

    # ------------------------------------------------------- threads
    def claim(self, what: str) -> None:
        """Make the calling thread the window's holder, or raise a RuntimeError.

        A thread that holds the window is the only one that changes
        ``thread`` (``release``); the lock makes two threads' takeovers of a
        free window (or one whose holder has ended) one after the other.
        (The hot paths, the backward pass per param and a compiled step, make
        the holder check inline before calling.)
        """
        me = threading.get_ident()
        if self.thread == me:
            return
        with _CLAIMING:
            if self.thread is not None:   # another thread's, or one that has ended
                self.check_free(what)
            self.thread = me

    def check_free(self, what: str) -> None:
        """Raise as ``claim`` would if another live thread holds the window;
        take nothing (for calls that only read it)."""
        held = self.thread
        if held is not None and held != threading.get_ident():
            holder = next((t for t in threading.enumerate() if t.ident == held), None)
            if holder is not None:
                raise RuntimeError(self._refusal(what, holder))

    def release(self) -> None:
        """Give up the window if the calling thread holds it (it is closed or empty)."""
        if self.thread == threading.get_ident():
            self.thread = None

    def release_if_idle(self) -> None:
        """Release the window if it holds nothing: no micro-step and no ``.grad``."""
        if not self.pos and not any(p._live for g in self.groups for p in g.params):
            self.release()

    def _refusal(self, what: str, holder: threading.Thread) -> str:
        return (f"{self.kind} over {self._param_names()}: {what} in thread "
                f"{threading.current_thread().name!r}, but thread {holder.name!r} holds this "
                f"optimizer's open accumulation window (accumulate_steps="
                f"{self.accumulate_steps}). A window belongs to one thread at a time, from "
                f"its first backward() or step() to the update that closes it, so that no "
                f"micro-step of one thread lands in another's window; this optimizer is unchanged. "
                f"Give each thread its own optimizer (and params), or end the window in "
                f"{holder.name!r} first (its last step(), flush() or zero_grad())")

    # ------------------------------------------------------- micro-steps
    def check_samples(self, samples: Any) -> int:
        """``samples=`` of one micro-step, checked against the average mode."""
        if self.average != "samples":
            if samples is not None:
                raise ValueError(f"step(samples={samples!r}) needs average='samples'; this "
                                 f"optimizer has average={self.average!r}")
            return 0
        if samples is None:
            raise ValueError("average='samples': every step() must pass samples=n, the "
                             "number of samples in this micro-batch (gradients as sums)")
        n = _checks.positive_int("samples", samples)
        if self.hook is not None and self.samples + n >= COUNT_LIMIT:
            raise ValueError(f"a window of {self.samples + n} samples is more than "
                             f"DistributedOptimizer can count ({COUNT_LIMIT - 1})")
        return n

    def plan(self, grads: Any) -> list[tuple[Group, int, Any]] | None:
        """Check the spelling and every passed gradient before any is used."""
        if grads is None:
            if self.mode == "map":
                raise RuntimeError("step() without grads inside a window begun with "
                                   "step(grads); keep one spelling per window")
            return None
        if self.mode == "grad":
            raise RuntimeError("step(grads) inside a window begun with step() "
                               "(which reads .grad); keep one spelling per window")
        if not isinstance(grads, Mapping):
            raise TypeError(f"step(grads) takes a mapping {{param.id: array}} such as "
                            f"ng.backward returns, got {type(grads).__name__}")
        plan = []
        for key, array in grads.items():
            where = self.index.get(key)
            if where is None:
                continue   # a param this optimizer does not own
            group, i = where
            p = group.params[i]
            if isinstance(array, Tensor):
                array = array.data
            what = f"step(grads): gradient for {self.names[p.id]} (id {p.id})"
            if not group.kern.is_device_array(array):
                raise TypeError(f"{what} is {type(array).__name__}; the param is on "
                                f"{p.device} and needs a {p.device} array")
            if array.shape != p.shape or array.dtype != p.dtype:
                raise ValueError(f"{what} has shape {array.shape} and dtype {array.dtype}; "
                                 f"the param has shape {p.shape} and dtype {p.dtype}")
            plan.append((group, i, array))
        return plan

    def warn_if_empty(self, plan: list | None, closing: int = 0) -> None:
        """Warn (before anything changes) about micro-steps and windows that add nothing.

        ``closing`` is the number of micro-steps of the window closing now (0
        when this micro-step does not close it).
        """
        if plan is not None and not plan:
            warnings.warn(f"step(grads): the mapping holds a gradient for none of this "
                          f"optimizer's params ({self._param_names()}); this micro-step "
                          f"adds nothing", RuntimeWarning, stacklevel=3)
        if closing and not self._holds_gradient(plan):
            warnings.warn(f"the window of {closing} micro-step(s) closing now holds no "
                          f"gradient for any of this optimizer's params "
                          f"({self._param_names()})", RuntimeWarning, stacklevel=3)

    def warn_unfed(self) -> None:
        """The warning for a step() that no gradient reached: it is not counted."""
        warnings.warn(f"{self.kind}.step() was called with no gradient reaching its params "
                      f"({self._param_names()}) since the last step() (no backward() into "
                      f"them, no .grad set); it is not counted as a micro-step "
                      f"({self.pos} of accumulate_steps={self.accumulate_steps} pending, "
                      f"t={self.t}) and returns False", RuntimeWarning, stacklevel=4)

    def _holds_gradient(self, plan: list | None) -> bool:
        if plan:
            return True
        if plan is not None or self.mode == "map":
            return any(any(g.seen) for g in self.groups)
        return any(p._live for g in self.groups for p in g.params)

    def _param_names(self) -> str:
        return _checks.name_list([self.names[p.id] for g in self.groups for p in g.params])

    def record(self, plan: list | None, samples: int) -> None:
        """Count one checked micro-step, adding a mapping's arrays into the window buffer."""
        if plan is not None:
            for group, i, array in plan:
                group.window()
                kernels.call(group.kern, "axpby", array.size, 1.0, array, 1.0,
                             group.win_views[i])
                group.seen[i] = True
        self.mode = "grad" if plan is None else "map"
        self.pos += 1
        self.samples += samples
        self.fed = False

    # -------------------------------------------------------- boundary
    def close(self, rule: Rule, lrs: list[float], positions: int | None = None,
              stacklevel: int = 4) -> bool:
        """Apply the window's total; False if it was skipped as non-finite (or,
        with a distributed hook, if every rank's window was empty).

        ``lrs`` holds each group's learning rate (its param group's).
        ``positions`` is how many micro-steps the window holds (``flush``
        passes it); with a distributed hook its allreduce sums them instead. A
        ``.grad`` window with a ``Boundary`` (no hook, not ``average="samples"``)
        closes in one kernel call; anything else, and a non-finite total,
        takes the Python path below (the same kernels and ``clip_scale``).
        """
        mode = self.mode or "grad"
        fused = self.boundary
        if fused is None:
            fused = self.fused_boundary(rule)
        if fused and mode == "grad" and self.hook is None and self.average != "samples" \
                and fused.close(lrs[0], self.pos if positions is None else positions):
            return True
        buffers = []
        for group in self.groups:
            if mode == "grad":
                buffers.append(group.g)
                flags = group.grad_flags()
            else:
                buffers.append(group.window())
                flags = tuple(group.seen)
            group.set_live((True,) * len(flags) if self.all_live else flags)
        ranks, samples = 1, self.samples
        if self.hook is not None:
            counting = self.average == "samples"
            reduced = self.hook.reduce(buffers, [g.size for g in self.groups], self.pos,
                                       samples if counting else self.pos)
            if reduced is None:
                return False   # every rank's window is empty: nothing to apply
            ranks, total = reduced
            samples, positions = (total, positions) if counting else (samples, total)
        scale = 1.0 / self.divisor(positions if positions is not None else self.pos * ranks,
                                   ranks, samples)

        sq = sum(g.sum_of_squares(flat) for g, flat in zip(self.groups, buffers)) \
            if self.measured() else 0.0
        scale, norm, ok = bk.clip_scale(scale, sq, *self.norm_rule())
        if not ok:
            bad = [self.names[g.params[i].id] for g, flat in zip(self.groups, buffers)
                   for i in g.nonfinite(flat)]
            if bad:
                return self._drop(mode, bad, stacklevel)
        for group, flat, lr in zip(self.groups, buffers, lrs):
            rule.update(group, flat, lr, scale)
        self.last_grad_norm = None if norm < 0 else norm   # -1.0: not needed
        self.finish(mode)
        return True

    def fused_boundary(self, rule: Rule) -> Boundary | bool:
        """The window's ``Boundary`` (built on first use, ``rule``'s), or False: none."""
        if self.boundary is None:
            self.boundary = Boundary.build(self, rule) or False
        return self.boundary

    def measured(self) -> bool:
        """Whether a close needs the total's norm (to clip it or to check it)."""
        return self.max_grad_norm is not None or self.nonfinite != "ignore"

    def norm_rule(self) -> tuple[float, bool]:
        """``clip_scale``'s (max_norm, check): ``max_grad_norm`` (-1.0: no clipping)
        and whether a non-finite total must be caught."""
        return (-1.0 if self.max_grad_norm is None else self.max_grad_norm,
                self.nonfinite != "ignore")

    def divisor(self, positions: int, ranks: int = 1, samples: int = 0) -> int:
        """What the window's total is divided by: its micro-steps (average=True),
        its samples ("samples") or the ranks (False: a sum on each rank)."""
        if self.average == "samples":
            return samples
        return positions if self.average else ranks

    def finish(self, mode: str) -> None:
        """After an applied update (whose kernel zeroed the total): the params it
        wrote (those flagged live) noted as written in place, so a graph
        recorded before it refuses to run backward; then a new window."""
        stamp = new_stamp()     # (tensor.note_writes' loop, inline: a close is a hot path)
        for g in self.groups:
            for p, live in zip(g.params, g.live_flags or ()):
                if live:
                    p._stamp = stamp
        self._clear(mode, zeroed=True)
        self.t += 1

    def _drop(self, mode: str, bad: list[str], stacklevel: int) -> bool:
        """Discard a non-finite window, then raise or warn as ``nonfinite`` says."""
        t = self.t
        self.discard(mode)
        what = (f"non-finite gradient (NaN or infinity) in the window for update t={t} in "
                f"{_checks.name_list(bad)}; nothing was applied and the window was discarded")
        if self.nonfinite == "raise":
            raise FloatingPointError(f"{what} (nonfinite='raise'; 'skip' drops such windows "
                                     f"with a warning)")
        self.skipped += 1
        warnings.warn(f"{what} (nonfinite='skip': {self.skipped} skipped so far)",
                      RuntimeWarning, stacklevel=stacklevel)
        return False

    def discard(self, mode: str | None = None) -> None:
        """Zero the accumulators of the current window and restart it."""
        self._clear(mode or self.mode or "grad", zeroed=False)

    def _clear(self, mode: str, zeroed: bool) -> None:
        for group in self.groups:
            if mode == "grad":
                if not zeroed:
                    kernels.call(group.kern, "fill", 0, group.g, 0.0)
                for p in group.params:
                    p._live = False
            else:
                if not zeroed:
                    kernels.call(group.kern, "fill", 0, group.window(), 0.0)
                group.seen = [False] * len(group.params)
        self.pos = 0
        self.mode = None
        self.samples = 0
        self.fed = False
        self.release()

    # ------------------------------------------------------------ .grad
    def zero_grad(self) -> None:
        self.fed = False   # what reached .grad is discarded
        if self.mode == "grad" and self.pos:
            warnings.warn(f"zero_grad() discarded {self.pos} accumulated micro-batch(es) "
                          f"of an unfinished window (accumulate_steps="
                          f"{self.accumulate_steps}); the window starts again",
                          RuntimeWarning, stacklevel=3)
            self.pos = 0
            self.mode = None
            self.samples = 0
        for group in self.groups:
            if any(p._live for p in group.params):
                kernels.call(group.kern, "fill", 0, group.g, 0.0)
                for p in group.params:
                    p._live = False


class Boundary:
    """A window's close as one call of its rule's boundary kernel.

    For a window of one CPU group below the optimizer kernels' threading
    threshold (above it the update dominates and the Python path picks the
    faster variant) whose rule has a boundary kernel. ``Window.close`` runs
    it for a ``.grad`` window without a distributed hook or
    ``average="samples"``; ``ng.compile``'s step runs the same kernel
    (armed by ``FusedUpdate``) and then calls ``applied``.
    """

    __slots__ = ("after", "args", "ctl", "cells", "group", "kernel", "run", "sent", "values",
                 "win")

    def __init__(self, win: Window, spec: BoundaryKernel, ctl: np.ndarray) -> None:
        self.win = win
        self.group = win.groups[0]
        self.kernel, self.args, self.values, self.after = spec
        self.ctl = ctl
        self.cells = memoryview(ctl)   # ctl's elements as Python floats (cheaper than ctl[i])
        self.sent: tuple = ()   # the values last written to ctl[LR:]
        # The kernel's compiled specialisation for ``args`` (the same arrays on
        # every close, so the same types), found after the first, dispatched,
        # close: calling it skips Numba's typing of a dozen arrays per close.
        self.run = None

    @classmethod
    def build(cls, win: Window, rule: Rule) -> Boundary | None:
        """``win``'s boundary, or None where the Python path must close it."""
        if len(win.groups) != 1:
            return None
        group = win.groups[0]
        if group.kern.name != "cpu" or optim_kernels._threaded(group.size):
            return None
        ctl = np.zeros(bk.SIZE, np.float64)
        spec = rule.boundary_kernel(group, np.zeros(1, np.float64), ctl)
        return None if spec is None else cls(win, spec, ctl)

    def arm(self, lr: float, positions: int, live: tuple) -> None:
        """Fill ``ctl`` for a window of ``positions`` micro-steps closing now,
        updating the params flagged in ``live``."""
        win = self.win
        values = (lr, 1.0 / win.divisor(positions), *win.norm_rule(), *self.values())
        if values != self.sent:
            self.ctl[bk.LR:bk.LR + len(values)] = values
            self.sent = values
        self.group.set_live(live)
        self.cells[bk.CLOSING] = 1.0    # the boundary kernel sets it back to 0

    def close(self, lr: float, positions: int, live: tuple | None = None) -> bool:
        """Close the ``.grad`` window now (``live``: the group's ``grad_flags()``,
        if the caller has them): True when the update was applied. False (a
        non-finite total) changes nothing that ``Window.close`` reads."""
        self.arm(lr, positions, self.group.grad_flags() if live is None else live)
        run = self.run
        if run is None:
            self.kernel(*self.args)
            self.run = cpu_kernels.entry_point(self.kernel, self.args) or self.kernel
        else:
            run(*self.args)
        return self.applied()

    def applied(self) -> bool:
        """After the kernel ran: False if it applied nothing, else the window's
        bookkeeping (a new window) and True."""
        cells = self.cells
        if cells[bk.STATUS] == 0.0:
            return False
        if self.after is not None:
            self.after()
        win = self.win
        norm = cells[bk.NORM]
        win.last_grad_norm = None if norm < 0 else norm   # clip_scale's -1.0: not needed
        win.finish("grad")
        return True

    def disarm(self) -> None:
        """The armed kernel did not run: no boundary is pending."""
        self.ctl[bk.CLOSING] = 0.0
