"""Argument checks shared by the optimizers: each raises before anything is built."""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..tensor import Tensor

AVERAGES = (True, False, "samples")
NONFINITE = ("raise", "skip", "ignore")


def real(name: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    return float(value)


def non_negative(name: str, value: Any) -> float:
    value = real(name, value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


def positive_int(name: str, value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) \
            or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def lr_value(value: Any, name: str = "lr") -> float:
    return non_negative(name, value)


def lr_or_schedule(lr: Any) -> float | Any:
    """A float learning rate, or a callable ``lr(t) -> float`` kept as it is."""
    if callable(lr) and not isinstance(lr, numbers.Real):
        return lr
    return lr_value(lr)


def unit(name: str, value: Any) -> float:
    value = real(name, value)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return value


def steps(k: Any) -> int:
    return positive_int("accumulate_steps", k)


def average(value: Any) -> bool | str:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, str) and value == "samples":
        return "samples"
    raise TypeError(f"average must be True or False, or 'samples', got {value!r}")


def nonfinite(value: Any) -> str:
    if value not in NONFINITE:
        raise ValueError(f"nonfinite must be one of {NONFINITE}, got {value!r}")
    return value


def max_grad_norm(value: Any) -> float | None:
    if value is None:
        return None
    value = real("max_grad_norm", value)
    if value <= 0:
        raise ValueError(f"max_grad_norm must be > 0 (or None), got {value!r}")
    return value


def collect_params(params: Any) -> tuple[list[Tensor], list[str]]:
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


def name_list(names: list[str], most: int = 6) -> str:
    """``a, b, c`` or ``a, b, ... (12 in all)`` for messages."""
    if len(names) <= most:
        return ", ".join(names)
    return ", ".join(names[:most]) + f", ... ({len(names)} in all)"
