"""One table from device name to its kernel module.

Each module (``cpu``, ``cuda``) exposes the same kernel names with the same
destination-passing signatures, plus ``empty``, ``from_host``, ``to_host`` and
``is_device_array``. Callers look a module up here and never branch on the
device themselves. The CUDA module is imported on first use only, so CPU-only
programs never pay for importing ``numba.cuda``.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

DEVICES = ("cpu", "cuda")
_loaded: dict[str, ModuleType] = {}


def env_int(key: str, default: int, minimum: int = 0) -> int:
    """The integer in environment variable ``key`` (``default`` when unset),
    checked to be at least ``minimum``; the kernel packages' settings read
    through this one function."""
    raw = os.environ.get(key)
    try:
        value = default if raw is None else int(raw)
    except ValueError:
        raise ValueError(f"{key} must be an integer >= {minimum}, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{key} must be an integer >= {minimum}, got {value}")
    return value


def cuda_available() -> bool:
    """True when a CUDA device (or Numba's CUDA simulator) is usable."""
    return cuda_unavailable_reason() is None


def cuda_unavailable_reason() -> str | None:
    """Why device="cuda" cannot be used here, or None when it can.

    The CUDA kernels need numba-cuda (the ``cuda`` extra), on a GPU and on
    the simulator alike: without it ``numba.cuda`` is Numba's own built-in
    target, which imports (and, under NUMBA_ENABLE_CUDASIM=1, reports
    itself available) but cannot run numbagrad's kernels.
    """
    try:
        installed = importlib.util.find_spec("numba_cuda") is not None
    except (ImportError, ValueError):    # a broken or half-removed install
        installed = False
    if not installed:
        return ('numba-cuda is not installed (numba\'s own numba.cuda cannot run the CUDA '
                'kernels, not even on the simulator): pip install "numbagrad[cuda]"')
    try:
        from numba import cuda
    except Exception as exc:  # numba-cuda broken
        return f'numba.cuda cannot be imported ({exc}); reinstall "numbagrad[cuda]"'
    if getattr(cuda, "implementation", None) != "NVIDIA":
        return ("numba.cuda is Numba's built-in target, not numba-cuda's (its redirect did not "
                'apply, e.g. under python -S); reinstall "numbagrad[cuda]"')
    try:
        if cuda.is_available():
            return None
        cuda.current_context()
    except Exception as exc:
        return f"no usable CUDA GPU or driver ({str(exc).strip() or type(exc).__name__})"
    return "no usable CUDA GPU or driver"


def check_device(device: str) -> str:
    """Validate a device name; for "cuda" also check that one is usable."""
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; expected one of {DEVICES}")
    if device == "cuda" and "cuda" not in _loaded:
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise RuntimeError(f'device "cuda" requested but not usable: {reason}')
    return device


def get(device: str) -> ModuleType:
    """The kernel module for ``device`` (imported on first use)."""
    module = _loaded.get(device)
    if module is None:
        check_device(device)
        module = importlib.import_module(f"numbagrad.kernels.{device}")
        _loaded[device] = module
    return module
