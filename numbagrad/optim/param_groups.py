"""``opt.param_groups``: PyTorch's per-group hyper-parameters, checked as they are set.

An optimizer takes either its params or a list of dicts
``[{"params": [...], "lr": 0.1}, {"params": [...]}]``; a key a group does
not give takes the optimizer's argument. Each group is a ``ParamGroup``, a
dict whose writes are checked at once (a bad ``lr`` raises where it is
assigned, not at some later update), and the optimizer reads it at every
applied update, so ``opt.param_groups[0]["lr"] *= 0.5`` takes effect at the
next one, as in PyTorch.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..tensor import Tensor
from . import _checks


class ParamGroup(dict):
    """One param group: ``"params"`` (a list, fixed) and its hyper-parameters.

    ``checks`` maps each key that may be set per group to its validator;
    ``fixed`` names the keys shown for reference that are the optimizer's
    as a whole (SGD's ``momentum``, which decides whether a buffer exists).
    """

    def __init__(self, params: list[Tensor], values: Mapping[str, Any],
                 checks: Mapping[str, Callable[[Any], Any]], fixed: Mapping[str, Any],
                 kind: str) -> None:
        super().__init__()
        self._checks = checks
        self._fixed = fixed
        self._kind = kind
        dict.__setitem__(self, "params", params)
        for key, value in values.items():
            dict.__setitem__(self, key, value)
        for key, value in fixed.items():
            dict.__setitem__(self, key, value)

    def checked(self, key: Any, value: Any) -> Any:
        """``value`` validated for ``key``, or a KeyError/ValueError naming the problem."""
        if key == "params":
            raise KeyError(f"{self._kind}.param_groups[...]['params'] cannot be replaced; "
                           f"build a new optimizer for other params")
        if key in self._fixed:
            raise KeyError(f"{self._kind}: {key!r} is shared by all param groups (it is "
                           f"the optimizer's own argument) and cannot be set per group")
        check = self._checks.get(key)
        if check is None:
            raise KeyError(f"{self._kind} has no per-group hyper-parameter {key!r}; the "
                           f"keys are {sorted(self._checks)}")
        return check(value)

    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, key, self.checked(key, value))

    def update(self, *args: Any, **kwargs: Any) -> None:
        new = dict(*args, **kwargs)
        checked = {key: self.checked(key, value) for key, value in new.items()}
        for key, value in checked.items():   # all checked first: a refusal changes nothing
            dict.__setitem__(self, key, value)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key in self:
            return self[key]
        self[key] = default
        return self[key]

    def __ior__(self, other: Any) -> ParamGroup:
        self.update(other)
        return self

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise KeyError(f"{self._kind}.param_groups entries cannot lose keys")

    __delitem__ = pop = popitem = clear = _refuse

    def __reduce__(self) -> Any:
        # pickled/deep-copied as a plain dict: a snapshot, not a live group
        return (dict, (dict(self),))


def split(params: Any, kind: str) -> list[tuple[list[Tensor], list[str], dict[str, Any]]]:
    """``params`` as groups: (params, their names, the group's own keys).

    A plain iterable or mapping of params is one group without keys; a
    list of dicts is one group each. A param in two groups is refused,
    naming it and both groups.
    """
    if isinstance(params, Iterable) and not isinstance(params, (Mapping, Tensor, str)):
        params = list(params)
        if params and all(isinstance(g, Mapping) for g in params):
            return _split_dicts(params, kind)
        if any(isinstance(g, Mapping) for g in params):
            raise TypeError(f"{kind}: params mixes param-group dicts and params; pass "
                            f"either params or a list of dicts with 'params'")
    plist, names = _checks.collect_params(params)
    return [(plist, names, {})]


def _split_dicts(dicts: list[Mapping], kind: str
                 ) -> list[tuple[list[Tensor], list[str], dict[str, Any]]]:
    out = []
    where: dict[int, str] = {}
    for gi, group in enumerate(dicts):
        if "params" not in group:
            raise ValueError(f"{kind}: param_groups[{gi}] has no 'params' key")
        ps = group["params"]
        if isinstance(ps, Tensor):
            ps = [ps]
        try:
            plist, inner = _checks.collect_params(ps)
        except ValueError:
            raise ValueError(f"{kind}: param_groups[{gi}] has an empty 'params'") from None
        except TypeError as exc:
            raise TypeError(f"{kind}: param_groups[{gi}]: {exc}") from None
        names = [f"param_groups[{gi}].{n}" for n in inner]
        for p, name in zip(plist, names):
            if id(p) in where:
                raise ValueError(f"{kind}: {name} is also {where[id(p)]}; a param belongs "
                                 f"to one param group")
            where[id(p)] = name
        out.append((plist, names, {k: v for k, v in group.items() if k != "params"}))
    return out


def lr_state(lr: Any) -> Any:
    """A group's lr as a state dict holds it: a float, a schedule's dict, or a name."""
    from . import schedules
    if isinstance(lr, schedules.Schedule):
        return lr.to_dict()
    if callable(lr):
        return {"schedule": "callable", "name": callable_name(lr)}
    return lr


def callable_name(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module else name
