"""``Checkpoint``: a module wrapper whose forward is activation-checkpointed."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..checkpointing import checkpoint
from ..tensor import Tensor
from .module import Module


class Checkpoint(Module):
    """``Checkpoint(module)`` runs ``module`` through ``ng.checkpoint``: its
    activations are recomputed in the backward instead of kept.

    The wrapper is transparent: its params, buffers, submodules, state dict
    keys and ``training`` are the wrapped module's, under the same names (a
    model whose blocks are wrapped loads the unwrapped model's state dict and
    saves one the unwrapped model loads); ``named_modules`` lists the wrapped
    module in the wrapper's place. Attributes not found on the wrapper are
    read from (and set on) the wrapped module; ``.module`` is it. Keyword
    arguments of the forward are passed through as they are.
    """

    def __init__(self, module: Module) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"nn.Checkpoint wraps an nn.Module, got {type(module).__name__}")
        super().__init__()
        object.__setattr__(self, "_wrapped", module)

    @property
    def module(self) -> Module:
        return self._wrapped

    @property   # type: ignore[override]
    def training(self) -> bool:
        wrapped = self.__dict__.get("_wrapped")
        return True if wrapped is None else wrapped.training

    @training.setter
    def training(self, mode: bool) -> None:
        wrapped = self.__dict__.get("_wrapped")
        if wrapped is not None:
            wrapped.train(mode)

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        return checkpoint(self._wrapped, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        wrapped = self.__dict__.get("_wrapped")
        if wrapped is None:
            raise AttributeError(name)
        return getattr(wrapped, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._wrapped, name, value)

    # the module tree: the wrapped module's, under the wrapper's name
    def _named(self, prefix: str) -> Iterator[tuple[str, Tensor]]:
        return self._wrapped._named(prefix)

    def named_modules(self, memo: set | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Module]]:
        return self._wrapped.named_modules(memo, prefix, remove_duplicate)

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return self._wrapped.named_children()

    def named_buffers(self, prefix: str = "", recurse: bool = True
                      ) -> Iterator[tuple[str, Tensor]]:
        return self._wrapped.named_buffers(prefix, recurse)

    def _state(self) -> Iterator[tuple[str, Tensor]]:
        return self._wrapped._state()

    def train(self, mode: bool = True) -> Module:
        self._wrapped.train(mode)
        return self

    def to(self, device: str) -> Module:
        self._wrapped.to(device)
        return self

    def apply(self, fn: Any) -> Module:
        self._wrapped.apply(fn)
        return self

    def __repr__(self) -> str:
        return f"Checkpoint({self._wrapped!r})"
