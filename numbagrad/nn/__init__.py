"""Layers in PyTorch's ``nn.Module`` style: ``Module``, ``Linear``, ``Sequential``,
the activations, ``Identity``, ``Flatten``, ``Dropout``, ``Embedding``,
``ModuleList``, ``ModuleDict``; initialisers in ``nn.init``.

Assigning a param or a module to a module's attribute registers it, and
``register_buffer`` registers non-param state, so ``named_parameters()``,
``named_buffers()`` and ``state_dict()`` use PyTorch's names (``0.weight``,
``0.bias``, ``2.weight``..., buffers after their module's params) and a
PyTorch state dict's arrays load into the same architecture.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from .. import kernels, ops
from ..kernels import scalar as _codes
from ..ops._common import is_scalar
from ..tensor import Tensor, param
from ..tensor import tensor as _tensor

__all__ = ["Module", "Linear", "Sequential", "ReLU", "LeakyReLU", "Tanh", "Sigmoid"]


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

    def to(self, device: str) -> Module:
        """Move every param and buffer to ``device`` in place (new params; an
        optimizer built before must be built again). Returns the module."""
        kernels.check_device(device)
        moved: dict[int, Tensor] = {}   # a param shared by two modules stays shared
        for module in self.modules():
            for table in (module._parameters, module._buffers):
                for name, t in list(table.items()):
                    if t is None:
                        continue
                    if id(t) not in moved:
                        moved[id(t)] = t.to(device)
                    if table is module._buffers:
                        table[name] = moved[id(t)]
                        object.__setattr__(module, name, moved[id(t)])
                    else:
                        setattr(module, name, moved[id(t)])
        return self

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._modules.items())
        return f"{type(self).__name__}({inner})"


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
        with _allocating("Linear", (self.out_features, self.in_features)):
            self.weight = param(rng.uniform(-bound, bound, (out_features, in_features)),
                                dtype=dtype, device=device)
            self.bias = (param(rng.uniform(-bound, bound, out_features), dtype=dtype,
                               device=device) if bias else None)

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
    _linear_activation = "relu"   # see _epilogue

    def forward(self, x: Any) -> Tensor:
        return ops.relu(x)


class LeakyReLU(Module):
    _linear_activation = "leaky_relu"

    def __init__(self, negative_slope: float = 0.01) -> None:
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: Any) -> Tensor:
        return ops.leaky_relu(x, self.negative_slope)


class Tanh(Module):
    _linear_activation = "tanh"

    def forward(self, x: Any) -> Tensor:
        return ops.tanh(x)


class Sigmoid(Module):
    _linear_activation = "sigmoid"

    def forward(self, x: Any) -> Tensor:
        return ops.sigmoid(x)


class GELU(Module):
    """``ng.gelu`` (``approximate="none"`` or ``"tanh"``), as ``torch.nn.GELU``."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        ops.gelu(_tensor(np.zeros(1)), approximate)   # a bad value raises here, not later
        self.approximate = approximate

    def forward(self, x: Any) -> Tensor:
        return ops.gelu(x, self.approximate)


class SiLU(Module):
    _linear_activation = "silu"

    def forward(self, x: Any) -> Tensor:
        return ops.silu(x)


class Softplus(Module):
    """``ng.softplus``, as ``torch.nn.Softplus(beta, threshold)``."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        ops.softplus(_tensor(np.zeros(1)), beta, threshold)   # bad values raise here
        self.beta, self.threshold = beta, threshold

    def forward(self, x: Any) -> Tensor:
        return ops.softplus(x, self.beta, self.threshold)


__all__ += ["GELU", "SiLU", "Softplus"]


# ------------------------------------------------ generic layers and containers
__all__ += ["Identity", "Flatten", "Dropout", "Embedding", "ModuleList", "ModuleDict", "init"]


class Identity(Module):
    """Returns its input (arguments to the constructor are ignored, as PyTorch's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def forward(self, x: Any) -> Any:
        return x


class Flatten(Module):
    """``ng.flatten(x, start_dim, end_dim)``; by default keeps the batch dim."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Any) -> Tensor:
        return ops.flatten(x, self.start_dim, self.end_dim)

    def __repr__(self) -> str:
        return f"Flatten(start_dim={self.start_dim}, end_dim={self.end_dim})"


class Dropout(Module):
    """``ng.dropout(x, p, training=self.training)``: the identity after
    ``eval()``. Masks come from numbagrad's generator (``ng.manual_seed``)
    unless ``generator=`` (a NumPy Generator, which stays the caller's to
    save) is given."""

    def __init__(self, p: float = 0.5, *, generator: np.random.Generator | None = None) -> None:
        if not is_scalar(p) or not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be a probability in [0, 1], got {p!r}")
        super().__init__()
        self.p, self.generator = float(p), generator

    def forward(self, x: Any) -> Tensor:
        return ops.dropout(x, self.p, self.training, generator=self.generator)

    def __repr__(self) -> str:
        return f"Dropout(p={self.p})"


class Embedding(Module):
    """A (num_embeddings, embedding_dim) ``weight`` looked up by integer
    indices (``ng.embedding``), PyTorch's default init N(0, 1) drawn from
    ``rng`` (a NumPy Generator; a fresh one when None) and the
    ``padding_idx`` row zeroed; that row gets no gradient."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 *, dtype: Any = np.float64, device: str = "cpu",
                 rng: np.random.Generator | None = None) -> None:
        for what, n in (("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim)):
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
                raise ValueError(f"Embedding: {what} must be a positive integer, got {n!r}")
        if padding_idx is not None:
            if isinstance(padding_idx, bool) or not isinstance(padding_idx, (int, np.integer)) \
                    or not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"Embedding: padding_idx must be an int in "
                                 f"[{-num_embeddings}, {num_embeddings - 1}], got "
                                 f"{padding_idx!r}")
            padding_idx = int(padding_idx) % num_embeddings
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng()
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.padding_idx = padding_idx
        with _allocating("Embedding", (self.num_embeddings, self.embedding_dim)):
            weight = rng.standard_normal((num_embeddings, embedding_dim))
            if padding_idx is not None:
                weight[padding_idx] = 0.0
            self.weight = param(weight, dtype=dtype, device=device)

    def forward(self, idx: Any) -> Tensor:
        return ops.embedding(idx, self.weight, self.padding_idx)

    def __repr__(self) -> str:
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"Embedding({self.num_embeddings}, {self.embedding_dim}{pad})"


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


from . import init  # noqa: E402  (init's functions need nothing of this module)


def _epilogue(module: Module) -> tuple[str, float] | None:
    """(activation, negative_slope) for ``ops.linear`` if ``module`` can be fused
    into the GEMM before it: its class (not a subclass, which may compute
    something else) names an op in ``_linear_activation`` whose code's record
    (``kernels/scalar.py``) puts it in the GEMM's epilogue. (The fused codes
    that keep their pre-activation, GELU's and SiLU's, save only one pass and
    would change the bias's order of addition, so ``Sequential`` runs them as
    written.)"""
    name = type(module).__dict__.get("_linear_activation")
    code = _codes.ACTIVATIONS.get(name)
    if code is None or code not in _codes.EPILOGUE:
        return None
    if code != _codes.LEAKY_RELU:
        return name, 0.0
    slope = module.negative_slope
    return (name, slope) if is_scalar(slope) and slope >= 0 else None


# the layer families in modules of their own (they build on the classes above)
from .attention import MultiheadAttention  # noqa: E402
from .conv import AdaptiveAvgPool2d, AvgPool2d, Conv1d, Conv2d, MaxPool2d  # noqa: E402
from .norm import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm  # noqa: E402

__all__ += ["Conv1d", "Conv2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "LayerNorm",
            "GroupNorm", "BatchNorm1d", "BatchNorm2d", "MultiheadAttention"]
