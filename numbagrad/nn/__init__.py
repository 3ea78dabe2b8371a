"""Layers in PyTorch's ``nn.Module`` style: ``Module``, ``Linear``, ``Sequential``
and the activations.

Assigning a param or a module to a module's attribute registers it, so
``named_parameters()`` and ``state_dict()`` use PyTorch's names
(``0.weight``, ``0.bias``, ``2.weight``...) and a PyTorch state dict's arrays
load into the same architecture.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .. import kernels, ops
from ..ops._common import is_scalar
from ..tensor import Tensor, param

__all__ = ["Module", "Linear", "Sequential", "ReLU", "LeakyReLU", "Tanh", "Sigmoid"]


class Module:
    """Base class: subclasses set params and submodules as attributes in
    ``__init__`` and compute in ``forward``; call the module to run it."""

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})

    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}.__init__ must call "
                                 "super().__init__() before setting attributes")
        is_param = isinstance(value, Tensor) and value.is_param
        is_module = isinstance(value, Module)
        # Re-assigning keeps the registration order, as PyTorch does.
        if not is_param:
            self._parameters.pop(name, None)
        if not is_module:
            self._modules.pop(name, None)
        if is_param:
            self._parameters[name] = value
        elif is_module:
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        """(name, param) pairs, depth first in registration order, no repeats."""
        seen: set[int] = set()
        for name, p in self._named(prefix):
            if id(p) not in seen:
                seen.add(id(p))
                yield name, p

    def _named(self, prefix: str) -> Iterator[tuple[str, Tensor]]:
        for name, p in self._parameters.items():
            yield prefix + name, p
        for name, module in self._modules.items():
            yield from module._named(f"{prefix}{name}.")

    def parameters(self) -> list[Tensor]:
        """Every param, once each, in ``named_parameters`` order."""
        return [p for _, p in self.named_parameters()]

    def children(self) -> list[Module]:
        return list(self._modules.values())

    def state_dict(self) -> dict[str, np.ndarray]:
        """name -> a host copy of the param's data."""
        return {name: p.numpy() for name, p in self._named("")}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Copy arrays into the params by name; every key, shape and dtype is
        checked before any param changes."""
        mine = dict(self._named(""))
        missing = sorted(set(mine) - set(state))
        unexpected = sorted(set(state) - set(mine))
        if missing or unexpected:
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys "
                           f"{unexpected} for {type(self).__name__}")
        arrays = {}
        for name, p in mine.items():
            value = state[name]
            array = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
            if array.shape != p.shape:
                raise ValueError(f"load_state_dict: {name!r} has shape {array.shape}, the "
                                 f"param has {p.shape}")
            if array.dtype != p.dtype:
                raise TypeError(f"load_state_dict: {name!r} has dtype {array.dtype}, the "
                                f"param has {p.dtype}; convert it first")
            arrays[name] = array
        for name, p in mine.items():
            kernels.call(p._kern, "upload", 0, arrays[name], p._data)

    def to(self, device: str) -> Module:
        """Move every param to ``device`` in place (new params; an optimizer
        built before must be built again). Returns the module."""
        moved: dict[int, Tensor] = {}   # a param shared by two modules stays shared
        for module in self._walk():
            for name, p in list(module._parameters.items()):
                if id(p) not in moved:
                    moved[id(p)] = p.to(device)
                setattr(module, name, moved[id(p)])
        return self

    def _walk(self) -> Iterator[Module]:
        yield self
        for module in self._modules.values():
            yield from module._walk()

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._modules.items())
        return f"{type(self).__name__}({inner})"


class Linear(Module):
    """``y = x @ weight.T + bias`` with weight (out, in), bias (out,), PyTorch's
    default init: uniform in +-1/sqrt(in_features) for both, drawn from
    ``rng`` (a NumPy Generator; a fresh one when None). float64 by default
    because NumPy data is; pass ``dtype=np.float32`` for speed."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 dtype: Any = np.float64, device: str = "cpu",
                 rng: np.random.Generator | None = None) -> None:
        for what, n in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
                raise ValueError(f"Linear: {what} must be a positive integer, got {n!r}")
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng()
        bound = 1.0 / math.sqrt(in_features)
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.weight = param(rng.uniform(-bound, bound, (out_features, in_features)),
                            dtype=dtype, device=device)
        self.bias = (param(rng.uniform(-bound, bound, out_features), dtype=dtype, device=device)
                     if bias else None)

    def forward(self, x: Any) -> Tensor:
        return ops.linear(x, self.weight, self.bias)

    def __repr__(self) -> str:
        return (f"Linear(in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, dtype={self.weight.dtype}, "
                f"device='{self.weight.device}')")


class Sequential(Module):
    """Modules applied in order; indexable, with ``len``; names "0", "1", ...

    A ``Linear`` directly followed by a ``ReLU``, ``Tanh``, ``Sigmoid`` or
    ``LeakyReLU`` (slope >= 0) runs as one ``ng.linear(..., activation=)``:
    the activation is applied in the GEMM's epilogue, one pass fewer over
    the output and one op fewer on the tape (the same values up to the
    rounding of the bias addition; subclasses are never fused).
    """

    def __init__(self, *modules: Module) -> None:
        super().__init__()
        for i, module in enumerate(modules):
            if not isinstance(module, Module):
                raise TypeError(f"Sequential: argument {i} is {type(module).__name__}, "
                                "not an ng.nn.Module")
            setattr(self, str(i), module)

    def forward(self, x: Any) -> Any:
        modules = tuple(self._modules.values())
        i, n = 0, len(modules)
        while i < n:
            module = modules[i]
            i += 1
            if type(module) is Linear and i < n:
                activation = _epilogue(modules[i])
                if activation is not None:
                    x = ops.linear(x, module.weight, module.bias, *activation)
                    i += 1
                    continue
            x = module(x)
        return x

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())


class ReLU(Module):
    def forward(self, x: Any) -> Tensor:
        return ops.relu(x)


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01) -> None:
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: Any) -> Tensor:
        return ops.leaky_relu(x, self.negative_slope)


class Tanh(Module):
    def forward(self, x: Any) -> Tensor:
        return ops.tanh(x)


class Sigmoid(Module):
    def forward(self, x: Any) -> Tensor:
        return ops.sigmoid(x)


def _epilogue(module: Module) -> tuple[str, float] | None:
    """(activation, negative_slope) for ``ops.linear`` if ``module`` can be fused."""
    kind = type(module)
    if kind is ReLU:
        return "relu", 0.0
    if kind is Tanh:
        return "tanh", 0.0
    if kind is Sigmoid:
        return "sigmoid", 0.0
    if kind is LeakyReLU and is_scalar(module.negative_slope) and module.negative_slope >= 0:
        return "leaky_relu", module.negative_slope
    return None


from .conv import Conv1d, Conv2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d  # noqa
