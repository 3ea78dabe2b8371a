"""Checkpoint files: ng.save / ng.load round trips, atomic writes, refusals."""
import errno
import io
import os
import pickle
import re
import subprocess
import sys
import threading
import tracemalloc
import zipfile

import numpy as np
import pytest
from conftest import Dev
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import numbagrad as ng
from numbagrad import serialization
from numbagrad.serialization import load, save


def same(a, b):
    """Deep equality that also checks container and leaf types, dtypes and bits."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    elif isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and np.shape(a) == np.shape(b)
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    elif isinstance(a, float):
        assert a.hex() == b.hex()
    else:
        assert a == b


def everything():
    return {
        "f64": np.arange(6.0).reshape(2, 3),
        "f32": np.linspace(-1, 1, 5, dtype=np.float32),
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        "ints": np.arange(4, dtype=np.int64), "bools": np.array([True, False]),
        "empty": np.zeros((0, 3)), "zero_d": np.array(2.5), "strs": np.array(["ab", "c"]),
        "np_scalars": [np.float32(1.5), np.int64(-3), np.bool_(True), np.float64(0.1)],
        "numbers": [0, -1, 2**80, 0.1, -0.0, float("inf"), float("-inf"), 1e-310, 2 + 3j],
        "text": ["", "héllo ✓", "\ud800"], "bytes": b"\x00\xff",
        "flags": [True, False, None],
        "shapes": [(2, 3), (4,), ()], "tuple_of_lists": ([], [[]], ({},)),
        "nested": {"a": {"b": {"c": [1, (2, {"d": None})]}}},
        1: "int key", 2.5: "float key", None: "none key", False: "bool key",
        ("k", 1): "tuple key", np.int64(7): "numpy int key",
    }


def test_round_trip_keeps_structure_types_and_bits(tmp_path):
    obj = everything()
    path = tmp_path / "c.npz"
    save(path, obj)
    back = load(path)
    expected = dict(obj)
    expected[7] = expected.pop(np.int64(7))   # numpy keys come back as Python keys
    same(back, expected)
    assert load(str(path))["numbers"][5] == float("inf")
    nan = load(_saved(tmp_path, [float("nan"), np.float32("nan")]))
    assert np.isnan(nan[0]) and np.isnan(nan[1]) and nan[1].dtype == np.float32


def _saved(tmp_path, obj, name="x.ckpt"):
    path = tmp_path / name
    save(path, obj)
    return path


_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8),
    st.binary(max_size=8),
    hnp.arrays(st.sampled_from([np.float32, np.float64, np.int64, np.bool_, np.uint8]),
               hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)))
_keys = st.one_of(st.text(max_size=5), st.integers(-5, 5), st.tuples(st.text(max_size=3)))
_trees = st.recursive(_leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.tuples(inner, inner),
    st.dictionaries(_keys, inner, max_size=3)), max_leaves=12)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(obj=_trees)
def test_any_structure_round_trips(tmp_path, obj):
    same(load(_saved(tmp_path, obj)), obj)


@pytest.mark.parametrize("obj", [None, 3, "s", [], (), {}, np.ones(2), (1,), [[(None,)]]])
def test_any_top_level_value(tmp_path, obj):
    same(load(_saved(tmp_path, obj)), obj)


def test_path_is_used_as_given_and_loaded_arrays_are_writeable(tmp_path):
    path = _saved(tmp_path, {"w": np.ones(3)}, name="model.ckpt")
    assert sorted(os.listdir(tmp_path)) == ["model.ckpt"]
    w = load(path)["w"]
    w += 1   # an ordinary, owned array
    assert zipfile.is_zipfile(path)
    with np.load(path, allow_pickle=False) as z:   # a plain .npz that NumPy reads
        assert "__numbagrad__" in z.files


def test_tensors_are_saved_as_host_arrays(tmp_path, dev):
    W = dev.param(np.arange(6.0).reshape(2, 3))
    x = dev.tensor(np.ones(4, np.float32))
    back = load(_saved(tmp_path, {"W": W, "x": [x]}))
    assert type(back["W"]) is np.ndarray and type(back["x"][0]) is np.ndarray
    same(back["W"], np.arange(6.0).reshape(2, 3))
    same(back["x"][0], np.ones(4, np.float32))


# ------------------------------------------------------------ failed saves
@pytest.mark.parametrize("bad", [
    {"ok": np.ones(2), "bad": object()},
    [1, 2, {3}],
    {"obj": np.array([1, "a", None], dtype=object)},
    {"fn": len},
    {frozenset(): 1},
])
def test_unsupported_value_raises_and_leaves_old_file(tmp_path, bad):
    path = _saved(tmp_path, {"old": np.arange(3.0)})
    before = path.read_bytes()
    with pytest.raises(TypeError, match="obj"):
        save(path, bad)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == [path.name]
    with pytest.raises(TypeError):
        save(tmp_path / "new.npz", bad)
    assert os.listdir(tmp_path) == [path.name]


def test_a_cycle_raises(tmp_path):
    loop = [1]
    loop.append(loop)
    with pytest.raises(ValueError, match="cycle"):
        save(tmp_path / "c", loop)
    assert os.listdir(tmp_path) == []
    shared = np.ones(2)
    back = load(_saved(tmp_path, [shared, shared, (shared,)]))   # sharing is not a cycle
    same(back, [shared, shared, (shared,)])


@pytest.mark.parametrize("where", ["write", "fsync", "replace"])
def test_failure_while_writing_leaves_old_file_and_no_temporary(tmp_path, monkeypatch, where):
    path = _saved(tmp_path, {"old": np.arange(3.0)})
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError(f"disk trouble in {where}")

    if where == "write":
        monkeypatch.setattr(np.lib.format, "write_array", boom)
    else:
        monkeypatch.setattr(serialization.os, where, boom)
    with pytest.raises(OSError, match="disk trouble"):
        save(path, {"new": np.ones(1000)})
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == [path.name]


def test_write_goes_through_a_synced_temporary_in_the_same_folder(tmp_path, monkeypatch):
    calls = []
    real_replace, real_fsync = os.replace, os.fsync
    monkeypatch.setattr(serialization.os, "fsync",
                        lambda fd: (calls.append(("fsync", fd)), real_fsync(fd))[1])
    monkeypatch.setattr(serialization.os, "replace",
                        lambda src, dst: (calls.append(("replace", src, dst)),
                                          real_replace(src, dst))[1])
    path = tmp_path / "c.npz"
    save(path, {"w": np.ones(2)})
    replaces = [c for c in calls if c[0] == "replace"]
    assert len(replaces) == 1
    _, src, dst = replaces[0]
    assert os.path.dirname(src) == str(tmp_path) and dst == str(path)
    assert calls[0][0] == "fsync"   # the data is synced before the rename
    assert os.listdir(tmp_path) == ["c.npz"]


def test_overwrite_keeps_permissions(tmp_path):
    path = _saved(tmp_path, [1])
    os.chmod(path, 0o640)
    save(path, [2])
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert load(path) == [2]


# --------------------------------------------------------------- bad files
def test_truncated_files_raise_value_error_naming_the_path(tmp_path):
    path = _saved(tmp_path, {"w": np.arange(50.0), "s": "text", "n": [1, 2]})
    data = path.read_bytes()
    bad = tmp_path / "truncated.npz"
    for size in sorted({0, 1, 10, 100, len(data) // 2, len(data) - 22, len(data) - 1}):
        bad.write_bytes(data[:size])
        with pytest.raises(ValueError, match="truncated.npz"):
            load(bad)


def test_corrupt_bytes_raise_value_error(tmp_path):
    path = _saved(tmp_path, {"w": np.arange(50.0)})
    data = bytearray(path.read_bytes())
    member = data.find(b"\x93NUMPY", data.find(b"a0.npy"))   # the array member's payload
    data[member + 200] ^= 0xFF
    bad = tmp_path / "flipped.npz"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="flipped.npz"):
        load(bad)


def test_pickled_and_object_files_are_refused(tmp_path):
    pickled = tmp_path / "pickled.npz"
    with open(pickled, "wb") as f:
        pickle.dump({"w": np.ones(2)}, f)
    with pytest.raises(ValueError, match="pickled.npz.*pickle"):
        load(pickled)

    objects = tmp_path / "objects.npz"
    with open(objects, "wb") as f:
        np.savez(f, __numbagrad__=np.frombuffer(b"{}", np.uint8),
                 a0=np.array([{"x": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="objects.npz.*pickle"):
        load(objects)

    npy = tmp_path / "pickled.npy"
    np.save(npy, np.array([None], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="pickled.npy"):
        load(npy)


def test_foreign_or_tampered_archives_are_refused(tmp_path):
    plain = tmp_path / "plain.npz"
    with open(plain, "wb") as f:
        np.savez(f, w=np.ones(2))
    with pytest.raises(ValueError, match="plain.npz.*not written by ng.save"):
        load(plain)
    single = tmp_path / "single.npy"
    np.save(single, np.ones(2))
    with pytest.raises(ValueError, match="single.npy"):
        load(single)
    for meta in [b"not json", b'{"format": "other"}', b'[1, 2]',
                 b'{"format": "numbagrad-checkpoint", "version": 99, "tree": null}',
                 b'{"format": "numbagrad-checkpoint", "version": 1, "tree": {"array": 0}}',
                 b'{"format": "numbagrad-checkpoint", "version": 1, "tree": {"what": 0}}',
                 b'{"format": "numbagrad-checkpoint", "version": 1, "tree": {"array": Infinity}}',
                 b'{"format": "numbagrad-checkpoint", "version": 1, "tree": {"int": NaN}}',
                 b'{"format": "numbagrad-checkpoint", "version": 1, "tree": {"list": "abc"}}',
                 b'{"format": "numbagrad-checkpoint", "version": 1, "tree": {"dict": {"ab": 1}}}',
                 b'{"format": "numbagrad-checkpoint", "version": 1, "tree": {"int": 5}}',
                 b'{"format": "numbagrad-checkpoint", "version": 1, "tree": {"dict": [["a", 1], '
                 b'["a", 2]]}}']:
        bad = tmp_path / "tampered.npz"
        with open(bad, "wb") as f:
            np.savez(f, __numbagrad__=np.frombuffer(meta, np.uint8))
        with pytest.raises(ValueError, match="tampered.npz"):
            load(bad)


def test_missing_file_is_an_os_error_naming_the_path(tmp_path):
    with pytest.raises(OSError, match="nothing-here"):
        load(tmp_path / "nothing-here.npz")


def test_what_is_not_a_regular_file_is_refused_before_opening(tmp_path, monkeypatch):
    with pytest.raises(IsADirectoryError, match=re.escape(str(tmp_path))):
        load(tmp_path)
    if hasattr(os, "mkfifo"):   # a FIFO nobody writes to: opening it to read would block
        fifo = tmp_path / "pipe.npz"
        os.mkfifo(fifo)
        outcome = []

        def attempt():
            try:
                load(fifo)
            except ValueError as exc:
                outcome.append(str(exc))

        reader = threading.Thread(target=attempt, daemon=True)
        reader.start()
        reader.join(30)
        assert not reader.is_alive(), "load blocked on a FIFO"
        assert outcome and "pipe.npz" in outcome[0] and "FIFO" in outcome[0]
    if os.path.exists(os.devnull) and os.name == "posix":
        opened, real_open = [], os.open
        monkeypatch.setattr(serialization.os, "open",
                            lambda *a, **k: (opened.append(a), real_open(*a, **k))[1])
        with pytest.raises(ValueError, match="character device"):
            load(os.devnull)
        assert opened == []


def _set_flag_bits(data: bytes, bits: int) -> bytes:
    """``data`` with ``bits`` set in every member's local and central general-purpose flags."""
    data = bytearray(data)
    for signature, offset in [(b"PK\x03\x04", 6), (b"PK\x01\x02", 8)]:
        for match in re.finditer(re.escape(signature), bytes(data)):
            data[match.start() + offset] |= bits
    return bytes(data)


def _zip(tmp_path, members, compression=zipfile.ZIP_STORED, name="crafted.npz"):
    path = tmp_path / name
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for member, array in members.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, array)
            zf.writestr(member + ".npy", buf.getvalue())
    return path


def _meta(tree):
    text = '{"format": "numbagrad-checkpoint", "version": 1, "tree": %s}' % tree
    return np.frombuffer(text.encode(), np.uint8)


def test_encrypted_members_are_refused(tmp_path):
    path = _saved(tmp_path, {"w": np.ones(3)})
    path.write_bytes(_set_flag_bits(path.read_bytes(), 0x1))
    with pytest.raises(ValueError, match="x.ckpt.*encrypted"):
        load(path)


def refused_within(path, match: str) -> int:
    """The peak bytes (tracemalloc) of ``load(path)`` failing with a ValueError
    matching ``match``."""
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=match):
            load(path)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_sizes_are_checked_before_decompressing(tmp_path):
    bomb = _zip(tmp_path, {"__numbagrad__": _meta('{"array": 0}'),
                           "a0": np.zeros(5_000_000, np.uint8)}, zipfile.ZIP_BZIP2, "bomb.npz")
    assert os.path.getsize(bomb) < 5_000_000 // 1000
    assert refused_within(bomb, "bomb.npz.*1000:1") < 1_000_000   # nothing was decompressed

    path = _saved(tmp_path, {"w": np.arange(1000.0)})   # an 8128-byte member
    with pytest.raises(ValueError, match="x.ckpt.*a0.npy.*max_bytes=8000"):
        load(path, max_bytes=8000)
    same(load(path, max_bytes=_declared(path)), {"w": np.arange(1000.0)})
    with pytest.raises(ValueError, match="max_bytes"):
        load(path, max_bytes=-1)
    with pytest.raises(TypeError, match="max_bytes"):
        load(path, max_bytes=1e9)


def _declared(path) -> int:
    """The bytes an archive's members declare in all."""
    with zipfile.ZipFile(path) as zf:
        return sum(info.file_size for info in zf.infolist())


def _declare(path, member: str, size: int, packed: int | None = None) -> None:
    """Make ``member`` of the archive at ``path`` declare ``size`` bytes in ``packed``
    (``size`` unless given), in its local header and the central directory."""
    data = bytearray(path.read_bytes())
    name = member.encode()
    sizes = (size if packed is None else packed).to_bytes(4, "little") + size.to_bytes(4, "little")
    for signature, at_sizes, at_name in [(b"PK\x03\x04", 18, 30), (b"PK\x01\x02", 20, 46)]:
        for match in re.finditer(re.escape(signature), bytes(data)):
            at = match.start()
            if data[at + at_name:at + at_name + len(name)] == name:
                data[at + at_sizes:at + at_sizes + 8] = sizes
    path.write_bytes(bytes(data))


def test_the_total_is_bounded_by_max_bytes(tmp_path):
    obj = {"w": np.arange(1000.0), "b": np.arange(1000.0)}   # two 8128-byte members
    path = _saved(tmp_path, obj)
    total = _declared(path)
    assert total > 2 * 8128
    with pytest.raises(ValueError, match=f"x.ckpt.*{total} bytes in all.*max_bytes={total - 1}"):
        load(path, max_bytes=total - 1)       # each member fits, their sum does not
    same(load(path, max_bytes=total), obj)
    same(load(path), obj)


def test_many_members_or_few_file_bytes_are_refused_before_allocating(tmp_path):
    # Each member compresses 229:1 (under the 1000:1 a member may), but the file as
    # a whole declares more than 100 bytes per byte it has.
    path = tmp_path / "spread.npz"
    tree = '{"list": [%s]}' % ", ".join('{"array": %d}' % i for i in range(8))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for name, a in [("__numbagrad__", _meta(tree))] + [
                (f"a{i}", np.zeros(1_000_000, np.uint8)) for i in range(8)]:
            buf = io.BytesIO()
            np.lib.format.write_array(buf, a)
            zf.writestr(name + ".npy", buf.getvalue())
    size, total = os.path.getsize(path), _declared(path)
    assert 200 * size < total < 1000 * size
    peak = refused_within(path, f"spread.npz.*{total} bytes in all from a file of {size}.*100:1")
    assert peak < 1_000_000                   # nothing was decompressed
    with pytest.raises(ValueError, match="100:1"):
        load(path, max_bytes=1 << 40)         # a larger max_bytes does not lift the ratio

    # Stored members that claim more data than the file holds (here 5 MB of a
    # 100 kB file, a .npy header to match): refused before the array is allocated.
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        head, {"descr": "|u1", "fortran_order": False, "shape": (5_000_000,)})
    path = _zip(tmp_path, {"__numbagrad__": _meta('{"array": 0}')}, name="lying.npz")
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("a0.npy", head.getvalue() + bytes(100_000))
    member = len(head.getvalue()) + 100_000
    _declare(path, "a0.npy", member - 100_000 + 5_000_000)
    assert refused_within(path, "lying.npz.*claim 50.* bytes of data, more than the file's") \
        < 1_000_000
    _declare(path, "a0.npy", member - 100_000 + 5_000_000, packed=member)
    assert refused_within(path, "lying.npz.*a0.npy.*stored uncompressed but declares 50") \
        < 1_000_000


def test_a_member_yielding_more_than_it_declares_is_refused(tmp_path, monkeypatch):
    path = _saved(tmp_path, {"w": np.arange(4.0)})
    real_open = zipfile.ZipFile.open

    def lying_open(self, name, *args, **kwargs):   # what a lying decompressor would yield
        with real_open(self, name, *args, **kwargs) as member:
            return io.BytesIO(member.read() + bytes(3 << 20))

    monkeypatch.setattr(zipfile.ZipFile, "open", lying_open)
    with pytest.raises(ValueError, match="x.ckpt.*declares"):
        load(path)


def test_a_header_that_does_not_match_the_declared_size_is_refused(tmp_path):
    lying = io.BytesIO()   # claims 80 GB of float64 but holds 32 bytes, under a valid CRC
    np.lib.format.write_array_header_1_0(
        lying, {"descr": "<f8", "fortran_order": False, "shape": (10**10,)})
    lying.write(np.ones(4).tobytes())
    path = _zip(tmp_path, {"__numbagrad__": _meta('{"array": 0}')})
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("a0.npy", lying.getvalue())
    # refused before allocating the array it claims
    assert refused_within(path, "crafted.npz.*a0.npy.*needs 80000000") < 1_000_000


def test_a_malformed_file_chains_the_underlying_error(tmp_path):
    parts = _zip(tmp_path, {"__numbagrad__": _meta('{"array": 0}'),
                            "a0": np.arange(2000.0)}, zipfile.ZIP_DEFLATED)
    same(load(parts), np.arange(2000.0))   # a compressed archive is fine
    data = bytearray(parts.read_bytes())
    data[len(data) // 2] ^= 0x55           # inside a0's deflate stream
    parts.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="crafted.npz") as info:
        load(parts)
    assert info.value.__cause__ is not None and not isinstance(info.value.__cause__, ValueError)


# ----------------------------------------------------- temporaries of saves
def _dead_pid():
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_the_temporary_carries_the_writers_pid(tmp_path, monkeypatch):
    seen = []
    real_write = np.lib.format.write_array

    def spy(*args, **kwargs):
        seen.extend(os.listdir(tmp_path))
        return real_write(*args, **kwargs)

    monkeypatch.setattr(np.lib.format, "write_array", spy)
    save(tmp_path / "c.npz", [np.ones(2)])
    assert seen and re.fullmatch(rf"\.c\.npz\.{os.getpid()}\.[0-9a-f]{{16}}\.tmp", seen[0])


@pytest.mark.skipif(os.name != "posix", reason="pids are checked with signal 0 on POSIX")
def test_a_save_removes_only_the_temporaries_of_dead_writers_to_its_target(tmp_path):
    dead, nonce = _dead_pid(), "0123456789abcdef"
    stale = [f".c.npz.{dead}.{nonce}.tmp", f".c.npz.{dead}.{nonce[::-1]}.tmp"]
    kept = [f".c.npz.1.{nonce}.tmp",                    # pid 1 always runs
            f".c.npz.{os.getppid()}.{nonce}.tmp",       # a live writer, maybe another user's
            f".c.npz.{os.getpid()}.{nonce}.tmp",        # this process (another thread's save)
            f".d.npz.{dead}.{nonce}.tmp", f".c.npz.x.{dead}.{nonce}.tmp",   # other targets
            f".c.npz.{dead}.{nonce}0.tmp", f".c.npz.{dead}.{nonce}.tmpx",   # not the pattern
            f"c.npz.{dead}.{nonce}.tmp", ".c.npz.abcdefgh.tmp", "notes.txt"]
    for name in stale + kept:
        (tmp_path / name).write_bytes(b"junk")
    save(tmp_path / "c.npz", [1])
    assert sorted(os.listdir(tmp_path)) == sorted(kept + ["c.npz"])
    assert load(tmp_path / "c.npz") == [1]


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL and signal 0 are POSIX")
def test_a_killed_saves_temporary_is_removed_by_the_next_save(tmp_path):
    path = _saved(tmp_path, {"old": np.arange(3.0)}, name="c.npz")
    before = path.read_bytes()
    child = (
        "import os, signal, sys\n"
        "import numpy as np\n"
        "from numbagrad.serialization import save\n"
        "def die(*args, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "np.lib.format.write_array = die\n"
        "save(sys.argv[1], {'new': np.ones(1000)})\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    killed = subprocess.run([sys.executable, "-c", child, str(path)], env=env,
                            capture_output=True, timeout=300)
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    left = sorted(set(os.listdir(tmp_path)) - {"c.npz"})
    assert len(left) == 1 and left[0].startswith(".c.npz.") and path.read_bytes() == before
    save(path, {"newer": 1})
    assert os.listdir(tmp_path) == ["c.npz"] and load(path) == {"newer": 1}


def test_an_os_error_from_a_save_names_the_path(tmp_path, monkeypatch):
    path = _saved(tmp_path, {"old": np.arange(3.0)})
    before = path.read_bytes()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(np.lib.format, "write_array", full)
    with pytest.raises(OSError) as info:
        save(path, {"new": np.ones(10)})
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(path)
    assert str(path) in str(info.value) and os.strerror(errno.ENOSPC) in str(info.value)
    assert path.read_bytes() == before and os.listdir(tmp_path) == [path.name]
    missing = tmp_path / "no-such-folder" / "c.npz"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        save(missing, [1])


# ------------------------------------------- resuming training from a file
K, TOTAL = 3, 8   # micro-steps: two full windows and part of a third


def _batches(seed=5):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(3, 2)), rng.normal(size=(2, 2))) for _ in range(TOTAL)]


def _build(dev, kind, w1, w2):
    W1, W2 = dev.param(w1), dev.param(w2)
    params = {"W1": W1, "W2": W2}
    if kind == "sgd":
        opt = ng.optim.SGD(params, lr=0.05, momentum=0.9, accumulate_steps=K)
    else:
        opt = ng.optim.Adam(params, lr=0.02, accumulate_steps=K)
    return W1, W2, opt


def _micro_step(dev, W1, W2, opt, batch, spelling):
    x, y = batch
    with ng.grad_tape():
        loss = ng.mse_loss(ng.matmul(W2, ng.matmul(W1, dev.tensor(x))), dev.tensor(y))
    if spelling == "grad":
        loss.backward()
        return opt.step()
    return opt.step(ng.backward(loss))


# Every combination on the CPU; one on CUDA (the simulator is slow), enough to
# show device state goes to the file and comes back.
@pytest.mark.parametrize("device, kind, spelling", [
    ("cpu", "adam", "grad"), ("cpu", "adam", "mapping"), ("cpu", "sgd", "grad"),
    ("cpu", "sgd", "mapping"), ("cuda", "adam", "grad")])
def test_model_and_optimizer_resume_from_a_file_bit_identically(tmp_path, device, kind,
                                                                 spelling):
    if device == "cuda" and not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    dev = Dev(device)
    rng = np.random.default_rng(4)
    w1, w2 = rng.normal(size=(4, 3)), rng.normal(size=(2, 4))
    data = _batches()
    W1, W2, opt = _build(dev, kind, w1, w2)
    for b in data:
        _micro_step(dev, W1, W2, opt, b, spelling)
    final = (W1.numpy(), W2.numpy(), opt.t)

    # every window position on the CPU; on the (slow) simulator one mid-window
    positions = range(TOTAL + 1) if dev.name == "cpu" else (K + 1,)
    path = tmp_path / "ckpt.npz"
    for stop in positions:
        W1, W2, opt = _build(dev, kind, w1, w2)
        for b in data[:stop]:
            _micro_step(dev, W1, W2, opt, b, spelling)
        save(path, {"model": {"W1": W1, "W2": W2}, "optim": opt.state_dict(), "step": stop})
        del W1, W2, opt

        ckpt = load(path)
        assert ckpt["step"] == stop and ckpt["optim"]["pos"] == stop % K
        R1, R2, resumed = _build(dev, kind, ckpt["model"]["W1"], ckpt["model"]["W2"])
        resumed.load_state_dict(ckpt["optim"])
        for b in data[stop:]:
            _micro_step(dev, R1, R2, resumed, b, spelling)
        np.testing.assert_array_equal(R1.numpy(), final[0], err_msg=f"resumed after {stop}")
        np.testing.assert_array_equal(R2.numpy(), final[1], err_msg=f"resumed after {stop}")
        assert resumed.t == final[2]


def test_optimizer_state_dict_round_trips_exactly(tmp_path):
    cpu = Dev("cpu")
    W1, W2, opt = _build(cpu, "adam", np.ones((4, 3)), np.ones((2, 4)))
    for b in _batches()[:K + 1]:
        _micro_step(cpu, W1, W2, opt, b, "mapping")
    state = opt.state_dict()
    same(load(_saved(tmp_path, state)), state)


def _mlp(seed=0):
    rng = np.random.default_rng(seed)
    model = ng.nn.Sequential(ng.nn.Linear(5, 8, rng=rng), ng.nn.Tanh(), ng.nn.Linear(8, 3, rng=rng))
    return model, ng.optim.Adam(model.parameters(), lr=0.01, accumulate_steps=K)


def _mlp_step(model, opt, batch):
    x, y = batch
    with ng.grad_tape():
        loss = ng.cross_entropy(model(ng.as_tensor(x)), y)
    loss.backward()
    opt.step()


def test_nn_model_and_optimizer_resume_mid_window_from_a_file(tmp_path):
    rng = np.random.default_rng(1)
    data = [(rng.normal(size=(6, 5)), rng.integers(0, 3, 6)) for _ in range(2 * K + 2)]
    model, opt = _mlp()
    for b in data:
        _mlp_step(model, opt, b)
    final = model.state_dict()

    path = tmp_path / "mlp.npz"
    for stop in range(len(data) + 1):
        model, opt = _mlp()
        for b in data[:stop]:
            _mlp_step(model, opt, b)
        save(path, {"model": model.state_dict(), "optimizer": opt.state_dict()})
        fresh, fresh_opt = _mlp(seed=99)   # other initial weights, overwritten by the file
        ckpt = load(path)
        fresh.load_state_dict(ckpt["model"])
        fresh_opt.load_state_dict(ckpt["optimizer"])
        assert fresh_opt.pending_steps == stop % K
        for b in data[stop:]:
            _mlp_step(fresh, fresh_opt, b)
        for name, array in fresh.state_dict().items():
            np.testing.assert_array_equal(array, final[name], err_msg=f"{name} after {stop}")


def test_bfloat16_arrays_and_scalars_round_trip(tmp_path):
    """A bfloat16 array's .npy dtype reads back as raw bytes (|V2), so a
    saved bfloat16 model could not be loaded: they are stored as their bits."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    m = ng.nn.Linear(3, 2).to(dtype=ng.bfloat16)
    sd = m.state_dict()
    path = str(tmp_path / "bf16.ngz")
    ng.save(path, {"model": sd, "one": ml_dtypes.bfloat16(1.5), "strided": sd["weight"][:, ::2]})
    back = ng.load(path)
    for k, v in sd.items():
        assert back["model"][k].dtype == v.dtype and back["model"][k].shape == v.shape
        assert np.array_equal(back["model"][k].view(np.uint16), v.view(np.uint16))
    assert type(back["one"]) is ml_dtypes.bfloat16 and float(back["one"]) == 1.5
    assert np.array_equal(back["strided"].view(np.uint16),
                          np.ascontiguousarray(sd["weight"][:, ::2]).view(np.uint16))
    m.load_state_dict(back["model"])
