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
was and no temporary file behind; the temporary of a killed save names its
dead writer's pid, and the next save to that target removes it.

Loading treats the file as untrusted: only a regular file is opened, each
member's declared sizes and their total are checked before anything is
decompressed or allocated, no member may yield more than it declares, and
whatever is wrong with the file becomes one ``ValueError`` naming the path.
"""
from __future__ import annotations

import errno
import json
import math
import os
import stat
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _dtypes
from ._atomic import O_BINARY as _O_BINARY
from ._atomic import create_temporary, remove_stale_temporaries
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

    def tagged(self, tag: str, a: np.ndarray, where: str) -> dict:
        """``{tag: member}``; a bfloat16 array (whose .npy dtype reads back as
        raw bytes, |V2) is stored as its uint16 bits under "bfloat16_" + tag."""
        if _dtypes.BFLOAT16 is not None and a.dtype == _dtypes.BFLOAT16:
            return {"bfloat16_" + tag: self.array(np.asarray(a, order="C").view(np.uint16), where)}
        return {tag: self.array(a, where)}

    def encode(self, obj: Any, where: str) -> Any:
        # NumPy scalars first: np.float64 is a float and np.bool_ is not a bool.
        if isinstance(obj, np.generic):
            return self.tagged("scalar", np.asarray(obj), where)
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return self.scalar(obj, where)
        if isinstance(obj, complex):
            return {"complex": [obj.real.hex(), obj.imag.hex()]}
        if isinstance(obj, (bytes, bytearray)):
            return {"bytes": self.array(np.frombuffer(bytes(obj), np.uint8), where)}
        if isinstance(obj, Tensor):
            return self.tagged("array", obj.numpy(), where)
        if isinstance(obj, np.ndarray):
            return self.tagged("array", obj, where)
        if hasattr(obj, "copy_to_host") and hasattr(obj, "shape"):   # a Numba device array
            return self.tagged("array", np.asarray(obj.copy_to_host()), where)
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


def _expect(value: Any, kind: type, tag: str) -> Any:
    if type(value) is not kind:
        raise _Corrupt(f"a {tag!r} entry holds {value!r:.80}, not a {kind.__name__}")
    return value


def _decode(node: Any, arrays: Mapping[str, np.ndarray], used: set[str]) -> Any:
    if node is None or isinstance(node, (bool, str)):
        return node
    if not isinstance(node, dict) or len(node) != 1:
        raise _Corrupt(f"unexpected entry {node!r:.80}")
    (tag, value), = node.items()
    if tag == "int":
        return int(_expect(value, str, tag))
    if tag == "float":
        return float.fromhex(_expect(value, str, tag))
    if tag == "complex":
        if len(_expect(value, list, tag)) != 2:
            raise _Corrupt(f"a 'complex' entry holds {value!r:.80}, not two parts")
        return complex(*(float.fromhex(_expect(x, str, tag)) for x in value))
    if tag in ("array", "scalar", "bytes", "bfloat16_array", "bfloat16_scalar"):
        name = f"a{_expect(value, int, tag)}"
        if name not in arrays or name in used:
            raise _Corrupt(f"array member {name!r} is missing or used twice")
        used.add(name)
        a = arrays[name]
        if tag.startswith("bfloat16_"):
            if a.dtype != np.uint16:
                raise _Corrupt(f"member {name!r} should hold bfloat16 bits (uint16)")
            if _dtypes.BFLOAT16 is None:
                raise _Corrupt(f"member {name!r} holds bfloat16 values, which need the "
                               f"ml_dtypes package (pip install ml_dtypes)")
            a = a.view(_dtypes.BFLOAT16)
            tag = tag.removeprefix("bfloat16_")
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
        items = [_decode(v, arrays, used) for v in _expect(value, list, tag)]
        return items if tag == "list" else tuple(items)
    if tag == "dict":
        out = {}
        for pair in _expect(value, list, tag):
            if type(pair) is not list or len(pair) != 2:
                raise _Corrupt(f"a dict item {pair!r:.80} is not a [key, value] pair")
            key = _decode_key(pair[0])
            if key in out:
                raise _Corrupt(f"dict key {key!r:.80} appears twice")
            out[key] = _decode(pair[1], arrays, used)
        return out
    raise _Corrupt(f"unknown entry kind {tag!r:.80}")


def _decode_key(node: Any) -> Any:
    if isinstance(node, dict) and set(node) == {"tuple"}:
        return tuple(_decode_key(k) for k in _expect(node["tuple"], list, "tuple"))
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


def _naming(exc: OSError, path: str) -> OSError:
    """``exc`` again, as an error of the same errno whose message names the checkpoint."""
    if exc.errno is None:
        return OSError(f"cannot save checkpoint {path!r}: {exc}")
    return OSError(exc.errno, f"cannot save checkpoint ({exc.strerror or exc})", path)


def save(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` to ``path`` as one ``.npz`` checkpoint, atomically.

    ``obj`` is a nested dict/list/tuple of tensors (saved as host arrays),
    NumPy arrays and scalars, numbers, strings, bytes, bools and None. The
    path is used exactly as given (no suffix is added). Raises ``TypeError``
    for a value it cannot store, before anything is written; on any failure
    the previous file at ``path`` is left untouched and no temporary remains,
    and an ``OSError`` (a full disk, a missing folder) names ``path``. The
    temporary, ``.<name>.<pid>.<nonce>.tmp`` beside the target, carries the
    writer's process id, so a save also deletes those of earlier saves to the
    same target whose writer is no longer running (killed mid-write).
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
    base = os.path.basename(path)
    mode = _file_mode(path)
    remove_stale_temporaries(folder, base)
    tmp = None
    try:
        fd, tmp = create_temporary(folder, base)
        with os.fdopen(fd, "wb") as f:
            if _SAVEZ_TAKES_ALLOW_PICKLE:
                np.savez(f, allow_pickle=False, **members)
            else:
                _savez_no_pickle(f, members)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if isinstance(exc, OSError):
            raise _naming(exc, path) from exc
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
_MAX_RATIO = 1000            # the most a member may be compressed (a zip bomb: far more)
# The most the arrays may declare in all per byte of the file. ng.save stores them
# uncompressed (at most 1:1); a foreign writer's compression of real weights gives
# ~1-10:1, while data that compresses 100:1 overall is all but constant.
_MAX_TOTAL_RATIO = 100
_MAX_HEADER = 1 << 20        # bytes a member's .npy header may take
_CHUNK = 1 << 20             # bytes read from a member at a time
_DEFAULT_MAX_BYTES = 16 << 30


def _not_an_archive(head: bytes) -> str:
    if not head:
        return "the file is empty (truncated?)"
    if head[:1] == b"\x80":
        return "it holds pickled data, which is refused (a checkpoint is never a pickle)"
    if head.startswith(b"\x93NUM"):
        return "it is a single .npy array, not a checkpoint archive"
    return "it is not a .npz archive (truncated or corrupt?)"


def _kind(mode: int) -> str:
    for test, name in [(stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")]:
        if test(mode):
            return name
    return "not a regular file"


def _open_regular(path: str) -> Any:
    """Open ``path`` for reading, refusing anything but a regular file before opening it."""
    st = os.stat(path)   # FileNotFoundError, PermissionError: OSErrors naming the path
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "cannot load checkpoint: it is a directory", path)
    if not stat.S_ISREG(st.st_mode):
        raise _Corrupt(f"it is {_kind(st.st_mode)}, not a regular file")
    # O_NONBLOCK: should a FIFO replace the file after the check, opening it cannot hang.
    fd = os.open(path, os.O_RDONLY | _O_BINARY | getattr(os, "O_NONBLOCK", 0))
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise _Corrupt("it was replaced by something that is not a regular file")
    return f


class _Member:
    """A file object over one zip member that refuses to yield more than it declares.

    It remembers the .npy header it yields first, so that NumPy's reader can
    read it again once the declared size has been checked against it.
    """

    def __init__(self, raw: Any, info: zipfile.ZipInfo) -> None:
        self.raw, self.info, self.count = raw, info, 0
        self.head: bytes | None = b""   # bytes yielded so far while recording, else None
        self.replay = b""

    def read(self, n: int = -1) -> bytes:
        if self.replay:
            n = len(self.replay) if n < 0 else n
            out, self.replay = self.replay[:n], self.replay[n:]
            return out
        if n < 0 or n > _CHUNK:
            n = _CHUNK
        data = self.raw.read(n)
        self.count += len(data)
        if self.count > self.info.file_size:
            raise _Corrupt(f"member {self.info.filename!r} holds more than the "
                           f"{self.info.file_size} bytes it declares")
        if self.head is not None:
            self.head += data
            if len(self.head) > _MAX_HEADER:
                raise _Corrupt(f"member {self.info.filename!r} has an oversized .npy header")
        return data

    def rewind_header(self) -> None:
        self.replay, self.head = self.head or b"", None


def _check_member(info: zipfile.ZipInfo, max_bytes: int) -> None:
    """Refuse a member from its declared sizes, before anything is decompressed."""
    name = info.filename
    if info.flag_bits & 0x1:
        raise _Corrupt(f"member {name!r} is encrypted")
    if not name.endswith(".npy"):
        raise _Corrupt(f"member {name!r} is not a .npy array")
    if info.file_size > max_bytes:
        raise _Corrupt(f"member {name!r} declares {info.file_size} bytes, more than "
                       f"max_bytes={max_bytes}")
    if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
        raise _Corrupt(f"member {name!r} is stored uncompressed but declares "
                       f"{info.file_size} bytes in {info.compress_size}")
    if info.file_size > _MAX_RATIO * info.compress_size:
        raise _Corrupt(f"member {name!r} declares {info.file_size} bytes compressed into "
                       f"{info.compress_size}, more than {_MAX_RATIO}:1 (a zip bomb?)")


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    """One member's array, whose .npy header must account for exactly its declared size."""
    name = info.filename
    with zf.open(info) as raw:
        member = _Member(raw, info)
        version = np.lib.format.read_magic(member)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(member)
        else:   # 3.0 differs from 2.0 in the header's encoding only, not in the sizes
            shape, _, dtype = np.lib.format.read_array_header_2_0(member)
        if any(side < 0 for side in shape):
            raise _Corrupt(f"member {name!r} declares the negative shape {shape}")
        if dtype.hasobject:
            raise ValueError(f"member {name!r} holds an object array, which needs pickle "
                             "(refused: a checkpoint is never unpickled)")
        size = member.count + math.prod(shape) * dtype.itemsize
        if size != info.file_size:
            raise _Corrupt(f"member {name!r} declares {info.file_size} bytes but its header "
                           f"(shape {shape}, dtype {dtype}) needs {size}")
        member.rewind_header()
        array = np.lib.format.read_array(member, allow_pickle=False)
        if member.count != info.file_size or member.raw.read(1):   # the CRC is checked at EOF
            raise _Corrupt(f"member {name!r} does not hold the {info.file_size} bytes it "
                           "declares")
    return array


def _read_archive(f: Any, max_bytes: int) -> dict[str, np.ndarray]:
    head = f.read(len(_ZIP_MAGIC))
    if head != _ZIP_MAGIC:
        raise _Corrupt(_not_an_archive(head))
    f.seek(0)
    with zipfile.ZipFile(f) as zf:
        infos = zf.infolist()
        names = [info.filename for info in infos]
        if len(set(names)) != len(names):
            raise _Corrupt("it holds two members of the same name")
        if _META + ".npy" not in names:
            raise _Corrupt("it has no numbagrad structure member (not written by ng.save)")
        for info in infos:
            _check_member(info, max_bytes)
        _check_total(infos, os.fstat(f.fileno()).st_size, max_bytes)
        return {info.filename[:-4]: _read_member(zf, info) for info in infos}


def _check_total(infos: list[zipfile.ZipInfo], size: int, max_bytes: int) -> None:
    """Refuse the archive from its members' declared sizes in all, before anything is
    allocated: each member is within bounds, but many of them may not be."""
    packed = sum(info.compress_size for info in infos)
    if packed > size:
        raise _Corrupt(f"its members claim {packed} bytes of data, more than the file's "
                       f"{size} (overlapping or lying members?)")
    total = sum(info.file_size for info in infos)
    if total > max_bytes:
        raise _Corrupt(f"its members declare {total} bytes in all, more than "
                       f"max_bytes={max_bytes}")
    if total > _MAX_TOTAL_RATIO * size:
        raise _Corrupt(f"its members declare {total} bytes in all from a file of {size}, "
                       f"more than {_MAX_TOTAL_RATIO}:1 (a zip bomb?)")


def _refuse_constant(name: str) -> Any:
    raise _Corrupt(f"its structure holds {name}, which ng.save never writes")


def load(path: str | os.PathLike, *, max_bytes: int = _DEFAULT_MAX_BYTES) -> Any:
    """Read a checkpoint written by ``save``; tensors come back as NumPy arrays.

    Never unpickles anything. A missing file raises ``FileNotFoundError`` and a
    directory ``IsADirectoryError``; anything else that is not a valid
    checkpoint (a FIFO or device, a truncated, corrupt or foreign file, a
    pickle, an object array, a plain ``.npz``) raises ``ValueError`` naming
    the path, with the underlying error as its cause. Sizes are checked from
    the archive's directory before anything is decompressed or allocated: the
    arrays may declare at most ``max_bytes`` in all (16 GiB by default) and at
    most 100 bytes per byte of the file, a member compressed more than 1000:1
    is refused, and no member may yield more than it declares. Like
    ``torch.load(weights_only=True)``, it only ever builds plain data.
    """
    path = os.fspath(path)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
        raise TypeError(f"load: max_bytes must be an int, got {type(max_bytes).__name__}")
    if max_bytes < 0:
        raise ValueError(f"load: max_bytes must be non-negative, got {max_bytes}")
    try:
        f = _open_regular(path)
    except _Corrupt as exc:
        raise ValueError(f"cannot load checkpoint {path!r}: {exc}") from None
    try:
        with f:
            arrays = _read_archive(f, max_bytes)
        raw = arrays.pop(_META)
        if raw.dtype != np.uint8 or raw.ndim != 1:
            raise _Corrupt("its structure member is not a byte string")
        meta = json.loads(raw.tobytes().decode("ascii"), parse_constant=_refuse_constant)
        if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
            raise _Corrupt("its structure member is not a numbagrad checkpoint")
        if meta.get("version") != _VERSION:
            raise _Corrupt(f"format version {meta.get('version')!r} is not supported "
                           f"(this numbagrad reads version {_VERSION})")
        used: set[str] = set()
        obj = _decode(meta["tree"], arrays, used)
        if used != set(arrays):
            raise _Corrupt(f"members {sorted(set(arrays) - used)} are not part of its "
                           "structure")
    except _Corrupt as exc:
        raise ValueError(f"cannot load checkpoint {path!r}: {exc}") from exc.__cause__
    except Exception as exc:
        # Untrusted bytes reach zipfile, zlib, bz2, lzma, json and NumPy's header
        # parser, which raise many kinds of error; each is a malformed file here.
        if "pickle" in str(exc).lower():
            raise ValueError(f"cannot load checkpoint {path!r}: it holds pickled data or "
                             f"object arrays, which are refused ({exc})") from exc
        raise ValueError(f"cannot load checkpoint {path!r}: corrupt or truncated "
                         f"({type(exc).__name__}: {exc})") from exc
    return obj
