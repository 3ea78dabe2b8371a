"""The disk cache of generated modules: the folder, its checks, writing and loading.

Generated modules are read and written only in a folder owned by this user
with mode 0700; a module found there runs only if it holds exactly the
source its name is the hash of. A cache entry that is not a regular file (a
FIFO, a socket, a device, a folder, a symlink) is never opened for reading:
it is replaced by the module, or, when that is impossible, the step runs
without a file (uncached), with one warning either way. The loaded modules
(``_modules``) and the refused folders (``_refused``) are this module's
state: patch them here.
"""
from __future__ import annotations

import builtins
import contextlib
import hashlib
import os
import sys
import warnings
from stat import S_IMODE, S_ISBLK, S_ISCHR, S_ISDIR, S_ISFIFO, S_ISLNK, S_ISREG, S_ISSOCK
from types import ModuleType

from .. import _atomic, _cache


def cache_dir(path: str | None = None) -> str:
    """Where generated modules (and Numba's cache of them) are written:
    ``path``, else ``$NUMBAGRAD_CACHE_DIR``, else ``~/.cache/numbagrad``
    (``$XDG_CACHE_HOME`` respected), each with a ``compiled`` subfolder. It is
    used only while it is this user's private folder (see ``_folder_problem``)."""
    base = path or os.environ.get("NUMBAGRAD_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "numbagrad")
    return os.path.join(base, "compiled")


_modules: dict[str, ModuleType] = {}
_refused: dict[str, str] = {}      # a refused cache folder -> the private one used instead


def _folder_problem(folder: str) -> str | None:
    """Why ``folder`` (created with mode 0700 if missing) may not hold code that
    is executed: None when it is a real folder owned by this user that no one
    else can write (its mode is then made 0700)."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(folder)), exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        st = os.lstat(folder)
    except OSError as exc:
        return f"it cannot be created: {exc.strerror or exc}"
    if S_ISLNK(st.st_mode):
        return "it is a symlink"
    if not S_ISDIR(st.st_mode):
        return "it is not a folder"
    if hasattr(os, "geteuid"):
        if st.st_uid != os.geteuid():
            return f"it is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
        if st.st_mode & 0o022:
            return f"it is group- or world-writable (mode {S_IMODE(st.st_mode):o})"
        if S_IMODE(st.st_mode) != 0o700:
            try:
                os.chmod(folder, 0o700)
            except OSError as exc:
                return f"its mode cannot be set to 700: {exc.strerror or exc}"
    return None


def _refuse(folder: str, problem: str) -> str:
    """The private temporary folder used instead of ``folder`` (warned once per folder)."""
    fallback = _refused.get(folder)
    if fallback is None:
        fallback = os.path.join(_cache.private_tempdir(), "compiled")
        os.makedirs(fallback, 0o700, exist_ok=True)
        _refused[folder] = fallback
        warnings.warn(f"ng.compile: not using the cache folder {folder} ({problem}); generated "
                      f"steps go to the private folder {fallback} for this process only. Set "
                      f"NUMBAGRAD_CACHE_DIR (or cache_dir=) to a folder of your own to keep "
                      f"them across runs", RuntimeWarning, stacklevel=6)
    return fallback


def _write(path: str, data: bytes) -> None:
    """Write ``path`` whole or not at all (a private pid-named temporary, then
    a rename); the temporaries of killed writers to ``path`` go first."""
    folder, base = os.path.split(path)
    _atomic.remove_stale_temporaries(folder, base)
    fd, tmp = _atomic.create_temporary(folder, base)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _kind(mode: int) -> str:
    """What a file of ``mode`` is, for a warning."""
    for test, kind in ((S_ISFIFO, "a FIFO"), (S_ISSOCK, "a socket"), (S_ISLNK, "a symlink"),
                       (S_ISDIR, "a folder"), (S_ISCHR, "a character device"),
                       (S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return f"of file type {mode >> 12:o}"


_READ_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | _atomic.O_BINARY)


def _read_existing(path: str) -> tuple[bytes | None, str]:
    """What the cache entry ``path`` holds (None: there is none) and, when it is
    not a regular file, what it is instead ("": a regular file). Anything but a
    regular file is never opened (a FIFO would block the read forever); the
    open neither follows a symlink nor waits, and its fstat catches a swap
    between the lstat and the open."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, ""
    if not S_ISREG(st.st_mode):
        return b"", _kind(st.st_mode)
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        return None, ""
    except OSError:          # unreadable, or swapped for a symlink: not a module written here
        return b"", ""
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if not S_ISREG(mode):
            return b"", _kind(mode)
        return f.read(), ""


def _check_or_write(path: str, source: str) -> bool:
    """Make ``path`` hold exactly ``source``: write it if missing, and rewrite
    it (with a warning) if it holds anything else or is not a regular file.
    False (with a warning) when a non-regular entry cannot be replaced."""
    data = source.encode()
    found, kind = _read_existing(path)
    if found == data:
        return True
    if not kind:
        if found is not None:
            warnings.warn(f"ng.compile: the cached module {path} does not match the source "
                          f"hash in its name (truncated or modified); writing it again",
                          RuntimeWarning, stacklevel=7)
        _write(path, data)
        return True
    try:
        _write(path, data)
    except OSError as exc:
        warnings.warn(f"ng.compile: the cache entry {path} is not a regular file ({kind}) and "
                      f"cannot be replaced ({exc.strerror or exc}); this step is not cached on "
                      f"disk", RuntimeWarning, stacklevel=7)
        return False
    warnings.warn(f"ng.compile: the cache entry {path} was not a regular file ({kind}); it was "
                  f"not opened, and the module was written in its place", RuntimeWarning,
                  stacklevel=7)
    return True


def _load_module(source: str, folder: str) -> tuple[ModuleType, str]:
    """Import ``source`` from a file named by its hash in ``folder``, or in a
    private temporary folder when ``folder`` is not private or not writable.
    The file is written once, and one found there is used only if it holds
    exactly ``source``. What runs is ``source`` itself, so nothing planted or
    changed after the check runs; the file is what Numba's ``cache=True`` keys on."""
    name = f"ngstep_{hashlib.sha256(source.encode()).hexdigest()[:20]}"
    fallback, problem = _refused.get(folder), ""
    if fallback is None:
        problem = _folder_problem(folder)
        if problem is None:
            try:
                return _load_from(folder, name, source)
            except OSError as exc:
                problem = f"it is not writable: {exc.strerror or exc}"
    try:
        return _load_from(fallback or _refuse(folder, problem), name, source)
    except OSError as exc:
        warnings.warn(f"ng.compile: no writable private cache folder ({exc}); the generated "
                      f"step {name} is not cached on disk", RuntimeWarning, stacklevel=5)
    return _exec(name, source), ""


def _load_from(folder: str, name: str, source: str) -> tuple[ModuleType, str]:
    path = os.path.join(folder, name + ".py")
    module = _modules.get(path)
    if module is None:
        # a name that cannot hold the module: run it from memory, remembered so it warns once
        module = _exec(name, source, path) if _check_or_write(path, source) else _exec(name, source)
        _modules[path] = module
    return module, module.__dict__.get("__file__", "")


def _exec(name: str, source: str, path: str = "") -> ModuleType:
    """The module of ``source``, run from memory; backed by the file ``path``
    (which holds ``source``) when given, without a file Numba cannot cache it."""
    module = ModuleType(name)
    if path:
        module.__file__ = path
        sys.modules[name] = module
    else:
        source = source.replace("@njit(cache=True)", "@njit")
    code = builtins.compile(source, path or f"<{name}>", "exec")   # not this module's compile
    exec(code, module.__dict__)   # noqa: S102
    return module
