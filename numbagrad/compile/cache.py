"""The disk cache of generated modules: the folder, its checks, writing and loading.

Generated modules are read and written only in a folder owned by this user
with mode 0700; a module found there runs only if it holds exactly the
source its name is the hash of. The loaded modules (``_modules``) and the
refused folders (``_refused``) are this module's state: patch them here.
"""
from __future__ import annotations

import builtins
import contextlib
import hashlib
import os
import sys
import warnings
from stat import S_IMODE, S_ISDIR, S_ISLNK
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


def _check_or_write(path: str, source: str) -> None:
    """Make ``path`` hold exactly ``source``: write it if missing, and rewrite
    it (with a warning) if it holds anything else."""
    data = source.encode()
    try:
        with open(path, "rb", opener=_no_follow) as f:
            found: bytes | None = f.read()
    except FileNotFoundError:
        found = None
    except OSError:          # a symlink, a folder: not a module this process wrote
        found = b""
    if found is not None and found != data:
        warnings.warn(f"ng.compile: the cached module {path} does not match the source hash "
                      f"in its name (truncated or modified); writing it again", RuntimeWarning,
                      stacklevel=7)
    if found != data:
        _write(path, data)


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0))


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
        _check_or_write(path, source)
        module = _modules[path] = _exec(name, source, path)
    return module, path


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
