"""Dispatch over op codes is generated from the records (``kernels/codes.py``'s
``UNARY`` and ``BINARY``, ``kernels/dispatch.py``): every record reaches every
kernel path, an unknown code raises on every path of both devices, and the
sets the rest of the package reads are derived from the records."""
import inspect
import linecache

import numpy as np
import pytest

import numbagrad as ng
from numbagrad import kernels
from numbagrad.kernels import dispatch, codes
from numbagrad.kernels.cpu import vmath

UNARY_NAMES = [r.name for r in codes.UNARY]
BINARY_NAMES = [r.name for r in codes.BINARY]
# the codes whose formulas want x > 0 (log, sqrt, ...): chosen by name
POSITIVE = {"log", "sqrt", "rdiv_s", "pow"}


def _kern(device):
    if device == "cuda" and not ng.cuda_available():
        pytest.skip(ng.cuda_unavailable_reason())
    return kernels.get(device)


def test_the_records_give_the_constants_and_the_sets():
    for records in (codes.UNARY, codes.BINARY):
        assert len({r.name for r in records}) == len(records)
        for code, r in enumerate(records):
            assert getattr(codes, r.name.upper()) == code
    assert codes.N_UNARY == len(codes.UNARY) and codes.N_BINARY == len(codes.BINARY)
    assert codes.CHEAP_UNARY == {c for c, r in enumerate(codes.UNARY) if r.cheap}
    assert codes.FAST32 == {c for c, r in enumerate(codes.UNARY) if r.fast32}
    assert codes.ACTIVATIONS == {r.name: c for c, r in enumerate(codes.UNARY) if r.fuse}
    assert codes.EPILOGUE == {codes.IDENT} | {c for c in codes.ACTIVATIONS.values()
                                                if codes.UNARY[c].grad_from_output}
    assert codes.PRE_KEPT == set(codes.ACTIVATIONS.values()) - codes.EPILOGUE


def test_the_fast_forms_are_exactly_the_records_that_ask():
    fast = {n[len("fast_"):-len("_grad")] if n.endswith("_grad") else n[len("fast_"):]
            for n in vars(vmath) if n.startswith("fast_")}
    assert fast == {codes.UNARY[c].name for c in codes.FAST32}


def test_the_memory_bound_unary_codes_are_the_cheap_records():
    cpu = kernels.get("cpu")
    for code, r in enumerate(codes.UNARY):
        assert cpu.memory_bound("unary", (code,)) == r.cheap, r.name
        assert cpu.memory_bound("unary_backward", (code,)) == r.cheap, r.name


def test_a_ladder_is_plain_source_with_a_raise():
    fn = dispatch.ladder("pick", "x", [0, 2], "return x + {code}", {}, "pick: unknown op code")
    assert fn(0, 1.0) == 1.0 and fn(2, 1.0) == 3.0
    for bad in (1, 3, -1):
        with pytest.raises(ValueError, match="pick: unknown op code"):
            fn(bad, 1.0)
    assert "elif code == 2:" in inspect.getsource(fn)       # linecache holds the source
    assert linecache.getlines(fn.__code__.co_filename) == fn.__source__.splitlines(True)
    empty = dispatch.ladder("none", "", [], "pass", {}, "none: unknown op code")
    with pytest.raises(ValueError, match="none: unknown op code"):
        empty(0)


def _unknown_calls(kern, device, x, out):
    """(what, thunk) for every kernel path that takes an elementwise code, each
    given a code no record has."""
    nu, nb = codes.N_UNARY, codes.N_BINARY
    x3 = kern.from_host(np.ones((2, 3, 2)))
    o3 = kern.from_host(np.zeros((2, 3, 2)))
    calls = {
        "unary": lambda: kern.unary(nu, x, out, 0.0, 1.0, 0.0),
        "unary_backward": lambda: kern.unary_backward(nu, x, x, x, out, 0.0, 0.0),
        "binary": lambda: kern.binary(nb, x, x, out),
        "binary_backward": lambda: kern.binary_backward(nb, x, x, x, out, 0.0, True, out,
                                                        0.0, True),
        "unary_nd": lambda: kern.unary_nd(nu, x3, o3, 0.0, 1.0, 0.0),
        "unary_nd_backward": lambda: kern.unary_nd_backward(nu, x3, x3, x3, o3, 0.0, 0.0),
        "binary_nd": lambda: kern.binary_nd(nb, x3, x3, o3),
        "binary_nd_backward": lambda: kern.binary_nd_backward(nb, x3, x3, x3, o3, 0.0, True,
                                                              o3, 0.0, True),
    }
    if device == "cpu":
        for name in ("unary", "unary_backward", "binary", "binary_backward"):
            twin = getattr(kern, name + "_mt")
            args = {"unary": (nu, x, out, 0.0, 1.0, 0.0),
                    "unary_backward": (nu, x, x, x, out, 0.0, 0.0),
                    "binary": (nb, x, x, out),
                    "binary_backward": (nb, x, x, x, out, 0.0, True, out, 0.0, True)}[name]
            calls[name + "_mt"] = lambda twin=twin, args=args: twin(*args)
        calls["vmath exact"] = lambda: vmath.EXACT["unary"](nu, 1.0, 0.0)
        one = np.float32(1.0)                   # the fast forms are float32's
        calls["vmath fast"] = lambda: vmath._FAST["unary_grad"](nu, one, one, np.float32(0.0))
    return calls, (out, o3)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.filterwarnings("ignore:.*encountered in scalar:RuntimeWarning")
def test_every_path_refuses_an_unknown_code(device):
    kern = _kern(device)
    x = kern.from_host(np.ones((2, 3)))
    out = kern.from_host(np.zeros((2, 3)))
    calls, written = _unknown_calls(kern, device, x, out)
    for what, thunk in calls.items():
        with pytest.raises(ValueError, match="unknown op code"):
            thunk()
        for array in written:      # nothing written
            assert not kernels.to_host(kern, array).any(), what
    for fn in (codes.unary, codes.unary_grad, codes.binary, codes.binary_grad_a,
               codes.binary_grad_b):
        args = (1.0,) * (len(inspect.signature(fn).parameters) - 1)
        with pytest.raises(ValueError, match="unknown op code"):
            fn(codes.N_UNARY if "unary" in fn.__name__ else codes.N_BINARY, *args)


def _inputs(name, dtype, shape=(5, 7)):
    rng = np.random.default_rng(len(name))
    x = rng.normal(size=shape) * 2
    if name in POSITIVE:
        x = np.abs(x) + 0.25
    return x.astype(dtype)


def _reference(fn, *arrays, p=None):
    """The plain-Python formula element by element, in float64."""
    flat = [np.asarray(a, np.float64).ravel() for a in arrays]
    args = (p,) if p is not None else ()
    return np.array([fn(*vals, *args) for vals in zip(*flat)]).reshape(arrays[0].shape)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("name", UNARY_NAMES)
def test_each_unary_record_runs_on_every_cpu_path(name, dtype):
    cpu = kernels.get("cpu")
    code = UNARY_NAMES.index(name)
    p = 1.5 if name not in ("softplus",) else 2.0
    x = _inputs(name, dtype)
    y_ref = _reference(lambda v, q: codes.unary(code, v, q), x, p=p)
    tol = dict(rtol=1e-13, atol=1e-14) if dtype == np.float64 else dict(rtol=2e-6, atol=1e-6)
    for fn in (cpu.unary, cpu.unary_mt):
        y = np.empty_like(x)
        fn(code, x, y, dtype(p), dtype(1.0), dtype(0.0))
        np.testing.assert_allclose(y, y_ref, **tol, err_msg=f"{name} {fn.__name__}")
    x3 = x[:4].reshape(2, 2, 7).transpose(1, 0, 2)     # strided: the N-d kernel
    y3 = np.empty(x3.shape, dtype)
    cpu.unary_nd(code, x3, y3, dtype(p), dtype(1.0), dtype(0.0))
    np.testing.assert_allclose(y3, y_ref[:4].reshape(2, 2, 7).transpose(1, 0, 2), **tol,
                               err_msg=f"{name} unary_nd")
    y = y_ref.astype(dtype)
    g = _inputs("g", dtype)
    d_ref = g * _reference(lambda v, w, q: codes.unary_grad(code, v, w, q), x, y, p=p)
    for fn in (cpu.unary_backward, cpu.unary_backward_mt):
        d = np.empty_like(x)
        fn(code, x, y, g, d, 0.0, dtype(p))
        np.testing.assert_allclose(d, d_ref, **tol, err_msg=f"{name} {fn.__name__}")


@pytest.mark.parametrize("name", BINARY_NAMES)
def test_each_binary_record_runs_on_every_cpu_path(name):
    cpu = kernels.get("cpu")
    code = BINARY_NAMES.index(name)
    a, b = _inputs("a", np.float64), np.abs(_inputs("bb", np.float64)) + 0.5
    b[0, :3] = a[0, :3]                                   # ties (maximum/minimum)
    want = _reference(lambda u, v: codes.binary(code, u, v), a, b)
    for fn in (cpu.binary, cpu.binary_mt):
        out = np.empty_like(a)
        fn(code, a, b, out)
        np.testing.assert_array_equal(out, want, err_msg=f"{name} {fn.__name__}")
    g = _inputs("g", np.float64)
    da_ref = g * _reference(lambda u, v: codes.binary_grad_a(code, u, v), a, b)
    db_ref = g * _reference(lambda u, v: codes.binary_grad_b(code, u, v), a, b)
    for fn in (cpu.binary_backward, cpu.binary_backward_mt):
        da, db = np.empty_like(a), np.empty_like(b)
        fn(code, a, b, g, da, 0.0, True, db, 0.0, True)
        np.testing.assert_allclose(da, da_ref, rtol=1e-15, err_msg=f"{name} grad a")
        np.testing.assert_allclose(db, db_ref, rtol=1e-15, err_msg=f"{name} grad b")
    a3, b3 = a[:4].reshape(2, 2, 7), b[:4].reshape(2, 2, 7).transpose(1, 0, 2)
    out3 = np.empty((2, 2, 7))
    cpu.binary_nd(code, a3, b3, out3)
    np.testing.assert_array_equal(out3, _reference(lambda u, v: codes.binary(code, u, v),
                                                   a3, b3), err_msg=f"{name} binary_nd")


def test_a_kernel_cache_stamp_follows_the_kernel_files_it_imports(tmp_path, monkeypatch):
    # Numba checks a cached kernel against its own file only; numbagrad's
    # stamp covers the kernel files it imports, so an edited record recompiles
    # the kernels that compile it in, and nothing else.
    import os
    import shutil

    from numbagrad import _cache
    assert _cache.numba_cache_stamped
    root = tmp_path / "numbagrad"
    shutil.copytree(os.path.dirname(ng.__file__), root,
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(_cache, "_PACKAGE", str(root))
    kernels_dir = root / "kernels"
    elementwise, norm = kernels_dir / "cpu" / "elementwise.py", kernels_dir / "cpu" / "norm.py"
    before = {f: _cache.dependency_stamp(str(f)) for f in (elementwise, norm)}
    assert None not in before.values()
    # a copied tree keeps its stamps (paths count relative to the package)
    monkeypatch.setattr(_cache, "_PACKAGE", os.path.dirname(ng.__file__))
    assert _cache.dependency_stamp(os.path.join(_cache._PACKAGE, "kernels", "cpu",
                                                "elementwise.py")) == before[elementwise]
    monkeypatch.setattr(_cache, "_PACKAGE", str(root))
    with open(kernels_dir / "codes.py", "a") as f:
        f.write("\n# an edited record\n")
    assert _cache.dependency_stamp(str(elementwise)) != before[elementwise]
    assert _cache.dependency_stamp(str(norm)) == before[norm]      # norm never sees codes.py
    with open(kernels_dir / "__init__.py", "a") as f:              # plumbing: no kernel code
        f.write("\n# an edited registry\n")
    assert _cache.dependency_stamp(str(norm)) == before[norm]
    assert _cache.dependency_stamp(str(tmp_path / "elsewhere.py")) is None
