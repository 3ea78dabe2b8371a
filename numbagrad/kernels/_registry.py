"""The device registry: device name -> its kernel package, and how each
package registers its kernels.

``get`` imports a device package (``cpu``, ``cuda``) on first use, so
CPU-only programs never pay for importing ``numba.cuda``.

Registration rule: every module of a device package is imported, and a
module that declares ``__all__`` registers exactly the kernels it lists
(serial names; the threaded twin of ``foo`` is attribute ``foo_mt`` of the
same module, where one exists). Helper modules (``cpu/_threads.py``,
``cpu/vmath.py``, ``cuda/_core.py``) declare no ``__all__`` and register
nothing; the package itself may register its own kernels (``upload``).
A name registered twice is an error naming both modules, so adding a kernel
is: define it, list it in its module's ``__all__``, on both devices.
``missing`` and ``missing_report`` say which device lacks which kernel.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from . import _diagnose

DEVICES = ("cpu", "cuda")
_loaded: dict[str, ModuleType] = {}

# one source of kernels: (its module's name, the namespace that holds them, their names)
Source = tuple[str, Mapping[str, Any], Iterable[str]]


def check_device(device: str) -> str:
    """Validate a device name; for "cuda" also check that one is usable."""
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; expected one of {DEVICES}")
    if device == "cuda" and "cuda" not in _loaded:
        reason = _diagnose.cuda_unavailable_reason()
        if reason is not None:
            raise RuntimeError(f'device "cuda" requested but not usable: {reason}')
    return device


def get(device: str) -> ModuleType:
    """The kernel package for ``device`` (imported on first use)."""
    module = _loaded.get(device)
    if module is None:
        check_device(device)
        module = importlib.import_module(f"{__package__}.{device}")
        _loaded[device] = module
    return module


def names() -> tuple[str, ...]:
    """Every kernel name, sorted: the CPU registry's (the CUDA one's is the
    same, which ``tests/test_registry.py`` checks); ``kernels.NAMES``."""
    return tuple(sorted(get("cpu").KERNELS))


def family_modules(package: str, path: Iterable[str]) -> list[ModuleType]:
    """Import every module of the package ``package`` (its ``__path__``
    ``path``) and return those that register kernels: the ones declaring
    ``__all__``, in name order."""
    found = []
    for info in sorted(pkgutil.iter_modules(list(path)), key=lambda m: m.name):
        module = importlib.import_module(f"{package}.{info.name}")
        if hasattr(module, "__all__"):
            found.append(module)
    return found


def registry(sources: Iterable[Source]) -> dict[str, tuple]:
    """A device package's ``KERNELS``: name -> ((serial, name), (threaded,
    its name)) for every name of every source, the threaded twin being
    ``name + "_mt"`` of the same source where it has one (else the serial
    kernel again). A name two sources list raises, naming both."""
    out: dict[str, tuple] = {}
    owner: dict[str, str] = {}
    for origin, namespace, listed in sources:
        for name in listed:
            if name in owner:
                raise ValueError(f"kernel {name!r} is registered twice: by {owner[name]} "
                                 f"and by {origin}")
            if name.endswith("_mt"):
                raise ValueError(f"{origin} registers {name!r}: list the serial kernel "
                                 f"{name[:-3]!r}, whose threaded twin is found by name")
            if name not in namespace:
                raise ValueError(f"{origin} registers {name!r} but defines no {name!r}")
            owner[name] = origin
            serial = (namespace[name], name)
            twin = name + "_mt"
            out[name] = (serial, (namespace[twin], twin) if twin in namespace else serial)
    return out


def split(kernels: Mapping[str, tuple]) -> tuple[dict, dict]:
    """A device package's ``KERNEL_FNS``: (name -> serial kernel, name ->
    threaded kernel), the table ``call`` indexes with ``size >= MT_MIN``."""
    return ({n: pair[0][0] for n, pair in kernels.items()},
            {n: pair[1][0] for n, pair in kernels.items()})


def expose(namespace: dict[str, Any], kernels: Mapping[str, tuple]) -> None:
    """Bind every kernel of ``kernels`` and its threaded twin in
    ``namespace`` (a device package's globals), so ``cpu.unary`` and
    ``cpu.unary_mt`` work; a name the package already binds to something
    else (not one of its modules) raises."""
    for pair in kernels.values():
        for fn, name in pair:
            held = namespace.get(name, fn)
            if held is not fn and not isinstance(held, ModuleType):
                raise ValueError(f"kernel {name!r} clashes with {namespace['__name__']}."
                                 f"{name}, which the package defines itself")
            namespace[name] = fn


def register(namespace: dict[str, Any], own: Iterable[str] = ()) -> dict[str, tuple]:
    """Register a device package's kernels (called at the end of its
    ``__init__`` with its ``globals()``): its family modules' and ``own``,
    those it defines itself; binds them all in ``namespace`` and returns
    its ``KERNELS``."""
    package = namespace["__name__"]
    modules = family_modules(package, namespace["__path__"])
    kernels = registry([(package, namespace, tuple(own))]
                       + [(m.__name__, vars(m), m.__all__) for m in modules])
    expose(namespace, kernels)
    return kernels


def missing(names: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """Device -> the kernels (sorted) that another device of ``names``
    (device -> its kernel names) has and it lacks; devices lacking nothing
    are left out, so equal sets give {}."""
    sets = {device: set(listed) for device, listed in names.items()}
    every = set().union(*sets.values())
    return {device: sorted(every - have) for device, have in sets.items() if every - have}


def missing_report(names: Mapping[str, Iterable[str]]) -> str:
    """``missing`` as one line per device ("cuda lacks: foo, bar"), or ""
    when every device has every kernel."""
    return "\n".join(f"{device} lacks: {', '.join(lacks)}"
                     for device, lacks in missing(names).items())
