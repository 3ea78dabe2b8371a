"""ng.load on mutated checkpoints: a clean ValueError naming the path, or the original data.

Seeded, so CI sees the same few hundred mutations every run (NUMBAGRAD_FUZZ_SCALE
scales the counts for a longer local hunt).
"""
import io
import json
import zipfile

import numpy as np
import pytest
from conftest import examples
from test_serialization import same

from numbagrad.serialization import load, save

META = "__numbagrad__.npy"


def original():
    return {
        "w": np.arange(12.0).reshape(3, 4), "i": np.arange(5, dtype=np.int32),
        "flags": np.array([True, False]), "strs": np.array(["ab", "c"]),
        "f": np.asfortranarray(np.ones((2, 3), np.float32)), "s": np.float32(2.5),
        "n": [1, -2**70, 0.1, 2 - 1j, None, True], "t": ("x", b"\x00\xff"),
        ("k", 3): {"deep": [[[]]]},
    }


def members(data: bytes) -> dict:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {info.filename: zf.read(info) for info in zf.infolist()}


def rezip(parts: dict, compression: int) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=compression) as zf:
        for name, payload in parts.items():   # a fixed date: the same bytes every run
            zf.writestr(zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0)), payload, compression)
    return out.getvalue()


def with_meta(parts: dict, meta: bytes) -> dict:
    """``parts`` with the structure member's JSON replaced by ``meta``."""
    parts = dict(parts)
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.frombuffer(meta, np.uint8))
    parts[META] = buf.getvalue()
    return parts


def flip_bits(rng, data: bytes) -> bytes:
    data = bytearray(data)
    for pos in rng.integers(0, len(data), rng.integers(1, 4)):
        data[pos] ^= 1 << int(rng.integers(0, 8))
    return bytes(data)


# Entries no position in a structure may hold, and entries valid in some positions.
INVALID = [float("inf"), float("nan"), -1, 10**30, 1.5, {}, [1, 2], {"array": 99},
           {"array": "0"}, {"array": 1.0}, {"int": 5}, {"int": "1e3"}, {"float": 1.0},
           {"complex": ["0x1p0"]}, {"list": "abc"}, {"dict": {"ab": 1}}, {"dict": [[1]]},
           {"dict": [[{"list": []}, 1]]}, {"tuple": {}}, {"what": 0}, {"array": 0, "list": []},
           [[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]
VALID_SOMEWHERE = [True, None, "", "x", [], {"list": []}, {"int": "7"}, {"float": "0x1p-1"}]


def edit_tree(rng, node):
    """``node`` with one random entry (or its tag) replaced, and whether that must be refused."""
    if isinstance(node, list) and node and rng.random() < 0.7:
        i = int(rng.integers(len(node)))
        child, refuse = edit_tree(rng, node[i])
        return node[:i] + [child] + node[i + 1:], refuse
    if isinstance(node, dict) and len(node) == 1 and rng.random() < 0.8:
        (tag, value), = node.items()
        if rng.random() < 0.15:
            return {tag + "x": value}, True
        child, refuse = edit_tree(rng, value)
        return {tag: child}, refuse
    if rng.random() < 0.75:
        return INVALID[int(rng.integers(len(INVALID)))], True
    return VALID_SOMEWHERE[int(rng.integers(len(VALID_SOMEWHERE)))], False


def plain(x):
    """Whether ``x`` is made only of what ng.load may return."""
    if isinstance(x, dict):
        return all(plain(k) and plain(v) for k, v in x.items())
    if isinstance(x, (list, tuple)):
        return all(plain(v) for v in x)
    return x is None or isinstance(x, (bool, int, float, complex, str, bytes, np.ndarray,
                                       np.generic))


def check(path, data: bytes, expected, edited=False, refuse=False) -> str:
    """Load mutated ``data``: refused cleanly, or ``expected`` (any plain data if ``edited``)."""
    path.write_bytes(data)
    try:
        back = load(path)
    except ValueError as exc:
        assert str(path) in str(exc)
        return "refused"
    assert not refuse, f"loaded {back!r:.200} from a structure that must be refused"
    if edited:
        assert plain(back)
    else:
        same(back, expected)
    return "loaded"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "orig.npz"
    save(path, original())
    data = path.read_bytes()
    return data, members(data)


def test_bit_flips_and_truncations(tmp_path, saved):
    data, _ = saved
    rng = np.random.default_rng(1901)
    path = tmp_path / "mutated.npz"
    outcomes = [check(path, flip_bits(rng, data), original()) for _ in range(examples(150))]
    outcomes += [check(path, data[:int(rng.integers(len(data)))], original())
                 for _ in range(examples(40))]
    assert outcomes.count("refused") > len(outcomes) // 2   # most flips hit checked bytes


@pytest.mark.parametrize("compression", [zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2,
                                         zipfile.ZIP_LZMA])
def test_rezipped_with_compression_then_mutated(tmp_path, saved, compression):
    _, parts = saved
    packed = rezip(parts, compression)
    path = tmp_path / "rezipped.npz"
    assert check(path, packed, original()) == "loaded"   # a clean re-zip still loads
    rng = np.random.default_rng(1902 + compression)
    for _ in range(examples(25)):
        check(path, flip_bits(rng, packed), original())
        check(path, packed[:int(rng.integers(len(packed)))], original())


def test_edited_structure(tmp_path, saved):
    _, parts = saved
    meta = np.lib.format.read_array(io.BytesIO(parts[META])).tobytes()
    tree = json.loads(meta)
    rng = np.random.default_rng(1903)
    path = tmp_path / "edited.npz"
    outcomes = []
    for _ in range(examples(100)):
        edited, refuse = edit_tree(rng, tree["tree"])
        text = json.dumps(dict(tree, tree=edited), allow_nan=True).encode()
        outcomes.append(check(path, rezip(with_meta(parts, text), zipfile.ZIP_STORED), None,
                              edited=True, refuse=refuse))
    assert check(path, rezip(with_meta(parts, meta), zipfile.ZIP_STORED), original()) == "loaded"
    assert 0 < outcomes.count("refused") < len(outcomes)
