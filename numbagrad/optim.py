"""Optimizers that own gradient accumulation: SGD (with momentum) and Adam.

An optimizer packs its params into flat buffers, one set per (device,
dtype) group: the weights, the gradient accumulators (each param's
``.data`` and ``.grad`` become views into them) and its own state. One fused
kernel call then updates a whole group, folds in the 1/k averaging and
clears the accumulators, and a data-parallel allreduce is one call.

``step()`` closes an accumulation window every ``accumulate_steps`` calls:
the first k-1 calls change nothing and return False, the k-th applies one
update from the window's total and returns True.
"""
from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from .tensor import Tensor

__all__ = ["Optimizer", "SGD", "Adam"]


# ----------------------------------------------------------- validation
def _real(name: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    return float(value)


def _check_lr(lr: Any) -> float:
    lr = _real("lr", lr)
    if lr < 0:
        raise ValueError(f"lr must be >= 0, got {lr!r}")
    return lr


def _check_unit(name: str, value: Any) -> float:
    value = _real(name, value)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return value


def _check_steps(k: Any) -> int:
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"accumulate_steps must be a positive integer, got {k!r}")
    return int(k)


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _collect_params(params: Any) -> tuple[list[Tensor], list[str]]:
    """Params and their display names, in order, duplicates dropped."""
    if isinstance(params, Tensor):
        raise TypeError("params must be an iterable or mapping of params, "
                        "not a single Tensor; wrap it in a list")
    if isinstance(params, Mapping):
        items = [(str(name), p) for name, p in params.items()]
    elif isinstance(params, Iterable):
        items = [(f"params[{i}]", p) for i, p in enumerate(params)]
    else:
        raise TypeError(f"params must be an iterable or mapping of params, "
                        f"got {type(params).__name__}")
    found: list[Tensor] = []
    names: list[str] = []
    seen: set[int] = set()
    for name, p in items:
        if not isinstance(p, Tensor) or not p.is_param:
            what = type(p).__name__ if not isinstance(p, Tensor) else "a Tensor that is not a param"
            raise TypeError(f"{name} is {what}; optimizers take ng.param tensors only")
        if id(p) not in seen:
            seen.add(id(p))
            found.append(p)
            names.append(name)
    if not found:
        raise ValueError("optimizer got an empty parameter list")
    return found, names


# --------------------------------------------------------------- groups
class _Group:
    """The params of one device and dtype, packed into flat buffers."""

    def __init__(self, params: list[Tensor], owner: Optimizer) -> None:
        first = params[0]
        kern = self.kern = first._kern
        self.dtype = first.dtype
        self.params = params
        bounds = np.zeros(len(params) + 1, np.int64)
        np.cumsum([p.size for p in params], out=bounds[1:])
        self.bounds = bounds
        self.seg = kern.from_host(bounds)
        total = int(bounds[-1])
        self.w = kern.empty((total,), self.dtype)
        self.g = self.zeros()
        for p, view_w, view_g in zip(params, self.views(self.w), self.views(self.g)):
            kern.axpby(1.0, p._data, 0.0, view_w)
            if p._live:
                kern.axpby(1.0, p._acc, 0.0, view_g)
            if p._owner is not None:
                p._owner._taken = True
            p._data, p._acc, p._owner = view_w, view_g, owner
        self.win = None          # the step(grads) window buffer, made on first use
        self.win_views: list = []
        self.seen = [False] * len(params)
        self.live_flags: tuple | None = None   # the flags uploaded to self.live
        self.live = kern.from_host(np.zeros(len(params), np.uint8))
        self.slots: dict[str, Any] = {}     # per-element state, saved in state dicts
        self.scratch: dict[str, Any] = {}   # kernel work arrays, not saved

    def zeros(self) -> Any:
        """A new zeroed flat buffer of the group's size and dtype."""
        array = self.kern.empty((int(self.bounds[-1]),), self.dtype)
        self.kern.fill(array, 0.0)
        return array

    def views(self, flat: Any) -> list:
        b = self.bounds
        return [flat[b[i]:b[i + 1]].reshape(p.shape) for i, p in enumerate(self.params)]

    def window(self) -> Any:
        if self.win is None:
            self.win = self.zeros()
            self.win_views = self.views(self.win)
        return self.win

    def set_live(self, flags: tuple) -> None:
        if flags != self.live_flags:
            self.kern.upload(np.array(flags, np.uint8), self.live)
            self.live_flags = flags


# ------------------------------------------------------------ optimizer
class Optimizer:
    """Base class: the accumulation window, ``.grad`` handling, state dicts.

    Subclasses name their per-element state in ``_new_slots`` and apply one
    update to a group in ``_update``.
    """

    _hyper_names: tuple[str, ...] = ()

    def __init__(self, params: Any, lr: Any, accumulate_steps: Any, average: Any) -> None:
        plist, names = _collect_params(params)
        self._lr = _check_lr(lr)
        self.accumulate_steps = _check_steps(accumulate_steps)
        self.average = _check_bool("average", average)
        # Validation is over; from here on the optimizer is built.
        by_key: dict[tuple, list[Tensor]] = {}
        for p in plist:
            by_key.setdefault((p.device, p.dtype), []).append(p)
        self._taken = False   # set when another optimizer adopts one of our params
        self._groups = [_Group(ps, self) for ps in by_key.values()]
        for group in self._groups:
            group.slots = self._new_slots(group)
        self._index = {p.id: (group, i) for group in self._groups
                       for i, p in enumerate(group.params)}
        self._names = {p.id: name for p, name in zip(plist, names)}
        self._t = 0
        self._pos = 0
        self._mode: str | None = None   # "grad" or "map" inside a window
        # Set by numbagrad.distributed: reduces the window's flat gradient
        # buffers in place and returns the factor to scale them by.
        self._window_hook: Callable[[list], float] | None = None
        self._all_live = False

    # ------------------------------------------------------- properties
    @property
    def lr(self) -> float:
        return self._lr

    @lr.setter
    def lr(self, value: Any) -> None:
        self._lr = _check_lr(value)

    @property
    def t(self) -> int:
        """How many updates have been applied (windows completed)."""
        return self._t

    @property
    def params(self) -> tuple[Tensor, ...]:
        return tuple(p for group in self._groups for p in group.params)

    @property
    def pending_steps(self) -> int:
        """How many micro-steps the current window holds so far."""
        return self._pos

    # ------------------------------------------------------- the window
    def step(self, grads: Mapping[int, Any] | None = None) -> bool:
        """Count one micro-step; apply the update on the k-th and return True.

        With no argument the window's total is each param's accumulated
        ``.grad`` (cleared when the update is applied). With a mapping
        ``{param.id: gradient}`` (what ``ng.backward`` returns) the arrays
        are added into the optimizer's own window buffer instead.
        """
        self._check_usable()
        if grads is None:
            if self._mode == "map":
                raise RuntimeError("step() without grads inside a window begun with "
                                   "step(grads); keep one spelling per window")
            mode = "grad"
        else:
            if self._mode == "grad":
                raise RuntimeError("step(grads) inside a window begun with step() "
                                   "(which reads .grad); keep one spelling per window")
            plan = self._plan(grads)
            for group, i, array in plan:
                group.window()
                group.kern.axpby(1.0, array, 1.0, group.win_views[i])
                group.seen[i] = True
            mode = "map"
        self._mode = mode
        self._pos += 1
        if self._pos < self.accumulate_steps:
            return False
        self._apply()
        return True

    def _plan(self, grads: Any) -> list[tuple[_Group, int, Any]]:
        """Check every passed gradient before any of them is used."""
        if not isinstance(grads, Mapping):
            raise TypeError(f"step(grads) takes a mapping {{param.id: array}} such as "
                            f"ng.backward returns, got {type(grads).__name__}")
        plan = []
        for key, array in grads.items():
            where = self._index.get(key)
            if where is None:
                continue   # a param this optimizer does not own
            group, i = where
            p = group.params[i]
            if isinstance(array, Tensor):
                array = array.data
            what = f"step(grads): gradient for {self._names[p.id]} (id {p.id})"
            if not group.kern.is_device_array(array):
                raise TypeError(f"{what} is {type(array).__name__}; the param is on "
                                f"{p.device} and needs a {p.device} array")
            if array.shape != p.shape or array.dtype != p.dtype:
                raise ValueError(f"{what} has shape {array.shape} and dtype {array.dtype}; "
                                 f"the param has shape {p.shape} and dtype {p.dtype}")
            plan.append((group, i, array))
        return plan

    def _apply(self) -> None:
        scale = 1.0 / self.accumulate_steps if self.average else 1.0
        buffers = []
        for group in self._groups:
            if self._mode == "grad":
                buffers.append(group.g)
                flags = tuple(p._live for p in group.params)
            else:
                buffers.append(group.window())
                flags = tuple(group.seen)
            group.set_live((True,) * len(flags) if self._all_live else flags)
        if self._window_hook is not None:
            scale *= self._window_hook(buffers)
        for group, flat in zip(self._groups, buffers):
            self._update(group, flat, scale)
            if self._mode == "grad":
                for p in group.params:
                    p._live = False
            else:
                group.seen = [False] * len(group.params)
        self._t += 1
        self._pos = 0
        self._mode = None

    def zero_grad(self) -> None:
        """Set every param's ``.grad`` to None (the buffers are reused).

        In the middle of a window that reads ``.grad`` this discards the
        micro-batches accumulated so far, restarts the window and warns.
        """
        self._check_usable()
        if self._mode == "grad" and self._pos:
            warnings.warn(f"zero_grad() discarded {self._pos} accumulated micro-batch(es) "
                          f"of an unfinished window (accumulate_steps="
                          f"{self.accumulate_steps}); the window starts again",
                          RuntimeWarning, stacklevel=2)
            self._pos = 0
            self._mode = None
        for group in self._groups:
            if any(p._live for p in group.params):
                group.kern.fill(group.g, 0.0)
                for p in group.params:
                    p._live = False

    def _check_usable(self) -> None:
        if self._taken:
            raise RuntimeError("a param of this optimizer was adopted by another "
                               "optimizer, which now holds its data and .grad; "
                               "use that optimizer (a param belongs to one at a time)")

    # ------------------------------------------------------- subclasses
    def _new_slots(self, group: _Group) -> dict[str, Any]:
        return {}

    def _update(self, group: _Group, flat_grad: Any, scale: float) -> None:
        raise NotImplementedError

    def _hyper(self) -> dict[str, Any]:
        return {"lr": self._lr, "accumulate_steps": self.accumulate_steps,
                "average": self.average,
                **{name: getattr(self, name) for name in self._hyper_names}}

    # ------------------------------------------------------- state dict
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume, even mid-window, as host arrays.

        Holds the hyper-parameters, ``t``, the window position and spelling,
        the partial accumulators (each param's ``.grad`` and the step(grads)
        window buffer) and the per-element state. Weights are not included.
        """
        self._check_usable()
        groups = []
        for g in self._groups:
            kern = g.kern
            groups.append({
                "device": kern.name, "dtype": str(g.dtype),
                "shapes": [p.shape for p in g.params],
                "grad": kern.to_host(g.g),
                "live": np.array([p._live for p in g.params]),
                "window": None if g.win is None else kern.to_host(g.win),
                "seen": np.array(g.seen),
                "slots": {name: kern.to_host(a) for name, a in g.slots.items()},
            })
        return {"type": type(self).__name__, "hyper": self._hyper(), "t": self._t,
                "pos": self._pos, "mode": self._mode, "groups": groups}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict()`` output; checks everything before changing anything."""
        self._check_usable()
        try:
            hyper = self._check_state(state)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed optimizer state dict: {exc!r}") from None
        for name, value in hyper.items():
            setattr(self, "_lr" if name == "lr" else name, value)
        self._t, self._pos, self._mode = int(state["t"]), int(state["pos"]), state["mode"]
        for g, saved in zip(self._groups, state["groups"]):
            kern = g.kern
            kern.upload(np.asarray(saved["grad"]), g.g)
            for p, live in zip(g.params, saved["live"]):
                p._live = bool(live)
            if saved["window"] is not None:
                kern.upload(np.asarray(saved["window"]), g.window())
            elif g.win is not None:
                kern.fill(g.win, 0.0)
            g.seen = [bool(s) for s in saved["seen"]]
            for name, array in g.slots.items():
                kern.upload(np.asarray(saved["slots"][name]), array)
            g.live_flags = None

    def _check_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        if state["type"] != type(self).__name__:
            raise ValueError(f"state dict is for {state['type']}, not {type(self).__name__}")
        saved = state["hyper"]
        hyper = {"lr": _check_lr(saved["lr"]),
                 "accumulate_steps": _check_steps(saved["accumulate_steps"]),
                 "average": _check_bool("average", saved["average"])}
        hyper.update(self._check_hyper(saved))
        k = hyper["accumulate_steps"]
        if state["mode"] not in (None, "grad", "map"):
            raise ValueError(f"state dict window mode {state['mode']!r} is unknown")
        if not 0 <= int(state["pos"]) < k or int(state["t"]) < 0:
            raise ValueError(f"state dict position {state['pos']} / t {state['t']} do not "
                             f"fit accumulate_steps={k}")
        if len(state["groups"]) != len(self._groups):
            raise ValueError(f"state dict has {len(state['groups'])} param groups, "
                             f"this optimizer {len(self._groups)}")
        for g, saved_g in zip(self._groups, state["groups"]):
            shapes = [tuple(s) for s in saved_g["shapes"]]
            mine = [p.shape for p in g.params]
            if (saved_g["device"], saved_g["dtype"], shapes) != (g.kern.name, str(g.dtype), mine):
                raise ValueError(f"state dict group ({saved_g['device']}, {saved_g['dtype']}, "
                                 f"shapes {shapes}) does not match this optimizer's "
                                 f"({g.kern.name}, {g.dtype}, shapes {mine})")
            n, total = len(g.params), int(g.bounds[-1])
            want = {"grad": (total,), "live": (n,), "seen": (n,)}
            if saved_g["window"] is not None:
                want["window"] = (total,)
            for key, shape in want.items():
                if np.shape(saved_g[key]) != shape:
                    raise ValueError(f"state dict {key!r} has shape "
                                     f"{np.shape(saved_g[key])}, expected {shape}")
            if set(saved_g["slots"]) != set(g.slots):
                raise ValueError(f"state dict holds state {sorted(saved_g['slots'])}, this "
                                 f"optimizer {sorted(g.slots)}")
            for name, array in g.slots.items():
                if np.shape(saved_g["slots"][name]) != array.shape:
                    raise ValueError(f"state dict {name!r} has shape "
                                     f"{np.shape(saved_g['slots'][name])}, expected {array.shape}")
        return hyper

    def _check_hyper(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        hyper = ", ".join(f"{k}={v!r}" for k, v in self._hyper().items())
        return f"{type(self).__name__}({len(self._index)} params, {hyper}, t={self._t})"


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, as ``torch.optim.SGD``:
    ``v = momentum * v + g; w -= lr * v`` (plain ``w -= lr * g`` at momentum 0).
    """

    _hyper_names = ("momentum",)

    def __init__(self, params: Any, lr: float, momentum: float = 0.0,
                 accumulate_steps: int = 1, average: bool = True) -> None:
        self.momentum = _check_unit("momentum", momentum)
        super().__init__(params, lr, accumulate_steps, average)

    def _new_slots(self, group: _Group) -> dict[str, Any]:
        return {"momentum_buffer": group.zeros()} if self.momentum else {}

    def _update(self, group: _Group, flat_grad: Any, scale: float) -> None:
        v = group.slots.get("momentum_buffer", flat_grad)
        group.kern.sgd_update(group.w, flat_grad, v, group.seg, group.live,
                              self._lr, self.momentum, scale)

    def _check_hyper(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        momentum = _check_unit("momentum", saved["momentum"])
        if bool(momentum) != bool(self.momentum):
            raise ValueError(f"state dict momentum {momentum} and this optimizer's "
                             f"{self.momentum} differ in whether a buffer is kept")
        return {"momentum": momentum}


class Adam(Optimizer):
    """Adam with PyTorch's formulas (``torch.optim.Adam``, no weight decay).

    Bias correction counts applied updates, never the skipped micro-steps.
    """

    _hyper_names = ("betas", "eps")

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, accumulate_steps: int = 1, average: bool = True) -> None:
        self.betas, self.eps = self._checked(betas, eps)
        super().__init__(params, lr, accumulate_steps, average)

    @staticmethod
    def _checked(betas: Any, eps: Any) -> tuple[tuple[float, float], float]:
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        betas = (_check_unit("betas[0]", betas[0]), _check_unit("betas[1]", betas[1]))
        eps = _real("eps", eps)
        if eps <= 0:
            raise ValueError(f"eps must be > 0, got {eps!r}")
        return betas, eps

    def _new_slots(self, group: _Group) -> dict[str, Any]:
        # Per-param step counts: the kernel reads "step" and writes the
        # next counts into the scratch twin, then the two swap.
        steps = [group.kern.from_host(np.zeros(len(group.params), np.int64)) for _ in "ab"]
        group.scratch["next_step"] = steps[1]
        return {"exp_avg": group.zeros(), "exp_avg_sq": group.zeros(), "step": steps[0]}

    def _update(self, group: _Group, flat_grad: Any, scale: float) -> None:
        slots, scratch = group.slots, group.scratch
        group.kern.adam_update(group.w, flat_grad, slots["exp_avg"], slots["exp_avg_sq"],
                               group.seg, group.live, slots["step"], scratch["next_step"],
                               self._lr, self.betas[0], self.betas[1], self.eps, scale)
        slots["step"], scratch["next_step"] = scratch["next_step"], slots["step"]

    def _check_hyper(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        betas, eps = self._checked(saved["betas"], saved["eps"])
        return {"betas": betas, "eps": eps}
