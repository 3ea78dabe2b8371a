"""Where Numba caches numbagrad's kernels, settled before any kernel is decorated.

The CPU kernels use ``@njit(cache=True)``, and Numba raises at decoration
("no locator available") when neither ``$NUMBA_CACHE_DIR``, the package's
``__pycache__`` nor the user's cache folder is writable, which made
``import numbagrad`` fail on a read-only install with a read-only home. This
module (imported first by ``numbagrad/__init__.py``) asks Numba's own locator
search once and, when it finds nothing, points Numba at a private temporary
folder for this process, with one warning.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import warnings

import numba
from numba.core.caching import FunctionCache

# a file in the folder whose __pycache__ Numba would use for the kernels
_KERNEL_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", "cpu",
                            "__init__.py")
_private: dict[str, str] = {}


def private_tempdir() -> str:
    """This process's private temporary folder (``tempfile.mkdtemp``: a fresh
    name, mode 0700, owned by this user), made on first use, removed at exit."""
    path = _private.get("path")
    if path is None:
        path = _private["path"] = tempfile.mkdtemp(prefix="numbagrad-")
        owner = os.getpid()
        # a forked child inherits the folder and this hook: only the maker removes it
        atexit.register(lambda: os.getpid() == owner and shutil.rmtree(path, ignore_errors=True))
    return path


def numba_can_cache(py_file: str) -> bool:
    """Whether ``@njit(cache=True)`` finds a writable cache location for a
    function defined in ``py_file`` (asked of Numba's own locator search)."""
    namespace: dict = {}
    exec(compile("def probe():\n    pass\n", py_file, "exec"), namespace)   # noqa: S102
    try:
        FunctionCache(namespace["probe"])
    except RuntimeError:
        return False
    return True


def ensure_numba_cache() -> None:
    """Point Numba's cache at a private temporary folder when no configured or
    default location is writable (a warning says how to keep a cache)."""
    if numba_can_cache(_KERNEL_FILE):
        return
    try:
        folder = os.path.join(private_tempdir(), "numba")
    except OSError as exc:
        raise RuntimeError(f"numbagrad: Numba finds no writable cache location for the kernels "
                           f"in {os.path.dirname(_KERNEL_FILE)} and no temporary folder is "
                           f"usable ({exc}); set NUMBA_CACHE_DIR to a writable folder") from None
    numba.config.CACHE_DIR = folder
    configured = os.environ.get("NUMBA_CACHE_DIR")
    configured = f"NUMBA_CACHE_DIR={configured!r}" if configured else "NUMBA_CACHE_DIR unset"
    warnings.warn(f"numbagrad: no writable cache location for Numba ({configured}; neither "
                  f"{os.path.dirname(_KERNEL_FILE)}/__pycache__ nor the user's cache folder is "
                  f"writable): compiled kernels are cached in {folder} for this process only. "
                  f"Set NUMBA_CACHE_DIR to a writable folder of your own to keep them",
                  RuntimeWarning, stacklevel=2)


ensure_numba_cache()
