"""Checkpoint files: ``ng.save(path, obj)`` and ``ng.load(path)``.

``obj`` is a nested structure of dicts, lists and tuples whose leaves are
tensors (saved as host arrays), NumPy arrays and scalars, Python numbers,
strings, bytes, bools and None. ``load`` gives back the same structure, with
NumPy arrays in place of tensors, lists as lists and tuples as tuples, dict
keys in their order.

The file is one ``.npz`` archive that NumPy reads with ``allow_pickle=False``:
every array is its own ``.npy`` member and a JSON description of the
structure is one more (a uint8 array). Nothing is ever pickled, and a file
holding object arrays is refused. Saving is atomic: the archive is written
to a temporary file in the target's folder, flushed and fsynced, then
``os.replace``-d over the target, so a failed save leaves the old file as it
was and no temporary file behind.
"""
from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from .tensor import Tensor

__all__ = ["load", "save"]

_META = "__numbagrad__"     # the archive member holding the structure
_FORMAT = "numbagrad-checkpoint"
_VERSION = 1


# ------------------------------------------------------------------ encode
class _Encoder:
    """Turns a structure into a JSON-able tree plus a list of arrays."""

    def __init__(self) -> None:
        self.arrays: list[np.ndarray] = []
        self._active: set[int] = set()   # containers on the current path (cycles)

    def array(self, a: np.ndarray, where: str) -> int:
        if a.dtype.hasobject:
            raise TypeError(f"{where}: arrays of dtype {a.dtype} hold Python objects, "
                            "which a checkpoint never stores (it is not pickled)")
        self.arrays.append(a)
        return len(self.arrays) - 1

    def key(self, k: Any, where: str) -> Any:
        if isinstance(k, (np.integer, np.floating, np.bool_, np.str_)):
            k = k.item()
        if isinstance(k, (str, bool, int, float)) or k is None or isinstance(k, tuple):
            if isinstance(k, tuple):
                return {"tuple": [self.key(x, where) for x in k]}
            return self.scalar(k, where)
        raise TypeError(f"{where}: dict key {k!r} of type {type(k).__name__} is not "
                        "supported (use str, int, float, bool, None or tuples of them)")

    def scalar(self, x: Any, where: str) -> Any:
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int):
            return {"int": str(x)}
        if isinstance(x, float):
            return {"float": x.hex()}
        raise AssertionError(x)  # pragma: no cover

    def encode(self, obj: Any, where: str) -> Any:
        # NumPy scalars first: np.float64 is a float and np.bool_ is not a bool.
        if isinstance(obj, np.generic):
            return {"scalar": self.array(np.asarray(obj), where)}
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return self.scalar(obj, where)
        if isinstance(obj, complex):
            return {"complex": [obj.real.hex(), obj.imag.hex()]}
        if isinstance(obj, (bytes, bytearray)):
            return {"bytes": self.array(np.frombuffer(bytes(obj), np.uint8), where)}
        if isinstance(obj, Tensor):
            return {"array": self.array(obj.numpy(), where)}
        if isinstance(obj, np.ndarray):
            return {"array": self.array(obj, where)}
        if hasattr(obj, "copy_to_host") and hasattr(obj, "shape"):   # a Numba device array
            return {"array": self.array(np.asarray(obj.copy_to_host()), where)}
        if isinstance(obj, (Mapping, list, tuple)):
            if id(obj) in self._active:
                raise ValueError(f"{where}: the structure contains itself (a cycle)")
            self._active.add(id(obj))
            try:
                if isinstance(obj, Mapping):
                    items = []
                    for k, v in obj.items():
                        items.append([self.key(k, where), self.encode(v, f"{where}[{k!r}]")])
                    return {"dict": items}
                kind = "list" if isinstance(obj, list) else "tuple"
                return {kind: [self.encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]}
            finally:
                self._active.discard(id(obj))
        raise TypeError(f"{where}: cannot save a value of type {type(obj).__name__}; a "
                        "checkpoint holds dicts, lists and tuples of tensors, NumPy arrays, "
                        "numbers, strings, bytes, bools and None")


# ------------------------------------------------------------------ decode
class _Corrupt(Exception):
    """The archive is readable but does not describe a valid checkpoint."""


def _decode(node: Any, arrays: Mapping[str, np.ndarray], used: set[str]) -> Any:
    if node is None or isinstance(node, (bool, str)):
        return node
    if not isinstance(node, dict) or len(node) != 1:
        raise _Corrupt(f"unexpected entry {node!r:.80}")
    (tag, value), = node.items()
    if tag == "int":
        return int(value)
    if tag == "float":
        return float.fromhex(value)
    if tag == "complex":
        return complex(float.fromhex(value[0]), float.fromhex(value[1]))
    if tag in ("array", "scalar", "bytes"):
        name = f"a{int(value)}"
        if name not in arrays:
            raise _Corrupt(f"array member {name!r} is missing")
        used.add(name)
        a = arrays[name]
        if tag == "scalar":
            if a.ndim != 0:
                raise _Corrupt(f"member {name!r} should hold a scalar")
            return a[()]
        if tag == "bytes":
            if a.dtype != np.uint8 or a.ndim != 1:
                raise _Corrupt(f"member {name!r} should hold bytes")
            return a.tobytes()
        return a
    if tag in ("list", "tuple"):
        items = [_decode(v, arrays, used) for v in value]
        return items if tag == "list" else tuple(items)
    if tag == "dict":
        return {_decode_key(k): _decode(v, arrays, used) for k, v in value}
    raise _Corrupt(f"unknown entry kind {tag!r}")


def _decode_key(node: Any) -> Any:
    if isinstance(node, dict) and set(node) == {"tuple"}:
        return tuple(_decode_key(k) for k in node["tuple"])
    if isinstance(node, dict) and len(node) == 1 and next(iter(node)) in ("int", "float"):
        return _decode(node, {}, set())
    if node is None or isinstance(node, (bool, str)):
        return node
    raise _Corrupt(f"unexpected dict key {node!r:.80}")


# -------------------------------------------------------------------- files
def _file_mode(path: str) -> int:
    """The permission bits the checkpoint gets: the old file's, else 0o666 less umask."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        pass
    umask = None
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    umask = int(line.split()[1], 8)
                    break
    except (OSError, ValueError):
        pass
    if umask is None:
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


def _fsync_dir(folder: str) -> None:
    """Make the rename durable too (best effort: not every platform allows it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` to ``path`` as one ``.npz`` checkpoint, atomically.

    ``obj`` is a nested dict/list/tuple of tensors (saved as host arrays),
    NumPy arrays and scalars, numbers, strings, bytes, bools and None. The
    path is used exactly as given (no suffix is added). Raises ``TypeError``
    for a value it cannot store, before anything is written; on any failure
    the previous file at ``path`` is left untouched and no temporary remains.
    """
    path = os.fspath(path)
    if not isinstance(path, str):
        path = os.fsdecode(path)
    enc = _Encoder()
    tree = enc.encode(obj, "obj")
    meta = json.dumps({"format": _FORMAT, "version": _VERSION, "tree": tree},
                      ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    members = {_META: np.frombuffer(meta.encode("ascii"), np.uint8)}
    members.update((f"a{i}", a) for i, a in enumerate(enc.arrays))

    folder = os.path.dirname(os.path.abspath(path))
    mode = _file_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            if _SAVEZ_TAKES_ALLOW_PICKLE:
                np.savez(f, allow_pickle=False, **members)
            else:
                _savez_no_pickle(f, members)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(folder)


def _savez_no_pickle(f: Any, members: Mapping[str, np.ndarray]) -> None:
    """``np.savez`` for NumPy versions whose savez has no allow_pickle argument."""
    with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, a in members.items():
            with zf.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(a), allow_pickle=False)


def _savez_takes_allow_pickle() -> bool:
    import inspect
    try:
        return "allow_pickle" in inspect.signature(np.savez).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False


_SAVEZ_TAKES_ALLOW_PICKLE = _savez_takes_allow_pickle()


_ZIP_MAGIC = b"PK\x03\x04"


def _not_an_archive(head: bytes) -> str:
    if not head:
        return "the file is empty (truncated?)"
    if head[:1] == b"\x80":
        return "it holds pickled data, which is refused (a checkpoint is never a pickle)"
    if head.startswith(b"\x93NUM"):
        return "it is a single .npy array, not a checkpoint archive"
    return "it is not a .npz archive (truncated or corrupt?)"


def load(path: str | os.PathLike) -> Any:
    """Read a checkpoint written by ``save``; tensors come back as NumPy arrays.

    Never unpickles anything. A missing file raises ``FileNotFoundError``; a
    truncated, corrupt or foreign file (a pickle, an object array, a plain
    ``.npz``) raises ``ValueError`` naming the path.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            head = f.read(len(_ZIP_MAGIC))
            if head != _ZIP_MAGIC:
                raise _Corrupt(_not_an_archive(head))
            f.seek(0)
            with np.load(f, allow_pickle=False) as archive:
                if _META not in archive.files:
                    raise _Corrupt("it has no numbagrad structure member "
                                   "(not written by ng.save)")
                arrays = {name: archive[name] for name in archive.files}
    except FileNotFoundError:
        raise
    except _Corrupt as exc:
        raise ValueError(f"cannot load checkpoint {path!r}: {exc}") from None
    except ValueError as exc:
        if "pickle" in str(exc).lower():
            raise ValueError(f"cannot load checkpoint {path!r}: it holds pickled data or "
                             f"object arrays, which are refused ({exc})") from None
        raise ValueError(f"cannot load checkpoint {path!r}: corrupt or truncated "
                         f"({exc})") from exc
    except IsADirectoryError:
        raise
    except PermissionError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError, KeyError, UnicodeDecodeError,
            NotImplementedError, OverflowError, MemoryError) as exc:
        raise ValueError(f"cannot load checkpoint {path!r}: corrupt or truncated "
                         f"({type(exc).__name__}: {exc})") from exc
    try:
        raw = arrays.pop(_META)
        if raw.dtype != np.uint8 or raw.ndim != 1:
            raise _Corrupt("its structure member is not a byte string")
        meta = json.loads(raw.tobytes().decode("ascii"))
        if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
            raise _Corrupt("its structure member is not a numbagrad checkpoint")
        if meta.get("version") != _VERSION:
            raise _Corrupt(f"format version {meta.get('version')!r} is not supported "
                           f"(this numbagrad reads version {_VERSION})")
        used: set[str] = set()
        obj = _decode(meta["tree"], arrays, used)
    except _Corrupt as exc:
        raise ValueError(f"cannot load checkpoint {path!r}: {exc}") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError,
            UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"cannot load checkpoint {path!r}: its structure is corrupt "
                         f"({type(exc).__name__}: {exc})") from None
    if used != set(arrays):
        extra = sorted(set(arrays) - used)
        raise ValueError(f"cannot load checkpoint {path!r}: members {extra} are not part of "
                         "its structure")
    return obj

