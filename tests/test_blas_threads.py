"""Small GEMMs run on one BLAS thread, and SciPy's BLAS keeps the caller's
thread count: numbagrad puts OpenBLAS's count back before a kernel returns."""
from __future__ import annotations

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
    """A small product (one BLAS thread) and a large one (BLAS's own count)."""
    rng = np.random.default_rng(0)
    small = [rng.standard_normal(s).astype(np.float32) for s in ((32, 512), (144, 512))]
    n = int(round((matmul._BLAS_THREADS_MIN * 2) ** (1 / 3))) + 1
    large = [rng.standard_normal((n, n)) for _ in range(2)]
    return small, large


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
            out = np.empty((a.shape[0], b.shape[0]), a.dtype)
            matmul.gemm(a, b, out, False, True, 1.0, 0.0)
            np.testing.assert_allclose(out, a @ b.T, rtol=1e-4, atol=1e-3)
            assert _scipy_blas_threads() == inside
        w = ng.param(small[0][:8].copy())
        with ng.grad_tape():
            loss = ng.sum(ng.matmul(w, ng.tensor(small[1].T.copy())))
        ng.backward(loss)
        assert _scipy_blas_threads() == inside
    assert _scipy_blas_threads() == before


def test_a_small_product_has_the_one_thread_bits_whatever_the_callers_count():
    """A small product runs on one BLAS thread: its bits are OpenBLAS's
    one-thread result of the same call (row-major C = A B^T is column-major
    C^T = B A^T) under any caller limit. (Threaded, some OpenBLAS kernels
    split it differently: with OPENBLAS_CORETYPE=Haswell the two-thread
    result differs in the last bits, so one thread also keeps small
    products independent of thread settings.)"""
    from scipy.linalg import blas
    small, _ = _products()
    a, b = small
    assert a.shape[0] * b.shape[0] * a.shape[1] < matmul._BLAS_THREADS_MIN
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        ref = blas.sgemm(1.0, b.T, a.T, trans_a=True).T
    for limit in (None, 1, 2):
        out = np.empty((a.shape[0], b.shape[0]), a.dtype)
        with threadpoolctl.threadpool_limits(limit, user_api="blas"):
            matmul.gemm(a, b, out, False, True, 1.0, 0.0)
        assert np.array_equal(out, ref), limit


def test_the_benchmark_floor_uses_the_same_rule():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    try:
        import bench_cases
    finally:
        sys.path.pop(0)
    assert bench_cases.BLAS_THREADS_MIN == matmul._BLAS_THREADS_MIN
