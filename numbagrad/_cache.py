"""Where Numba caches numbagrad's kernels, settled before any kernel is decorated.

The CPU kernels use ``@njit(cache=True)``, and Numba raises at decoration
("no locator available") when neither ``$NUMBA_CACHE_DIR``, the package's
``__pycache__`` nor the user's cache folder is writable, which made
``import numbagrad`` fail on a read-only install with a read-only home. This
module (imported first by ``numbagrad/__init__.py``) asks Numba's own locator
search once and, when it finds nothing, points Numba at a private temporary
folder for this process, with one warning.

It also guards Numba's cache files (``guard_numba_cache``): a truncated or
corrupt index (``*.nbi``) or data file (``*.nbc``) made every call of its
kernel raise ``EOFError`` or ``UnpicklingError``, and one that is not a
regular file (a FIFO) made the first call block forever. Such a file is
removed instead, with one warning per cache folder, and the kernel is
compiled again and cached anew. The guard wraps two methods of Numba's
``IndexDataCacheFile``, so it covers every ``cache=True`` function of the
process (numbagrad's kernels, ng.compile's steps, the user's own); it is
installed only where that class looks as expected, else Numba is left as is.
"""
from __future__ import annotations

import atexit
import inspect
import os
import shutil
import tempfile
import warnings
from stat import S_ISDIR, S_ISREG
from typing import Any, Callable

import numba
from numba.core import caching
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


class _NotRegular(OSError):
    """A Numba cache file that is not a regular file (never opened: a FIFO blocks)."""


def _check_regular(path: str) -> None:
    """Raise ``_NotRegular`` unless ``path`` is a regular file (FileNotFoundError
    when there is none). Numba follows symlinks, so this does too. Numba's own
    open follows this check: a file swapped for a FIFO in between still blocks."""
    if not S_ISREG(os.stat(path).st_mode):
        raise _NotRegular(f"not a regular file: {path}")


_warned_folders: set[str] = set()     # Numba cache folders already warned about


def _warn_once(folder: str, message: str) -> None:
    if folder not in _warned_folders:
        _warned_folders.add(folder)
        warnings.warn(f"{message}. Other unusable cache files in {folder} are handled so "
                      f"without another warning", RuntimeWarning, stacklevel=3)


def _discard(cache_file: Any, path: str, exc: BaseException) -> None:
    """Remove the unusable Numba cache file ``path`` of ``cache_file`` (an
    ``IndexDataCacheFile``) so the kernel is compiled and cached again, or,
    when it cannot be removed (a folder), stop caching through ``cache_file``."""
    try:
        if S_ISDIR(os.lstat(path).st_mode):
            raise IsADirectoryError("it is a folder")
        os.unlink(path)
        outcome = "removed it; the kernel is compiled again and cached anew"
    except FileNotFoundError:
        outcome = "it is gone; the kernel is compiled again and cached anew"
    except OSError as err:
        cache_file._numbagrad_off = True
        outcome = (f"it cannot be removed ({err.strerror or err}); the kernel is compiled "
                   f"and not cached")
    reason = ("not a regular file" if isinstance(exc, _NotRegular)
              else f"{type(exc).__name__}: {exc}")
    _warn_once(os.path.dirname(path),
               f"numbagrad: the Numba cache file {path} is unusable ({reason}); {outcome}")


def _guarded_load(original: Callable) -> Callable:
    def load(self: Any, key: Any) -> Any:
        """Numba's ``IndexDataCacheFile.load``, with a damaged or non-regular
        file treated as a miss (and removed) rather than raising or blocking."""
        if getattr(self, "_numbagrad_off", False):
            return None
        path = self._index_path
        try:
            _check_regular(path)
            name = self._load_index().get(key)
            if name is None:
                return None
            path = self._data_path(name)
            _check_regular(path)
            return self._load_data(name)
        except FileNotFoundError:        # Numba's own answer to a missing file: a miss
            return None
        except Exception as exc:  # noqa: BLE001 (any unreadable entry: compile again)
            _discard(self, path, exc)
            return None
    load.__wrapped__ = original         # type: ignore[attr-defined]
    load._numbagrad_guard = True        # type: ignore[attr-defined]
    return load


def _guarded_save(original: Callable) -> Callable:
    def save(self: Any, key: Any, data: Any) -> None:
        """Numba's ``IndexDataCacheFile.save``, after the same check of the index
        it reads first; a cache file that cannot be written leaves the kernel
        uncached (one warning) instead of failing the call."""
        if getattr(self, "_numbagrad_off", False):
            return
        try:
            _check_regular(self._index_path)
            self._load_index()
        except FileNotFoundError:
            pass
        except Exception as exc:  # noqa: BLE001 (damaged since the load: start it anew)
            _discard(self, self._index_path, exc)
            if getattr(self, "_numbagrad_off", False):
                return
        try:
            original(self, key, data)
        except OSError as exc:           # a folder where a file goes, a full disk
            self._numbagrad_off = True
            _warn_once(self._cache_path, f"numbagrad: Numba cannot write its cache files in "
                                         f"{self._cache_path} ({exc}); the kernel is not cached")
    save.__wrapped__ = original         # type: ignore[attr-defined]
    return save


# the parameters of what the guard calls, as in numba.core.caching of Numba 0.68
_EXPECTED = {"load": ["self", "key"], "save": ["self", "key", "data"],
             "_load_index": ["self"], "_load_data": ["self", "name"],
             "_data_path": ["self", "name"]}


def guard_numba_cache() -> bool:
    """Wrap ``numba.core.caching.IndexDataCacheFile.load`` and ``.save`` (see the
    module docstring) when that class has the methods and attributes the guard
    uses, with the expected parameters; otherwise change nothing (Numba then
    behaves as without numbagrad). True when the guard is installed."""
    cls = getattr(caching, "IndexDataCacheFile", None)
    if cls is None:
        return False
    if getattr(cls.load, "_numbagrad_guard", False):
        return True                     # installed by an earlier import of this module
    try:
        for name, params in _EXPECTED.items():
            if list(inspect.signature(getattr(cls, name)).parameters) != params:
                return False
        probe = cls(cache_path="folder", filename_base="base", source_stamp=None)   # no I/O
        paths = (probe._index_path, probe._cache_path, probe._data_path("base.1.nbc"))
    except (AttributeError, TypeError, ValueError):
        return False
    if not all(isinstance(path, str) for path in paths):
        return False
    cls.load = _guarded_load(cls.load)
    cls.save = _guarded_save(cls.save)
    return True


ensure_numba_cache()
numba_cache_guarded = guard_numba_cache()
