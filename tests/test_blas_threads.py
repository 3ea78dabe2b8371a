"""numbagrad never runs OpenBLAS's own threads: every BLAS call is on one
thread, a large product's threaded twin splits it over Numba's threads, and
SciPy's BLAS keeps the caller's thread count (numbagrad puts it back)."""
from __future__ import annotations

import numba
import numpy as np
import pytest

import numbagrad as ng
from numbagrad.kernels.cpu import matmul

threadpoolctl = pytest.importorskip("threadpoolctl")


def _scipy_blas_threads() -> list[int]:
    import scipy.linalg.cython_blas  # noqa: F401  (loads SciPy's BLAS)
    return [d["num_threads"] for d in threadpoolctl.threadpool_info()
            if d["user_api"] == "blas" and "scipy.libs" in d["filepath"].replace("\\", "/")]


def _products():
    """A small product and one past the split threshold."""
    rng = np.random.default_rng(0)
    small = [rng.standard_normal(s).astype(np.float32) for s in ((32, 512), (144, 512))]
    n = int(round((matmul._SPLIT_MIN * 2) ** (1 / 3))) + 1
    large = [rng.standard_normal((n, n)) for _ in range(2)]
    return small, large


def _one_thread_gemm(a, b, trans_a, trans_b):
    """OpenBLAS's one-thread result of the call numbagrad makes: row-major
    C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T."""
    from scipy.linalg import blas
    gemm = blas.sgemm if a.dtype == np.float32 else blas.dgemm
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        # a C-ordered X is the Fortran-ordered X.T
        return gemm(1.0, b.T, a.T, trans_a=trans_b, trans_b=trans_a).T


@pytest.mark.parametrize("limit", [None, 1, 2])
def test_the_callers_blas_thread_count_is_kept(limit):
    before = _scipy_blas_threads()
    if not before:
        pytest.skip("SciPy's BLAS is not the OpenBLAS threadpoolctl sees here")
    small, large = _products()
    ctx = threadpoolctl.threadpool_limits(limit, user_api="blas") if limit else None
    with ctx if ctx is not None else threadpoolctl.threadpool_limits(None):
        inside = _scipy_blas_threads()
        for a, b in (small, large):
            for kernel in (matmul.gemm, matmul.gemm_mt):
                out = np.empty((a.shape[0], b.shape[0]), a.dtype)
                kernel(a, b, out, False, True, 1.0, 0.0)
                np.testing.assert_allclose(out, a @ b.T, rtol=1e-4, atol=1e-3)
                assert _scipy_blas_threads() == inside
            out = np.empty((1, a.shape[0], b.shape[0]), a.dtype)
            matmul.bgemm_mt(a[None], b[None], out, False, True, 1.0, 0.0, 1, 1, 1, 1)
            np.testing.assert_allclose(out[0], a @ b.T, rtol=1e-4, atol=1e-3)
            assert _scipy_blas_threads() == inside
        w = ng.param(large[0][:300].copy())
        with ng.grad_tape():
            loss = ng.sum(ng.relu(ng.linear(ng.tensor(large[1]), w)))
        ng.backward(loss)
        assert _scipy_blas_threads() == inside
    assert _scipy_blas_threads() == before


@pytest.mark.parametrize("limit", [None, 1, 2])
def test_gemm_has_the_one_thread_bits_whatever_the_callers_count(limit):
    """A product of any size runs on one BLAS thread: its bits are OpenBLAS's
    one-thread result of the same call under any caller limit (threaded,
    OpenBLAS splits some products differently: the last bits then depend on
    thread settings)."""
    small, large = _products()
    for a, b in (small, large):
        with threadpoolctl.threadpool_limits(limit, user_api="blas"):
            out = np.empty((a.shape[0], b.shape[0]), a.dtype)
            matmul.gemm(a, b, out, False, True, 1.0, 0.0)
        assert np.array_equal(out, _one_thread_gemm(a, b, False, True)), (limit, a.shape)


# (m, n, k): split by rows (m >= n) and by columns, block edges off the
# 16-row lattice, every transpose pair
SPLIT_SHAPES = [(768, 128, 512), (128, 768, 512), (301, 203, 397), (203, 301, 397)]


@pytest.mark.parametrize("m,n,k", SPLIT_SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_split_product_is_the_whole_product(m, n, k, dtype):
    """gemm_mt's blocks (one BLAS call on one thread each) give the whole
    product. Not always bit for bit: OpenBLAS picks its kernels by size, so
    a block's edge elements may differ from the one-call result in the last
    bits (as OpenBLAS's own threads' results do)."""
    assert m * n * k >= matmul._SPLIT_MIN
    parts, step, by_rows = matmul._blocks(m, n, k, 2)
    assert parts == 2 and by_rows == (m >= n) and step % matmul._ALIGN == 0
    assert matmul._blocks(m, n, k, 1)[0] == 1 and matmul._blocks(8, 8, 8, 2)[0] == 1
    rng = np.random.default_rng(m + n)
    tol = 2e-5 if dtype == np.float32 else 1e-12
    for ta in (0, 1):
        for tb in (0, 1):
            a = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
            b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
            start = rng.standard_normal((m, n)).astype(dtype)
            out, serial = start.copy(), start.copy()
            matmul.gemm_mt(a, b, out, ta, tb, 1.0, 0.5)
            matmul.gemm(a, b, serial, ta, tb, 1.0, 0.5)
            scale = np.sqrt(k) * 4
            np.testing.assert_allclose(out, serial, rtol=0, atol=tol * scale)
            exact = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b) + 0.5 * start
            np.testing.assert_allclose(out, exact, rtol=0, atol=tol * scale * 4)


# (m, n, k): long and thin products (a weight gradient over a batch), k off
# the 16-row lattice, and one the output split never reached (16x9)
INNER_SHAPES = [(32, 144, 1024), (16, 9, 4096), (24, 40, 1501)]


@pytest.mark.parametrize("m,n,k", INNER_SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_long_inner_dimension_is_split_along_it(m, n, k, dtype):
    """One long and thin product in ``bgemm_mt`` is a BLAS call per run of k
    (the first with beta, into out), then the other runs' products added in
    order: bit for bit what those calls give one after the other, the
    one-thread twin's bits, and the whole product to rounding."""
    runs, step = matmul._inner_blocks(m, n, k, 2)
    assert runs == 2 and step % matmul._ALIGN == 0 and step < k
    assert matmul._inner_blocks(m, n, k, 1)[0] == 1          # one thread: no split
    assert matmul._inner_blocks(256, 256, 512, 2)[0] == 1    # not long enough
    # the runs bgemm_mt makes here (as many as Numba's threads, at least 256 deep)
    runs, step = matmul._inner_blocks(m, n, k, numba.get_num_threads())
    runs_of = [slice(q * step, min(k, q * step + step)) for q in range(runs)]
    rng = np.random.default_rng(m * n)
    for ta in (0, 1):
        for tb in (0, 1):
            a = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
            b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
            start = rng.standard_normal((1, m, n)).astype(dtype)
            out, one, whole = start.copy(), start.copy(), start.copy()
            matmul.bgemm_mt(a[None], b[None], out, ta, tb, 2.0, 0.5, 1, 1, 1, 1)
            matmul.bgemm_st(a[None], b[None], one, ta, tb, 2.0, 0.5, 1, 1, 1, 1)
            matmul.bgemm(a[None], b[None], whole, ta, tb, 2.0, 0.5, 1, 1, 1, 1)
            assert np.array_equal(out, one)
            pieces = [(np.ascontiguousarray(a[r] if ta else a[:, r]),
                       np.ascontiguousarray(b[:, r] if tb else b[r])) for r in runs_of]
            want = start[0].copy()
            matmul.gemm(*pieces[0], want, ta, tb, 2.0, 0.5)
            for piece in pieces[1:]:
                later = np.empty_like(want)
                matmul.gemm(*piece, later, ta, tb, 2.0, 0.0)
                want += later
            assert np.array_equal(out[0], want)
            tol = (2e-5 if dtype == np.float32 else 1e-12) * np.sqrt(k) * 8
            np.testing.assert_allclose(out, whole, rtol=0, atol=tol)
            exact = 2.0 * ((a.T if ta else a).astype(np.float64) @ (b.T if tb else b)) \
                + 0.5 * start[0]
            np.testing.assert_allclose(out[0], exact, rtol=0, atol=tol)


def test_linear_and_bgemm_twins_match_their_serial_kernels():
    rng = np.random.default_rng(3)
    for m, n, k in ((700, 150, 300), (150, 700, 300)):
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        from numbagrad.kernels import codes
        for code in (codes.IDENT, codes.RELU, codes.TANH):
            for has_bias in (0, 1):
                serial, twin = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
                matmul.linear(x, w, bias, serial, has_bias, code, 0.0)
                matmul.linear_mt(x, w, bias, twin, has_bias, code, 0.0)
                # the split's edge elements may differ in the last bits (above)
                np.testing.assert_allclose(twin, serial, rtol=0, atol=2e-5 * np.sqrt(k) * 4)
                ref = x.astype(np.float64) @ w.T + (bias if has_bias else 0)
                ref = {codes.IDENT: ref, codes.RELU: np.maximum(ref, 0), codes.TANH: np.tanh(ref)}
                np.testing.assert_allclose(twin, ref[code], rtol=0, atol=2e-4 * np.sqrt(k))
        a3 = rng.standard_normal((6, m, k)).astype(np.float32)
        b3 = rng.standard_normal((3, k, n)).astype(np.float32)
        # several slices: each one gemm call on one thread, the serial kernel's bits
        serial, twin = np.empty((6, m, n), np.float32), np.empty((6, m, n), np.float32)
        matmul.bgemm(a3, b3, serial, 0, 0, 1.0, 0.0, 1, 2, 1, 6)
        matmul.bgemm_mt(a3, b3, twin, 0, 0, 1.0, 0.0, 1, 2, 1, 6)
        assert np.array_equal(serial, twin)
        np.testing.assert_allclose(twin[5], a3[5] @ b3[2], rtol=1e-4, atol=1e-3)
