"""The containers: ``Sequential`` (modules run in order), ``ModuleList`` and
``ModuleDict`` (submodules registered under PyTorch's names, no ``forward``).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .fusion import _run_fused
from .module import Module

__all__ = ["Sequential", "ModuleList", "ModuleDict"]


class Sequential(Module):
    """Modules applied in order; indexable (a slice gives a Sequential), with
    ``len``; names "0", "1", ..., or, given one ``OrderedDict`` of name ->
    module (PyTorch's other form), its keys: ``Sequential(OrderedDict([("fc",
    Linear(4, 2)), ("act", ReLU())]))`` has ``seq.fc``, ``seq[0]`` and the
    state-dict key ``fc.weight``. A key is a non-empty string without "."
    that is no attribute of the module, as PyTorch's.

    A ``Linear`` directly followed by a ``ReLU``, ``Tanh``, ``Sigmoid`` or
    ``LeakyReLU`` (slope >= 0) runs as one ``ng.linear(..., activation=)``:
    the activation is applied in the GEMM's epilogue, one pass fewer over
    the output and one op fewer on the tape (the same values up to the
    rounding of the bias addition; subclasses are never fused; ``fusion.py``).
    """

    def __init__(self, *modules: Any) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            pairs = list(modules[0].items())
            for key, module in pairs:     # all checked before any is added
                _checked_key(self, key)
                _checked_module(module, f"Sequential: {key!r}")
        else:
            for i, module in enumerate(modules):
                if not isinstance(module, Module):
                    hint = (" (pass an OrderedDict for named modules, as PyTorch)"
                            if isinstance(module, Mapping) else "")
                    raise TypeError(f"Sequential: argument {i} is {type(module).__name__}, "
                                    f"not an ng.nn.Module{hint}")
            pairs = [(str(i), module) for i, module in enumerate(modules)]
        for key, module in pairs:
            setattr(self, key, module)

    def forward(self, x: Any) -> Any:
        return _run_fused(tuple(self._modules.values()), x)

    def __getitem__(self, i: Any) -> Module | Sequential:
        if isinstance(i, slice):
            return Sequential(OrderedDict(list(self._modules.items())[i]))
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"Sequential indices must be integers or slices, not "
                            f"{type(i).__name__} (a name is an attribute: seq.name)")
        n = len(self._modules)
        if not -n <= i < n:
            raise IndexError(f"Sequential: index {i} is out of range for {n} modules")
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())


def _checked_module(module: Any, where: str) -> Module:
    if not isinstance(module, Module):
        raise TypeError(f"{where}: {type(module).__name__} is not an ng.nn.Module")
    return module


def _checked_key(owner: Module, key: Any) -> None:
    """A submodule name PyTorch accepts: a non-empty string without ".", not
    already another attribute of ``owner``."""
    where = type(owner).__name__
    if not isinstance(key, str) or not key or "." in key:
        raise KeyError(f"{where}: a key is a non-empty string without '.', got {key!r}")
    if key not in owner._modules and hasattr(owner, key):
        raise KeyError(f"{where}: attribute {key!r} already exists")


class ModuleList(Module):
    """Submodules in a list, registered as "0", "1", ... (PyTorch's names);
    indexable (a slice gives a ModuleList), iterable, with ``append``,
    ``extend``, ``insert`` and ``del``. It has no ``forward``."""

    def __init__(self, modules: Any = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _index(self, i: Any) -> int:
        n = len(self._modules)
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"ModuleList indices must be integers or slices, not "
                            f"{type(i).__name__}")
        if not -n <= i < n:
            raise IndexError(f"ModuleList: index {i} is out of range for {n} modules")
        return int(i) % n

    def _renumber(self, modules: list[Module]) -> None:
        for name in list(self._modules):
            object.__delattr__(self, name)
        self._modules.clear()
        for i, module in enumerate(modules):
            setattr(self, str(i), module)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return ModuleList(list(self._modules.values())[i])
        return self._modules[str(self._index(i))]

    def __setitem__(self, i: Any, module: Module) -> None:
        setattr(self, str(self._index(i)), _checked_module(module, "ModuleList"))

    def __delitem__(self, i: Any) -> None:
        modules = list(self._modules.values())
        if isinstance(i, slice):
            del modules[i]
        else:
            del modules[self._index(i)]
        self._renumber(modules)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self._modules.values()))

    def append(self, module: Module) -> ModuleList:
        setattr(self, str(len(self._modules)), _checked_module(module, "ModuleList.append"))
        return self

    def extend(self, modules: Any) -> ModuleList:
        modules = list(modules)
        for i, module in enumerate(modules):
            _checked_module(module, f"ModuleList: item {i}")
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        modules = list(self._modules.values())
        modules.insert(index, _checked_module(module, "ModuleList.insert"))
        self._renumber(modules)


class ModuleDict(Module):
    """Submodules by string key, in insertion order (``state_dict`` names are
    ``key.weight``...); a mapping with ``keys``, ``values``, ``items``,
    ``update``, ``pop`` and ``clear``. As in PyTorch a key is a name
    without "." that is no attribute of the module (``"train"`` is refused);
    ``md[key]`` and ``md.key`` reach it. It has no ``forward``."""

    def __init__(self, modules: Any = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        try:
            return self._modules[key]
        except KeyError:
            raise KeyError(f"ModuleDict has no key {key!r}; keys: {list(self._modules)}") \
                from None

    def __setitem__(self, key: str, module: Module) -> None:
        _checked_key(self, key)
        self._modules[key] = _checked_module(module, f"ModuleDict[{key!r}]")

    def __delitem__(self, key: str) -> None:
        self[key]
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._modules))

    def __contains__(self, key: object) -> bool:
        return key in self._modules

    def keys(self) -> list[str]:
        return list(self._modules)

    def values(self) -> list[Module]:
        return list(self._modules.values())

    def items(self) -> list[tuple[str, Module]]:
        return list(self._modules.items())

    def update(self, modules: Any) -> None:
        """Add (key, module) pairs from a mapping or an iterable of pairs; all
        are checked before any is added."""
        pairs = list(modules.items()) if isinstance(modules, Mapping) else \
            [tuple(pair) for pair in modules]
        for pair in pairs:
            if len(pair) != 2:
                raise ValueError(f"ModuleDict.update: expected (key, module) pairs, got "
                                 f"{pair!r}")
            _checked_module(pair[1], f"ModuleDict.update: {pair[0]!r}")
            _checked_key(self, pair[0])
        for key, module in pairs:
            self[key] = module

    def pop(self, key: str) -> Module:
        module = self[key]
        del self._modules[key]
        return module

    def clear(self) -> None:
        self._modules.clear()
