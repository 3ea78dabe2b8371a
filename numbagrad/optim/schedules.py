"""Learning-rate schedules: ``lr(t) -> float`` for ``t`` updates applied so far.

Any callable works as an optimizer's ``lr``; these built-ins are also saved
by value in state dicts (a plain function cannot be)::

    opt = ng.optim.AdamW(params, lr=ng.optim.schedules.cosine(3e-4, 10_000, warmup=500))
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from . import _checks

__all__ = ["Constant", "Cosine", "Schedule", "Step", "constant", "cosine", "from_dict", "step"]


class Schedule:
    """Base of the built-in schedules: callable on ``t``, comparable, saved by value."""

    kind = ""
    _fields: tuple[str, ...] = ()

    def __call__(self, t: int) -> float:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"a schedule takes t >= 0 (updates applied so far), got {t!r}")
        return self._at(t)

    def _at(self, t: int) -> float:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """The schedule by value: ``{"schedule": kind, **parameters}``."""
        return {"schedule": self.kind, **{f: getattr(self, f) for f in self._fields}}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.to_dict() == self.to_dict()

    def __hash__(self) -> int:
        return hash(tuple(self.to_dict().items()))

    def __repr__(self) -> str:
        args = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"schedules.{self.kind}({args})"


class Constant(Schedule):
    """``value`` at every update."""

    kind, _fields = "constant", ("value",)

    def __init__(self, value: float) -> None:
        self.value = _checks.lr_value(value, "constant value")

    def _at(self, t: int) -> float:
        return self.value


class Step(Schedule):
    """``value * gamma ** (t // every)``, as ``torch.optim.lr_scheduler.StepLR``."""

    kind, _fields = "step", ("value", "every", "gamma")

    def __init__(self, value: float, every: int, gamma: float = 0.1) -> None:
        self.value = _checks.lr_value(value, "step value")
        self.every = _checks.positive_int("step every", every)
        self.gamma = _checks.non_negative("step gamma", gamma)

    def _at(self, t: int) -> float:
        return self.value * self.gamma ** (t // self.every)


class Cosine(Schedule):
    """Linear warm-up, then cosine decay to ``final``.

    Updates ``t < warmup`` use ``peak * (t + 1) / warmup`` (from peak/warmup
    up to peak); from ``warmup`` to ``total_updates`` the rate follows half a
    cosine from ``peak`` down to ``final``, and stays at ``final`` after.
    """

    kind, _fields = "cosine", ("peak", "total_updates", "warmup", "final")

    def __init__(self, peak: float, total_updates: int, warmup: int = 0,
                 final: float = 0.0) -> None:
        self.peak = _checks.lr_value(peak, "cosine peak")
        self.total_updates = _checks.positive_int("cosine total_updates", total_updates)
        if isinstance(warmup, bool) or not isinstance(warmup, int) \
                or not 0 <= warmup <= self.total_updates:
            raise ValueError(f"cosine warmup must be an integer in [0, total_updates="
                             f"{self.total_updates}], got {warmup!r}")
        self.warmup = int(warmup)
        self.final = _checks.lr_value(final, "cosine final")

    def _at(self, t: int) -> float:
        if t < self.warmup:
            return self.peak * (t + 1) / self.warmup
        if t >= self.total_updates:
            return self.final
        progress = (t - self.warmup) / (self.total_updates - self.warmup)
        return self.final + (self.peak - self.final) * 0.5 * (1.0 + math.cos(math.pi * progress))


def constant(value: float) -> Constant:
    """The learning rate ``value`` at every update."""
    return Constant(value)


def step(value: float, every: int, gamma: float = 0.1) -> Step:
    """``value``, multiplied by ``gamma`` after every ``every`` updates."""
    return Step(value, every, gamma)


def cosine(peak: float, total_updates: int, warmup: int = 0, final: float = 0.0) -> Cosine:
    """Linear warm-up over ``warmup`` updates, cosine down to ``final`` at ``total_updates``."""
    return Cosine(peak, total_updates, warmup, final)


_KINDS = {cls.kind: cls for cls in (Constant, Step, Cosine)}


def from_dict(saved: Mapping[str, Any]) -> Schedule:
    """Rebuild a schedule from ``Schedule.to_dict()`` output (checked as on construction)."""
    kind = saved.get("schedule")
    cls = _KINDS.get(kind)
    if cls is None:
        raise ValueError(f"unknown schedule {kind!r}; built-ins are {sorted(_KINDS)}")
    extra = set(saved) - {"schedule", *cls._fields}
    if extra:
        raise ValueError(f"{kind} schedule has unknown fields {sorted(extra)}")
    return cls(**{f: saved[f] for f in cls._fields if f in saved})
