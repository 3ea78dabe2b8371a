"""The optimizers: a window (``window.py``) feeding an update rule (``rules.py``).

``Optimizer`` packs the params into flat buffers (``groups.py``), owns the
learning rate (a float or a schedule) and the state dict; everything about
micro-steps is the window's, everything about the update formula the rule's.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from threading import get_ident
from typing import Any

import numpy as np

from .. import kernels
from ..tensor import Tensor
from . import _checks, param_groups, schedules
from .groups import TAIL, Group
from .master import Masters
from .rules import AdamRule, Rule, SGDRule
from .window import Window


class Optimizer:
    """Base class: params in flat buffers, an accumulation window and an update rule.

    ``step()`` closes a window every ``accumulate_steps`` calls: the first
    k-1 calls change nothing and return False, the k-th applies one update
    from the window's total and returns True.

    Threads: a window belongs to one thread at a time, from the first
    ``backward()`` into the optimizer's params (or ``step()``, ``flush()``,
    ...) to the update that closes it (or ``zero_grad()``). Another thread's
    ``backward()`` into those params, ``step``, ``flush``, ``zero_grad``,
    ``state_dict`` or ``load_state_dict`` meanwhile raises a RuntimeError
    naming the optimizer and both threads, before anything changes, rather
    than mixing its micro-step into the open window: the optimizer cannot
    see where another thread's micro-step begins (backward writes ``.grad``
    directly), so it cannot serialise whole micro-steps. Between windows
    any thread may take it up, as it may a window whose thread has ended
    or one just loaded by ``load_state_dict``. Give each thread its own
    optimizer to train in parallel.

    ``master_weights=True`` (SGD, Adam, AdamW): each float16/bfloat16 param
    is updated through a float32 master copy, its gradient window summed in
    float32 (``optim/master.py``; then ``opt.params`` and the state dict
    hold the masters, and a half param's ``.grad`` is its float32 total).
    """

    def __init__(self, params: Any, rule: Rule, lr: Any, accumulate_steps: Any,
                 average: Any, max_grad_norm: Any, nonfinite: Any,
                 master_weights: bool = False) -> None:
        kind = type(self).__name__
        if not isinstance(master_weights, bool):
            raise TypeError(f"{kind}: master_weights must be True or False, got "
                            f"{master_weights!r}")
        split = param_groups.split(params, kind)
        lr = _checks.lr_or_schedule(lr)
        k = _checks.steps(accumulate_steps)
        average = _checks.average(average)
        max_grad_norm = _checks.max_grad_norm(max_grad_norm)
        nonfinite = _checks.nonfinite(nonfinite)
        checks = {"lr": _checks.lr_or_schedule, **rule.group_checks()}
        defaults = {"lr": lr, **rule.group_defaults()}
        user = []
        for gi, (plist, _, keys) in enumerate(split):
            made = param_groups.ParamGroup(plist, defaults, checks, rule.fixed(), kind)
            try:
                made.update(keys)
            except (KeyError, ValueError) as exc:
                raise ValueError(f"{kind}: param_groups[{gi}]: {exc.args[0]}") from None
            user.append(made)
        # Validation is over; from here on the optimizer is built.
        self._rule = rule
        self._taken = False   # set when another optimizer adopts one of our params
        self.param_groups: list[param_groups.ParamGroup] = user
        groups = []
        names = {}
        masters = Masters(master_weights)   # float32 copies of half params (master.py)
        for made, (plist, pnames, _) in zip(user, split):
            by_key: dict[tuple, list[Tensor]] = {}
            for p, name in zip(plist, pnames):
                p = masters.master(p)
                by_key.setdefault((p.device, p.dtype), []).append(p)
                names[p.id] = name
            for ps in by_key.values():
                group = Group(ps, self)
                group.hyper = made
                group.slots = rule.new_slots(group)
                groups.append(group)
        self._window = Window(groups, names, k, average, max_grad_norm, nonfinite, kind)
        # A .grad set before the optimizer was built feeds its first step().
        self._window.fed = any(p._live for g in groups for p in g.params)
        masters.attach(self, kind)

    # ------------------------------------------------------- properties
    @property
    def lr(self) -> float:
        """The learning rate the next update will use (a schedule evaluated at ``t``).

        Setting it sets every param group's ``"lr"``. With groups of different
        rates reading it raises: read ``opt.param_groups[i]["lr"]``.
        """
        return self._group_lr(self._shared("lr"), self._window.t)

    @lr.setter
    def lr(self, value: float | Callable[[int], float]) -> None:
        value = _checks.lr_or_schedule(value)
        for pg in self.param_groups:
            dict.__setitem__(pg, "lr", value)

    @property
    def _lr(self) -> Any:
        """The lr as given (a float or a schedule) when every group shares it."""
        return self._shared("lr")

    def _shared(self, key: str) -> Any:
        """A hyper-parameter every param group shares, or a ValueError naming theirs."""
        groups = self.param_groups
        first = groups[0][key]
        for pg in groups[1:]:
            if pg[key] is not first and pg[key] != first:
                values = ", ".join(f"{pg.get(key)!r}" for pg in groups)
                raise ValueError(f"{type(self).__name__}: {key} differs between the param "
                                 f"groups ({values}); read opt.param_groups[i][{key!r}]")
        return first

    @property
    def t(self) -> int:
        """How many updates have been applied (windows completed)."""
        return self._window.t

    @property
    def params(self) -> tuple[Tensor, ...]:
        return tuple(p for group in self._window.groups for p in group.params)

    @property
    def pending_steps(self) -> int:
        """How many micro-steps the current window holds so far."""
        return self._window.pos

    @property
    def pending_samples(self) -> int:
        """The samples passed to the current window so far (average="samples")."""
        return self._window.samples

    @property
    def accumulate_steps(self) -> int:
        return self._window.accumulate_steps

    @property
    def average(self) -> bool | str:
        return self._window.average

    @property
    def max_grad_norm(self) -> float | None:
        return self._window.max_grad_norm

    @property
    def nonfinite(self) -> str:
        return self._window.nonfinite

    @property
    def skipped(self) -> int:
        """Windows dropped as non-finite under ``nonfinite="skip"``."""
        return self._window.skipped

    @property
    def last_grad_norm(self) -> float | None:
        """The pre-clip L2 norm of the last applied window's total gradient.

        None before the first update, or when nothing needs the norm
        (``max_grad_norm=None`` and ``nonfinite="ignore"``).
        """
        return self._window.last_grad_norm

    @property
    def _groups(self) -> list[Group]:
        return self._window.groups

    # ------------------------------------------------------- the window
    def step(self, grads: Mapping[int, Any] | None = None, *, samples: int | None = None
             ) -> bool:
        """Count one micro-step; apply the update on the k-th and return True.

        With no argument the window's total is each param's accumulated
        ``.grad`` (cleared when the update is applied). With a mapping
        ``{param.id: gradient}`` (what ``ng.backward`` returns) the arrays
        are added into the optimizer's own window buffer instead. With
        ``average="samples"`` every call passes ``samples=n``, the micro-batch's
        sample count. Returns False, too, when a non-finite window is skipped.
        """
        win = self._window
        # The common calls, a .grad micro-step by this window's thread after a
        # backward: all the checks below would pass. One that does not close
        # the window only counts; one that closes it through the window's
        # boundary kernel (built by an earlier close) runs just that when a
        # param holds a gradient (else the path below warns).
        if win.fed and grads is None and samples is None and win.thread == get_ident() \
                and win.mode != "map" and win.average != "samples" and not self._taken:
            pos = win.pos + 1
            if pos < win.accumulate_steps:
                win.mode = "grad"
                win.pos = pos
                win.fed = False
                return False
            fused = win.boundary
            if fused and win.hook is None and pos == win.accumulate_steps:
                live = fused.group.grad_flags()
                if True in live:
                    try:
                        lr = self._group_lr(fused.group.hyper["lr"], win.t)
                        win.mode = "grad"
                        win.pos = pos
                        if fused.close(lr, pos, live):
                            return True
                        return win.close(self._rule, [lr])   # non-finite: the Python path
                    except BaseException:
                        win.release_if_idle()
                        raise
        self._check_usable()
        win.claim("step()")
        try:
            n = win.check_samples(samples)
            plan = win.plan(grads)
            if plan is None and not win.fed and win.hook is None:
                win.warn_unfed()
                win.release_if_idle()
                return False
            closing = win.pos + 1 == win.accumulate_steps
            lr = self._lr_for(win.t) if closing else []
            win.warn_if_empty(plan, win.pos + 1 if closing else 0)
            win.record(plan, n)
            return win.close(self._rule, lr) if closing else False
        except BaseException:
            win.release_if_idle()
            raise

    def flush(self) -> bool:
        """Apply the current window now, scaled by what it holds; False if it is empty.

        The scale is 1/micro-steps (average=True), 1 (False) or 1/samples
        ("samples"). Under ``DistributedOptimizer`` every rank must call it: it
        applies when any rank's window holds a micro-step, dividing by the
        micro-steps (or samples) of all ranks; a rank whose window is empty adds
        its ``.grad`` (None, so zeros, unless backward ran without a step()).
        The ranks agree on that in the window's one allreduce, which an empty
        flush costs too.
        """
        self._check_usable()
        win = self._window
        win.claim("flush()")
        try:
            if win.hook is None and not win.pos:
                win.release_if_idle()
                return False
            lr = self._lr_for(win.t)
            win.warn_if_empty(None, win.pos)
            applied = win.close(self._rule, lr, win.pos if win.hook is None else None)
            if not applied:
                win.release_if_idle()
            return applied
        except BaseException:
            win.release_if_idle()
            raise

    def zero_grad(self) -> None:
        """Set every param's ``.grad`` to None (the buffers are reused).

        In the middle of a window that reads ``.grad`` this discards the
        micro-batches accumulated so far, restarts the window and warns.
        """
        self._check_usable()
        win = self._window
        win.claim("zero_grad()")
        try:
            win.zero_grad()
        finally:
            win.release_if_idle()

    def _lr_for(self, t: int) -> list[float]:
        """Each flat group's learning rate for update ``t`` (its param group's)."""
        return [self._group_lr(g.hyper["lr"], t) for g in self._window.groups]

    @staticmethod
    def _group_lr(lr: Any, t: int) -> float:
        if not callable(lr):
            return lr
        return _checks.lr_value(lr(t), f"lr({t}) from the schedule {lr!r}")

    def _check_usable(self) -> None:
        if self._taken:
            raise RuntimeError("a param of this optimizer was adopted by another "
                               "optimizer, which now holds its data and .grad; "
                               "use that optimizer (a param belongs to one at a time)")

    def _hyper(self) -> dict[str, Any]:
        """The hyper-parameters: the first param group's lr and per-group keys (the
        others' too, under "param_groups", when there are several)."""
        win = self._window
        first = self.param_groups[0]
        hyper = {"lr": param_groups.lr_state(first["lr"]),
                 "accumulate_steps": win.accumulate_steps, "average": win.average,
                 "max_grad_norm": win.max_grad_norm, "nonfinite": win.nonfinite,
                 **self._rule.hyper(), **{k: first[k] for k in self._rule.group_keys}}
        if len(self.param_groups) > 1:
            hyper["param_groups"] = self._group_states()
        return hyper

    def _group_params(self) -> list[list[int]]:
        """Each param group's params as their indices in ``self.params``."""
        index = {p.id: i for i, p in enumerate(self.params)}
        return [[index[p.id] for p in pg["params"]] for pg in self.param_groups]

    def _group_states(self) -> list[dict[str, Any]]:
        """Each param group's hyper-parameters as a state dict holds them."""
        return [{"lr": param_groups.lr_state(pg["lr"]),
                 **{k: pg[k] for k in self._rule.group_keys}} for pg in self.param_groups]

    # ------------------------------------------------------- state dict
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume, even mid-window, as host arrays.

        Holds the hyper-parameters (a built-in schedule by value), ``t``, the
        window position, spelling and samples, the partial accumulators (each
        param's ``.grad`` and the step(grads) window buffer), the skip count,
        the last norm and the rule's state. Weights are not included. A
        callable ``lr`` that is not a built-in schedule cannot be saved: it is
        recorded by name, with a RuntimeWarning, and ``load_state_dict`` then
        keeps the loading optimizer's own callable.
        """
        self._check_usable()
        self._window.check_free("state_dict()")   # reading takes no window
        return self._state_dict()

    def _state_dict(self) -> dict[str, Any]:
        win = self._window
        for lr in {id(pg["lr"]): pg["lr"] for pg in self.param_groups}.values():
            if callable(lr) and not isinstance(lr, schedules.Schedule):
                warnings.warn(f"lr is the callable {param_groups.callable_name(lr)}, which a state "
                              f"dict cannot hold; it is saved by name only and "
                              f"load_state_dict() keeps the loading optimizer's own lr "
                              f"(ng.optim.schedules are saved by value)",
                              RuntimeWarning, stacklevel=3)
        groups = []
        for g in win.groups:
            kern = g.kern
            groups.append({
                "device": kern.name, "dtype": str(g.dtype),
                "shapes": [p.shape for p in g.params],
                "grad": kernels.to_host(kern, g.g_body),
                "live": np.array([p._live for p in g.params]),
                "window": None if g.win is None else kernels.to_host(kern, g.win_body),
                "seen": np.array(g.seen),
                "slots": {name: kernels.to_host(kern, a) for name, a in g.slots.items()},
            })
        return {"type": type(self).__name__, "hyper": self._hyper(), "t": win.t,
                "pos": win.pos, "mode": win.mode, "samples": win.samples,
                "skipped": win.skipped, "last_grad_norm": win.last_grad_norm,
                "fed": win.fed, "groups": groups,
                # one group: its hyper-parameters are "hyper"'s, as before param groups
                **({} if len(self.param_groups) == 1 else {"param_groups": [
                    dict(h, params=params)
                    for h, params in zip(self._group_states(), self._group_params())]})}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict()`` output; checks everything before changing anything."""
        self._check_usable()
        win = self._window
        win.claim("load_state_dict()")
        try:
            self._load_state_dict(state)
        except BaseException:
            win.release_if_idle()   # refused: the window is as it was
            raise
        win.release()   # a loaded window is no thread's: the next to use it takes it

    def _load_state_dict(self, state: Mapping[str, Any]) -> None:
        try:
            hyper, per_group, counters, arrays = self._check_state(state)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed optimizer state dict: {exc!r}") from None
        win = self._window
        win.accumulate_steps = hyper.pop("accumulate_steps")
        win.average = hyper.pop("average")
        win.max_grad_norm = hyper.pop("max_grad_norm")
        win.nonfinite = hyper.pop("nonfinite")
        self._rule.load({k: v for k, v in hyper.items() if k in self._rule.names})
        fixed = self._rule.fixed()
        for pg, values in zip(self.param_groups, per_group):
            for key, value in {**values, **fixed}.items():
                dict.__setitem__(pg, key, value)
        win.t, win.pos, win.samples, win.skipped, win.last_grad_norm = counters
        win.mode = state["mode"]
        # older state dicts: a window holding micro-steps or a .grad was fed
        win.fed = bool(state.get("fed", True))
        for g, saved in zip(win.groups, arrays):
            kern = g.kern
            tail = np.zeros(TAIL, g.dtype)
            kernels.call(kern, "upload", 0, np.concatenate([saved["grad"], tail]), g.g)
            for p, live in zip(g.params, saved["live"]):
                p._live = bool(live)
            if saved["window"] is not None:
                kernels.call(kern, "upload", 0, np.concatenate([saved["window"], tail]),
                             g.window())
            elif g.win is not None:
                kernels.call(kern, "fill", 0, g.win, 0.0)
            g.seen = [bool(s) for s in saved["seen"]]
            for name, array in g.slots.items():
                kernels.call(kern, "upload", 0, saved["slots"][name], array)
            g.live_flags = None

    def _check_state(self, state: Mapping[str, Any]) -> tuple[dict, Any, tuple, list]:
        if state["type"] != type(self).__name__:
            raise ValueError(f"state dict is for {state['type']}, not {type(self).__name__}")
        win = self._window
        saved = state["hyper"]
        per_group = self._checked_groups(state, saved)
        hyper = {"accumulate_steps": _checks.steps(saved["accumulate_steps"]),
                 "average": _checks.average(saved["average"]),
                 # absent from state dicts of numbagrad 0.1: keep this optimizer's
                 "max_grad_norm": _checks.max_grad_norm(saved.get("max_grad_norm",
                                                                  win.max_grad_norm)),
                 "nonfinite": _checks.nonfinite(saved.get("nonfinite", win.nonfinite))}
        hyper.update(self._rule.checked(saved))
        k = hyper["accumulate_steps"]
        if state["mode"] not in (None, "grad", "map"):
            raise ValueError(f"state dict window mode {state['mode']!r} is unknown")
        t, pos = int(state["t"]), int(state["pos"])
        if not 0 <= pos < k or t < 0:
            raise ValueError(f"state dict position {state['pos']} / t {state['t']} do not "
                             f"fit accumulate_steps={k}")
        samples, skipped = int(state.get("samples", 0)), int(state.get("skipped", 0))
        if samples < 0 or skipped < 0 or (samples and hyper["average"] != "samples"):
            raise ValueError(f"state dict samples {samples} / skipped {skipped} do not fit "
                             f"average={hyper['average']!r}")
        norm = state.get("last_grad_norm")
        norm = None if norm is None else float(norm)
        arrays: list[dict] = []
        if len(state["groups"]) != len(win.groups):
            raise ValueError(f"state dict has {len(state['groups'])} param groups, "
                             f"this optimizer {len(win.groups)}")
        for g, saved_g in zip(win.groups, state["groups"]):
            shapes = [tuple(s) for s in saved_g["shapes"]]
            mine = [p.shape for p in g.params]
            if (saved_g["device"], saved_g["dtype"], shapes) != (g.kern.name, str(g.dtype), mine):
                raise ValueError(f"state dict group ({saved_g['device']}, {saved_g['dtype']}, "
                                 f"shapes {shapes}) does not match this optimizer's "
                                 f"({g.kern.name}, {g.dtype}, shapes {mine})")
            n = len(g.params)
            if set(saved_g["slots"]) != set(g.slots):
                raise ValueError(f"state dict holds state {sorted(saved_g['slots'])}, this "
                                 f"optimizer {sorted(g.slots)}")
            window = saved_g["window"]
            arrays.append({
                "grad": _state_array(saved_g["grad"], "grad", (g.size,), g.dtype),
                "live": _state_array(saved_g["live"], "live", (n,), np.bool_),
                "seen": _state_array(saved_g["seen"], "seen", (n,), np.bool_),
                "window": None if window is None else
                _state_array(window, "window", (g.size,), g.dtype),
                # nonfinite="ignore" applies non-finite windows: its slots may be too
                "slots": {name: _state_array(saved_g["slots"][name], name, array.shape,
                                             array.dtype, hyper["nonfinite"] != "ignore",
                                             name in _NON_NEGATIVE)
                          for name, array in g.slots.items()}})
        return hyper, per_group, (t, pos, samples, skipped, norm), arrays

    def _checked_groups(self, state: Mapping[str, Any], saved: Mapping[str, Any]
                        ) -> list[dict[str, Any]]:
        """Each param group's hyper-parameters from a state dict, checked. A state
        dict without "param_groups" (numbagrad before them) gives every group
        its one lr and rule hyper-parameters."""
        mine = self.param_groups
        keys = self._rule.group_keys
        groups = state.get("param_groups")
        if groups is None:
            groups = [{"lr": saved["lr"], **{k: saved[k] for k in keys if k in saved}}
                      for _ in mine]
        elif len(groups) != len(mine):
            raise ValueError(f"state dict has {len(groups)} param groups (param_groups), "
                             f"this optimizer {len(mine)}")
        else:
            for gi, (g, params) in enumerate(zip(groups, self._group_params())):
                if "params" in g and list(g["params"]) != params:
                    raise ValueError(f"state dict param_groups[{gi}] holds params "
                                     f"{list(g['params'])}, this optimizer's {params}")
        out = []
        for gi, (g, pg) in enumerate(zip(groups, mine)):
            values = {"lr": self._checked_lr(g["lr"], pg["lr"])}
            for key in keys:
                values[key] = pg.checked(key, g[key]) if key in g else pg[key]
            out.append(values)
        return out

    def _checked_lr(self, saved: Any, own: Any) -> Any:
        if not isinstance(saved, Mapping):
            return _checks.lr_value(saved)
        if saved.get("schedule") != "callable":
            return schedules.from_dict(saved)
        if callable(own) and not isinstance(own, schedules.Schedule):
            return own
        raise ValueError(f"the state dict's lr was the callable {saved.get('name')}, which "
                         f"was not saved; build this optimizer with that callable as lr "
                         f"before loading")

    def __repr__(self) -> str:
        hyper = ", ".join(f"{k}={v!r}" for k, v in self._hyper().items())
        return f"{type(self).__name__}({len(self.params)} params, {hyper}, t={self.t})"


# Optimizer state that is a count or a mean of squares: never negative.
_NON_NEGATIVE = frozenset({"exp_avg_sq", "step"})


def _state_array(value: Any, key: str, shape: tuple, dtype: Any, slot: bool = False,
                 non_negative: bool = False) -> np.ndarray:
    """A state dict's array ``key`` as a host array of ``dtype``, checked to
    have ``shape`` and numbers of a kind that casts safely (flags: bools or
    0/1); a ``slot`` (the optimizer's own state) must be finite, and with
    ``non_negative`` not below 0. A ValueError naming it otherwise. (A
    partial window's gradient may be non-finite: the window's policy
    decides at its step.)"""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"state dict {key!r} is not an array: {exc}") from None
    if array.shape != shape:
        raise ValueError(f"state dict {key!r} has shape {array.shape}, expected {shape}")
    want = np.dtype(dtype)
    kind = array.dtype.kind
    if kind not in "biuf" or (want.kind in "biu" and kind == "f") \
            or (want.kind == "b" and kind != "b" and not np.isin(array, (0, 1)).all()):
        raise ValueError(f"state dict {key!r} holds {array.dtype}, which is not {want}")
    array = array.astype(want)
    if slot and want.kind == "f" and not np.isfinite(array).all():
        bad = np.flatnonzero(~np.isfinite(array))[0]
        raise ValueError(f"state dict {key!r} holds the non-finite {array.flat[bad]} at "
                         f"index {bad}")
    if non_negative and (array < 0).any():
        bad = np.flatnonzero(array < 0)[0]
        raise ValueError(f"state dict {key!r} holds the negative {array.flat[bad]} at "
                         f"index {bad}")
    return array


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, as ``torch.optim.SGD``:
    ``d = g + weight_decay * w; v = momentum * v + d; w -= lr * v`` (``w -= lr * d``
    at momentum 0).
    """

    def __init__(self, params: Any, lr: float | Callable[[int], float], momentum: float = 0.0,
                 accumulate_steps: int = 1, average: bool | str = True, *,
                 weight_decay: float = 0.0, max_grad_norm: float | None = None,
                 nonfinite: str = "raise", master_weights: bool = False) -> None:
        super().__init__(params, SGDRule(momentum, weight_decay), lr, accumulate_steps,
                         average, max_grad_norm, nonfinite, master_weights)

    @property
    def momentum(self) -> float:
        return self._rule.momentum

    @property
    def weight_decay(self) -> float:
        return self._shared("weight_decay")


class Adam(Optimizer):
    """Adam with PyTorch's formulas (``torch.optim.Adam``, no weight decay).

    Bias correction counts applied updates, never the skipped micro-steps.
    """

    def __init__(self, params: Any, lr: float | Callable[[int], float] = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 accumulate_steps: int = 1, average: bool | str = True, *,
                 max_grad_norm: float | None = None, nonfinite: str = "raise",
                 master_weights: bool = False) -> None:
        super().__init__(params, AdamRule(betas, eps), lr, accumulate_steps, average,
                         max_grad_norm, nonfinite, master_weights)

    @property
    def betas(self) -> tuple[float, float]:
        return self._shared("betas")

    @property
    def eps(self) -> float:
        return self._shared("eps")


class AdamW(Adam):
    """Adam with decoupled weight decay, as ``torch.optim.AdamW``:
    ``w *= 1 - lr * weight_decay`` before each Adam update.
    """

    def __init__(self, params: Any, lr: float | Callable[[int], float] = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, accumulate_steps: int = 1,
                 average: bool | str = True, *, max_grad_norm: float | None = None,
                 nonfinite: str = "raise", master_weights: bool = False) -> None:
        Optimizer.__init__(self, params, AdamRule(betas, eps, weight_decay, decoupled=True), lr,
                           accumulate_steps, average, max_grad_norm, nonfinite, master_weights)

    @property
    def weight_decay(self) -> float:
        return self._shared("weight_decay")
