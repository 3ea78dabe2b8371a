"""``Module``, the base class of every layer, and the change tracking that
``ng.compile`` reads.

Assigning a param or a module to a module's attribute registers it, and
``register_buffer`` registers non-param state, so ``named_parameters()``,
``named_buffers()`` and ``state_dict()`` use PyTorch's names (``0.weight``,
``0.bias``, ``2.weight``..., buffers after their module's params) and a
PyTorch state dict's arrays load into the same architecture.

A compiled step (``numbagrad/compile/``) records with ``_watching``, keeps
``_settled``'s answer and, whenever ``CHANGES`` has moved, asks ``_still``
whether the modules it recorded are as they were.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from .. import _dtypes, kernels
from .._defaults import get_default_dtype
from ..tensor import Tensor, note_writes
from ..tensor import param as _param
from ..tensor import tensor as _tensor

__all__ = ["Module"]

# Counts the changes to any module (a mode switched, an attribute set again):
# a compiled step that sees it move checks the modules it recorded (_still).
CHANGES = [0]
# While ng.compile records: id -> (module, training, version) at its first call.
_CALLED: list = [None]


@contextlib.contextmanager
def _watching() -> Iterator[dict]:
    """Note every module called inside the block, with its state then."""
    previous, called = _CALLED[0], {}
    _CALLED[0] = called
    try:
        yield called
    finally:
        _CALLED[0] = previous


def _state(m: Module) -> tuple:
    return m.training, m.__dict__.get("_version", 0)


def _set_by_recorded_code(m: Module) -> None:
    """While recording: ``m``'s state is the recorded code's to set (it calls
    ``train()`` or sets an attribute itself), so no reason to record again."""
    called = _CALLED[0]
    if called is not None:
        called[id(m)] = (m, None, None)


def _settled(called: dict) -> tuple:
    """The modules of ``called`` that the recorded code did not change itself,
    with their state."""
    return tuple((m, t, v) for m, t, v in called.values()
                 if t is not None and _state(m) == (t, v))


def _still(watch: tuple) -> bool:
    """Whether every module of ``_settled``'s answer is in the state it had."""
    return all(_state(m) == (t, v) for m, t, v in watch)


class Module:
    """Base class: subclasses set params, buffers and submodules as attributes
    in ``__init__`` and compute in ``forward``; call the module to run it.

    ``training`` (True until ``eval()``) tells layers such as ``Dropout``
    which behaviour to use. A compiled step (``ng.compile``) notes the
    modules called while it records, with their mode and version (bumped by
    an attribute set again: a param, submodule or setting replaced), and
    records again when one of them has changed.
    """

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}.__init__ must call "
                                 "super().__init__() before setting attributes")
        if name in self.__dict__:   # a replacement: what a compiled step recorded may be gone
            CHANGES[0] += 1
            object.__setattr__(self, "_version", self.__dict__.get("_version", 0) + 1)
            _set_by_recorded_code(self)
        is_param = isinstance(value, Tensor) and value.is_param
        is_module = isinstance(value, Module)
        if name in self._buffers and not is_param and not is_module:
            value = _buffer(value, f"{type(self).__name__}: buffer {name!r}")
            self._buffers[name] = value
            object.__setattr__(self, name, value)
            return
        # Re-assigning keeps the registration order, as PyTorch does.
        if not is_param:
            self._parameters.pop(name, None)
        if not is_module:
            self._modules.pop(name, None)
        if is_param or is_module:
            self._buffers.pop(name, None)
            self._non_persistent.discard(name)
        if is_param:
            self._parameters[name] = value
        elif is_module:
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        # Only reached when ordinary lookup fails: a submodule registered
        # without an attribute (ModuleDict's keys).
        modules = self.__dict__.get("_modules")
        if modules is not None and name in modules:
            return modules[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        called = _CALLED[0]
        if called is not None and id(self) not in called:   # ng.compile is recording
            called[id(self)] = (self,) + _state(self)
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    # ------------------------------------------------------------ params, buffers
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

    def register_buffer(self, name: str, tensor: Any, persistent: bool = True) -> None:
        """Register ``tensor`` (a Tensor, array data, or None) as a buffer: state
        that is not a param (running statistics), moved by ``to()`` and, when
        ``persistent``, saved in ``state_dict()`` under PyTorch's key. Array
        data becomes a "cpu" tensor of its own dtype (integers stay integers)."""
        where = f"{type(self).__name__}.register_buffer"
        if "_buffers" not in self.__dict__:
            raise AttributeError(f"{where}: call super().__init__() first")
        if not isinstance(name, str) or not name or "." in name:
            raise KeyError(f"{where}: a buffer name is a non-empty string without '.', got "
                           f"{name!r}")
        if name in self._parameters or name in self._modules or (
                hasattr(self, name) and name not in self._buffers):
            raise KeyError(f"{where}: attribute {name!r} already exists")
        value = _buffer(tensor, f"{where}: {name!r}")
        self._buffers[name] = value
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)
        object.__setattr__(self, name, value)

    def named_buffers(self, prefix: str = "", recurse: bool = True
                      ) -> Iterator[tuple[str, Tensor]]:
        """(name, buffer) pairs (None buffers left out), depth first, no repeats."""
        seen: set[int] = set()
        modules = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
        for path, module in modules:
            for name, b in module._buffers.items():
                if b is not None and id(b) not in seen:
                    seen.add(id(b))
                    yield (f"{path}.{name}" if path else name), b

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    # ------------------------------------------------------------ the module tree
    def named_children(self) -> Iterator[tuple[str, Module]]:
        """(name, submodule) of the direct submodules, each once."""
        seen: set[int] = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in seen:
                seen.add(id(module))
                yield name, module

    def children(self) -> Iterator[Module]:
        for _, module in self.named_children():
            yield module

    def named_modules(self, memo: set | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Module]]:
        """(name, module) for this module ("" or ``prefix``) and every one below
        it, depth first in registration order; a shared module once."""
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, module in self._modules.items():
            if module is not None:
                yield from module.named_modules(memo, f"{prefix}.{name}" if prefix else name,
                                                remove_duplicate)

    def modules(self) -> Iterator[Module]:
        for _, module in self.named_modules():
            yield module

    def apply(self, fn: Callable[[Module], Any]) -> Module:
        """``fn(module)`` for every submodule, children first, then this one
        (``model.apply(init_fn)``). Returns the module."""
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    def train(self, mode: bool = True) -> Module:
        """Set ``training`` on this module and every one below it. Returns it."""
        if not isinstance(mode, (bool, np.bool_)):
            raise ValueError(f"{type(self).__name__}.train: mode must be a bool, got {mode!r}")
        for module in self.modules():
            if module.training != bool(mode):
                CHANGES[0] += 1
            object.__setattr__(module, "training", bool(mode))
            _set_by_recorded_code(module)
        return self

    def eval(self) -> Module:
        """``train(False)``: dropout becomes the identity."""
        return self.train(False)

    def zero_grad(self) -> None:
        """Clear every param's ``.grad`` (``p.grad = None``: the accumulator is
        zeroed, see the README; mid-window this warns as ``opt.zero_grad`` does)."""
        for p in self.parameters():
            p.grad = None

    # ------------------------------------------------------------ state dicts
    def _state(self) -> Iterator[tuple[str, Tensor]]:
        """PyTorch's state-dict entries: each module's params, then its
        persistent buffers, then its submodules'."""
        for path, module in self.named_modules(remove_duplicate=False):
            head = f"{path}." if path else ""
            for name, p in module._parameters.items():
                yield head + name, p
            for name, b in module._buffers.items():
                if b is not None and name not in module._non_persistent:
                    yield head + name, b

    def state_dict(self) -> dict[str, np.ndarray]:
        """name -> a host copy of the param's or persistent buffer's data."""
        return {name: t.numpy() for name, t in self._state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Copy arrays into the params and buffers by name; every key, shape
        and dtype is checked before anything changes."""
        mine = dict(self._state())
        missing = sorted(set(mine) - set(state))
        unexpected = sorted(set(state) - set(mine))
        if missing or unexpected:
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys "
                           f"{unexpected} for {type(self).__name__}")
        arrays = {}
        for name, p in mine.items():
            value = state[name]
            array = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
            what = "param" if p.is_param else "buffer"
            if array.shape != p.shape:
                raise ValueError(f"load_state_dict: {name!r} has shape {array.shape}, the "
                                 f"{what} has {p.shape}")
            if array.dtype != p.dtype:
                raise TypeError(f"load_state_dict: {name!r} has dtype {array.dtype}, the "
                                f"{what} has {p.dtype}; convert it first")
            arrays[name] = array
        for name, p in mine.items():
            kernels.call(p._kern, "upload", 0, arrays[name], p._data)
        note_writes(mine.values())   # in place: a graph recorded before refuses backward

    def to(self, device: str | None = None, dtype: Any = None) -> Module:
        """Move every param and buffer to ``device`` and/or cast the float
        ones to the float ``dtype`` (``model.to(ng.bfloat16)``, as PyTorch's
        ``module.to``), in place: new params, so an optimizer built before
        must be built again. Returns the module."""
        if device is not None:
            kernels.check_device(device)
        if dtype is not None:
            dtype = _dtypes.tensor_dtype(dtype, "Module.to")
            if not _dtypes.is_float(dtype):
                raise TypeError(f"Module.to: dtype must be a float dtype, got {dtype}")
        moved: dict[int, Tensor] = {}   # a param shared by two modules stays shared
        for module in self.modules():
            for table in (module._parameters, module._buffers):
                for name, t in list(table.items()):
                    if t is None:
                        continue
                    if id(t) not in moved:
                        moved[id(t)] = _moved(t, device, dtype)
                    if table is module._buffers:
                        table[name] = moved[id(t)]
                        object.__setattr__(module, name, moved[id(t)])
                    else:
                        setattr(module, name, moved[id(t)])
        return self

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._modules.items())
        return f"{type(self).__name__}({inner})"


def _moved(t: Tensor, device: str | None, dtype: Any) -> Tensor:
    """``t`` on ``device`` with a float ``t`` cast to ``dtype`` (either None:
    kept); a param stays a (new) param, a buffer a tensor."""
    if dtype is not None and _dtypes.is_float(t.dtype) and t.dtype != dtype:
        build = _param if t.is_param else _tensor
        # (host float32 first: a half rounds from float32 as the kernels do)
        host = t.numpy().astype(np.float64 if dtype == np.float64 else np.float32)
        return build(host, dtype=dtype, device=device or t.device)
    return t if device is None else t.to(device)


def _buffer(value: Any, where: str) -> Tensor | None:
    """A buffer's value: None, a non-param Tensor, or array data as a "cpu"
    tensor that keeps its dtype."""
    if value is None:
        return None
    if isinstance(value, Tensor):
        if value.is_param:
            raise TypeError(f"{where}: a param cannot be a buffer (assign it as an attribute)")
        return value
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{where}: a buffer holds numbers, got dtype {array.dtype}")
    kern = kernels.get("cpu")
    return Tensor(kernels.from_host(kern, array), kern)


@contextlib.contextmanager
def _allocating(layer: str, shape: tuple) -> Iterator[None]:
    """Name ``layer`` and its largest parameter's ``shape`` in a MemoryError
    (or NumPy's ValueError for a size past its index range) raised while
    the layer allocates its parameters."""
    try:
        yield
    except (MemoryError, ValueError) as exc:
        if isinstance(exc, ValueError) and "too big" not in str(exc):
            raise
        raise MemoryError(f"{layer}: its parameter of shape {shape} "
                          f"({math.prod(shape):,} elements) cannot be allocated: {exc}") from None


def _dtype(dtype: Any) -> Any:
    """A layer's ``dtype=``: None means ``ng.get_default_dtype()`` now, at
    construction (a later ``set_default_dtype`` leaves built layers alone)."""
    return get_default_dtype() if dtype is None else dtype
