"""Update rules: their hyper-parameters, per-element slots and one fused kernel each.

A rule knows nothing about windows: the optimizer hands it a group, the
group's flat gradient total, the learning rate and the factor to scale the
total by (the window's averaging and clipping folded into one number), and
the rule's kernel applies the update and zeroes the gradient buffer. A rule
may also describe its update as a window boundary kernel
(``boundary_kernel``), which the window then runs where it applies.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from .. import kernels
from ..kernels.cpu import boundary
from . import _checks
from .groups import Group


class BoundaryKernel(NamedTuple):
    """A rule's update as a boundary kernel of ``numbagrad/kernels/cpu/boundary.py``."""

    kernel: Any                        # e.g. boundary.adam_close
    args: tuple                        # its arguments, ending in (sq, ctl)
    values: Callable[[], tuple]        # ctl[PARITY:] now: the swapped slots' parity, hypers
    after: Callable[[], None] | None   # what ``update`` does after its kernel, if anything


class Rule:
    """Base class: ``names`` lists the hyper-parameters saved in state dicts."""

    names: tuple[str, ...] = ()
    # The hyper-parameters a param group may set (``opt.param_groups``),
    # besides lr; the rule's own values are the defaults of every group.
    group_keys: tuple[str, ...] = ()
    # Shown in every param group, set only for the optimizer as a whole.
    fixed_keys: tuple[str, ...] = ()

    def group_checks(self) -> dict[str, Callable[[Any], Any]]:
        """A validator for each of ``group_keys``."""
        return {}

    def group_defaults(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.group_keys}

    def fixed(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.fixed_keys}

    def new_slots(self, group: Group) -> dict[str, Any]:
        """The per-element (or per-param) state of a new group, zeroed."""
        return {}

    def update(self, group: Group, flat_grad: Any, lr: float, scale: float) -> None:
        raise NotImplementedError

    def boundary_kernel(self, group: Group, sq: Any, ctl: Any) -> BoundaryKernel | None:
        """This rule's update of ``group`` as a boundary kernel reading ``ctl`` (and
        summing squares into ``sq``); None if it has none."""
        return None

    def hyper(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.names}

    def checked(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        """Validated hyper-parameters from a state dict; raises, changes nothing."""
        return {}

    def load(self, values: Mapping[str, Any]) -> None:
        for name, value in values.items():
            setattr(self, name, value)


class SGDRule(Rule):
    """``torch.optim.SGD``: ``d = g + wd * w; v = momentum * v + d; w -= lr * v``."""

    names = ("momentum", "weight_decay")
    group_keys = ("weight_decay",)
    fixed_keys = ("momentum",)

    def __init__(self, momentum: Any, weight_decay: Any) -> None:
        self.momentum = _checks.unit("momentum", momentum)
        self.weight_decay = _checks.non_negative("weight_decay", weight_decay)

    def group_checks(self) -> dict[str, Callable[[Any], Any]]:
        return {"weight_decay": functools.partial(_checks.non_negative, "weight_decay")}

    def new_slots(self, group: Group) -> dict[str, Any]:
        return {"momentum_buffer": group.zeros(tail=0)} if self.momentum else {}

    def boundary_kernel(self, group: Group, sq: Any, ctl: Any) -> BoundaryKernel:
        v = group.slots.get("momentum_buffer", group.g)
        return BoundaryKernel(boundary.sgd_close,
                              (group.w, group.g, group.g_body, v, group.seg, group.live, sq, ctl),
                              lambda: (0, self.momentum, group.hyper["weight_decay"]), None)

    def update(self, group: Group, flat_grad: Any, lr: float, scale: float) -> None:
        v = group.slots.get("momentum_buffer", flat_grad)
        kernels.call(group.kern, "sgd_update", 0, group.w, flat_grad, v, group.seg, group.live,
                     lr, self.momentum, scale, group.hyper["weight_decay"])

    def checked(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        momentum = _checks.unit("momentum", saved["momentum"])
        if bool(momentum) != bool(self.momentum):
            raise ValueError(f"state dict momentum {momentum} and this optimizer's "
                             f"{self.momentum} differ in whether a buffer is kept")
        return {"momentum": momentum,
                "weight_decay": _checks.non_negative("weight_decay",
                                                     saved.get("weight_decay", 0.0))}


class AdamRule(Rule):
    """``torch.optim.Adam``, or ``AdamW`` with ``decoupled`` weight decay.

    Bias correction counts applied updates of each param, never the
    micro-steps, and a param without a gradient in a window keeps its count.
    """

    def __init__(self, betas: Any, eps: Any, weight_decay: Any = 0.0,
                 decoupled: bool = False) -> None:
        self.betas, self.eps = self._checked(betas, eps)
        self.weight_decay = _checks.non_negative("weight_decay", weight_decay)
        self.names = ("betas", "eps", "weight_decay") if decoupled else ("betas", "eps")
        self.group_keys = self.names

    def group_checks(self) -> dict[str, Callable[[Any], Any]]:
        checks = {"betas": lambda b: self._checked(b, 1.0)[0],
                  "eps": lambda e: self._checked((0.0, 0.0), e)[1]}
        if "weight_decay" in self.names:
            checks["weight_decay"] = functools.partial(_checks.non_negative, "weight_decay")
        return checks

    @staticmethod
    def _checked(betas: Any, eps: Any) -> tuple[tuple[float, float], float]:
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        betas = (_checks.unit("betas[0]", betas[0]), _checks.unit("betas[1]", betas[1]))
        eps = _checks.real("eps", eps)
        if eps <= 0:
            raise ValueError(f"eps must be > 0, got {eps!r}")
        return betas, eps

    def new_slots(self, group: Group) -> dict[str, Any]:
        # Per-param step counts: the kernel reads "step" and writes the
        # next counts into the scratch twin, then the two swap.
        steps = [kernels.from_host(group.kern, np.zeros(len(group.params), np.int64))
                 for _ in "ab"]
        group.scratch["next_step"] = steps[1]
        return {"exp_avg": group.zeros(tail=0), "exp_avg_sq": group.zeros(tail=0),
                "step": steps[0]}

    def boundary_kernel(self, group: Group, sq: Any, ctl: Any) -> BoundaryKernel:
        slots = group.slots
        first = slots["step"]    # the kernel's steps_a: PARITY 1 once the counts swapped

        hyper = group.hyper

        def values() -> tuple:
            return (0 if slots["step"] is first else 1, *hyper["betas"], hyper["eps"],
                    hyper.get("weight_decay", 0.0))
        return BoundaryKernel(boundary.adam_close, (
            group.w, group.g, group.g_body, slots["exp_avg"], slots["exp_avg_sq"], group.seg,
            group.live, first, group.scratch["next_step"], sq, ctl), values,
            functools.partial(_swap_steps, group))

    def update(self, group: Group, flat_grad: Any, lr: float, scale: float) -> None:
        slots, scratch, hyper = group.slots, group.scratch, group.hyper
        beta1, beta2 = hyper["betas"]
        kernels.call(group.kern, "adam_update", 0, group.w, flat_grad, slots["exp_avg"],
                     slots["exp_avg_sq"], group.seg, group.live, slots["step"],
                     scratch["next_step"], lr, beta1, beta2, hyper["eps"], scale,
                     hyper.get("weight_decay", 0.0))
        _swap_steps(group)

    def checked(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        betas, eps = self._checked(saved["betas"], saved["eps"])
        values = {"betas": betas, "eps": eps}
        if "weight_decay" in self.names:
            values["weight_decay"] = _checks.non_negative("weight_decay",
                                                          saved["weight_decay"])
        return values


def _swap_steps(group: Group) -> None:
    """After an Adam update (its kernel wrote the next step counts into the twin)."""
    slots, scratch = group.slots, group.scratch
    slots["step"], scratch["next_step"] = scratch["next_step"], slots["step"]
