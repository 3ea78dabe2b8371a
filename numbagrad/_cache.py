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

And it makes a kernel's cache follow the files it calls into
(``stamp_numba_cache``): Numba checks a cached function against its own
source file only, so an edit to a formula record in ``kernels/codes.py``
(whose dispatch ladders the kernels compile in) left every kernel of
``kernels/cpu/elementwise.py`` running its old code. For the package's own
files the stamp Numba compares also covers every numbagrad module the file
imports, transitively, so such an edit recompiles exactly the kernels that
can see it.
"""
from __future__ import annotations

import ast
import atexit
import functools
import hashlib
import inspect
import os
import shutil
import sys
import tempfile
import warnings
from stat import S_ISDIR, S_ISREG
from typing import Any, Callable

import numba
from numba.core import caching
from numba.core.caching import FunctionCache

# a file in the folder whose __pycache__ Numba would use for the kernels
_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_KERNEL_FILE = os.path.join(_PACKAGE, "kernels", "cpu", "__init__.py")
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


def _module_file(package_dir: str, dotted: str) -> str | None:
    """The file of module ``dotted`` (relative to ``package_dir``), if there is one."""
    base = os.path.join(package_dir, *dotted.split(".")) if dotted else package_dir
    for candidate in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _relative_imports(path: str) -> frozenset[str]:
    """``_parsed_imports`` of ``path`` as it is now (parsed again only once
    it changes: every ``cache=True`` kernel asks at its decoration)."""
    try:
        st = os.stat(path)
    except OSError:
        return frozenset()
    return _parsed_imports(path, st.st_mtime, st.st_size)


@functools.lru_cache(maxsize=None)
def _parsed_imports(path: str, mtime: float, size: int) -> frozenset[str]:
    """The numbagrad kernel files ``path`` imports relatively at its top level
    (``from .x import y``, ``from .. import codes``: a name that is a module
    counts as its file), leaving out package ``__init__.py`` files (device
    tables and plumbing, never code a kernel compiles in) and imports inside
    functions."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    found = set()
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        here = os.path.dirname(path)
        for _ in range(node.level - 1):
            here = os.path.dirname(here)
        if not here.startswith(_PACKAGE):
            continue
        own = _module_file(here, node.module or "")
        for alias in node.names:     # from .. import codes: the module codes
            sub = _module_file(here, f"{node.module}.{alias.name}" if node.module
                               else alias.name)
            found.add(sub if sub is not None else own)   # else a name defined in ``own``
    return frozenset(f for f in found if f is not None and f != path
                     and os.path.basename(f) != "__init__.py")


@functools.lru_cache(maxsize=None)
def _dependency_stamp(path: str, stamps: tuple) -> str:
    """sha256 over the contents of every numbagrad file ``path`` imports,
    transitively (``stamps``: their (path, mtime, size), the memo's key)."""
    digest = hashlib.sha256()
    for file, _, _ in stamps:
        with open(file, "rb") as f:
            name = os.path.relpath(file, _PACKAGE).encode()   # a copied tree keeps its stamps
            digest.update(name + b"\0" + hashlib.sha256(f.read()).digest())
    return digest.hexdigest()


def dependency_stamp(path: str) -> str | None:
    """What changes whenever a numbagrad kernel file that ``path`` (a numbagrad
    source file) imports, directly or not, changes (``_relative_imports``);
    None outside the package."""
    path = os.path.abspath(path)
    if not path.startswith(_PACKAGE + os.sep):
        return None
    seen: set[str] = set()
    todo = [path]
    while todo:
        file = todo.pop()
        for dep in _relative_imports(file):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    seen.discard(path)
    stamps = []
    for file in sorted(seen):
        st = os.stat(file)
        stamps.append((file, st.st_mtime, st.st_size))
    return _dependency_stamp(path, tuple(stamps))


def _stamped(original: Callable) -> Callable:
    def get_source_stamp(self: Any) -> Any:
        """Numba's source stamp, with the stamp of the numbagrad files this
        function's file imports (see the module docstring)."""
        stamp = original(self)
        path = getattr(self, "_py_file", None)
        try:
            extra = dependency_stamp(path) if isinstance(path, str) else None
        except OSError:
            extra = None
        return stamp if extra is None else (stamp, extra)
    get_source_stamp.__wrapped__ = original         # type: ignore[attr-defined]
    get_source_stamp._numbagrad_stamp = True        # type: ignore[attr-defined]
    return get_source_stamp


def stamp_numba_cache() -> bool:
    """Make Numba's source stamp of a numbagrad file cover the numbagrad files
    it imports (wrapping ``_SourceFileBackedLocatorMixin.get_source_stamp``)
    when that class is as expected; otherwise change nothing (an edit to a
    formula then needs ``numbagrad/kernels/cpu/__pycache__`` cleared). True
    when installed."""
    mixin = getattr(caching, "_SourceFileBackedLocatorMixin", None)
    method = getattr(mixin, "get_source_stamp", None)
    if method is None:
        return False
    if getattr(method, "_numbagrad_stamp", False):
        return True
    try:
        if list(inspect.signature(method).parameters) != ["self"]:
            return False
    except (TypeError, ValueError):
        return False
    mixin.get_source_stamp = _stamped(method)
    return True


class _GeneratedLocator:
    """Numba's cache locator for a function numbagrad generates (a dispatch
    ladder: ``kernels.dispatch.ladder`` with an ``origin``, whose source is
    named ``<numbagrad dispatch ...>``): no stock locator takes a
    source without a file; this one asks them for the file of the numbagrad
    module that made it, so the function is cached, and stamped, as one
    defined there, its stamp extended by its own source and the globals it
    names (Numba's index key holds its bytecode, not its constants)."""

    def __init__(self, locator: Any, extra: str) -> None:
        self._locator, self._extra = locator, extra

    def __getattr__(self, name: str) -> Any:
        return getattr(self._locator, name)

    def get_source_stamp(self) -> Any:
        return (self._locator.get_source_stamp(), self._extra)

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> Any:
        module = sys.modules.get(getattr(py_func, "__module__", None) or "")
        origin = getattr(module, "__file__", None)
        if not (py_file.startswith("<numbagrad dispatch ") and isinstance(origin, str)
                and module.__name__.startswith("numbagrad.")):
            return None
        for stock in _STOCK_LOCATORS:
            locator = stock.from_function(py_func, origin)
            if locator is not None:
                return cls(locator, _generated_stamp(py_func))
        return None


def _generated_stamp(py_func: Any) -> str:
    """A digest of a generated function's source and of what each global it
    names is (a function by its module and name, any other value by repr)."""
    digest = hashlib.sha256(str(getattr(py_func, "__source__", "")).encode())
    for name in sorted(set(py_func.__code__.co_names) & set(py_func.__globals__)):
        value = py_func.__globals__[name]
        inner = getattr(value, "py_func", value)
        what = (f"{getattr(inner, '__module__', '')}.{getattr(inner, '__qualname__', '')}"
                if callable(inner) else repr(value))
        digest.update(f"{name}={what}\0".encode())
    return digest.hexdigest()


_STOCK_LOCATORS = tuple(getattr(caching, n) for n in (
    "UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator")
    if hasattr(caching, n))


def locate_generated() -> bool:
    """Let ``@njit(cache=True)`` cache the functions numbagrad generates with
    an origin (``_GeneratedLocator``, first in Numba's list of locators),
    when Numba's cache machinery is as expected; otherwise change nothing
    (they are then compiled with ``cache=False``). True when installed.
    A ladder block compiles its ~25 loops in ~20 s: cached, a kernel
    compiled for a new signature reuses it, in this process or a later one."""
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    classes = getattr(impl, "_locator_classes", None)
    if (not isinstance(classes, list) or len(_STOCK_LOCATORS) != 3
            or getattr(numba.config, "CACHE_LOCATOR_CLASSES", None)):   # the user's own list
        return False
    if _GeneratedLocator not in classes:
        classes.insert(0, _GeneratedLocator)
    return True


def jit_generated(fn: Callable, **options: Any) -> Any:
    """``njit(**options)(fn)`` for a function numbagrad generates with an
    origin, cached on disk where Numba can (``locate_generated``)."""
    if generated_cached:
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError:     # no cache location after all: compiled per process
            pass
    return numba.njit(**options)(fn)


ensure_numba_cache()
numba_cache_guarded = guard_numba_cache()
numba_cache_stamped = stamp_numba_cache()
generated_cached = locate_generated()
