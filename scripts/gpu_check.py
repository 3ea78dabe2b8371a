"""On a machine with an NVIDIA GPU: the CUDA tests on the real device, then a
short GPU benchmark, printed as one table. Finishes in under 5 minutes.

    python scripts/gpu_check.py [--skip-tests] [--json PATH]

The benchmark reports the GEMM kernel's GFLOP/s next to cuBLAS (through
PyTorch or CuPy, when one is installed) and the time of a training
micro-step (forward, loss, backward, Adam with accumulate_steps=4) at the
tiny and large linear sizes and the 784-1024-1024-10 MLP of scripts/bench.py,
next to PyTorch on the GPU (timed interleaved, best of 5 rounds).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") != "0":
    sys.exit("NUMBA_ENABLE_CUDASIM is set: this script checks a real GPU; unset it")
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
sys.path[:0] = [ROOT, HERE]

import numpy as np

import numbagrad as ng

TEST_BUDGET_S = 200


def run_tests() -> dict:
    """The CUDA half of the suite (and the CPU-vs-CUDA tests), no simulator."""
    start = time.perf_counter()
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    try:
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-k", "cuda",
                              "-p", "no:cacheprovider", os.path.join(ROOT, "tests")],
                             cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=TEST_BUDGET_S, stdin=subprocess.DEVNULL, check=False)
        summary = (run.stdout.strip().splitlines() or ["(no output)"])[-1]
        ok = run.returncode == 0
        if not ok:
            print(run.stdout[-4000:], run.stderr[-2000:], sep="\n")
    except subprocess.TimeoutExpired:
        summary, ok = f"timed out after {TEST_BUDGET_S} s", False
    return {"ok": ok, "summary": summary, "seconds": time.perf_counter() - start}


def cublas_matmul(n: int, dtype):
    """A callable running cuBLAS's n x n x n product, or None."""
    try:
        import torch
        if torch.cuda.is_available():
            a, b = (torch.randn(n, n, dtype=getattr(torch, dtype), device="cuda") for _ in "ab")
            c = torch.empty_like(a)
            return lambda: torch.matmul(a, b, out=c), torch.cuda.synchronize, "torch"
    except ImportError:
        pass
    try:
        import cupy
        a, b = (cupy.random.standard_normal((n, n)).astype(dtype) for _ in "ab")
        c = cupy.empty_like(a)
        return (lambda: cupy.matmul(a, b, out=c),
                cupy.cuda.runtime.deviceSynchronize, "cupy")
    except ImportError:
        return None


def time_gpu(fn, sync, min_time: float = 0.2) -> float:
    fn()
    sync()
    n, elapsed = 1, 0.0
    while elapsed < min_time:
        n *= 2
        start = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        elapsed = time.perf_counter() - start
    return elapsed / n


def gemm_rows() -> list[dict]:
    kern = ng.kernels.get("cuda")
    rows = []
    for n in (1024, 4096):
        for dtype in ("float32", "float64"):
            rng = np.random.default_rng(n)
            a, b = (kern.from_host(rng.normal(size=(n, n)).astype(dtype)) for _ in "ab")
            c = kern.empty((n, n), np.dtype(dtype))
            ours = time_gpu(lambda a=a, b=b, c=c: kern.gemm(a, b, c, False, False, 1.0, 0.0),
                            kern.synchronize)
            flops = 2.0 * n ** 3
            row = {"what": f"gemm {n}^3 {dtype}", "numbagrad": flops / ours / 1e9,
                   "unit": "GFLOP/s"}
            peer = cublas_matmul(n, dtype)
            if peer is not None:
                fn, sync, name = peer
                row["peer"] = flops / time_gpu(fn, sync) / 1e9
                row["peer_name"] = f"cuBLAS ({name})"
            rows.append(row)
    return rows


def step_rows() -> list[dict]:
    """Training micro-steps on the GPU, numbagrad and PyTorch timed interleaved
    (scripts/bench.py's rounds); the MLP row when ng.nn runs on CUDA."""
    import bench
    rows = []
    sync = bench.sync_for("cuda")
    for case in ("tiny", "large", "mlp-large"):
        dtype = np.dtype("float32")
        try:
            fns = {"numbagrad": bench.numbagrad_step(case, dtype, "adam", "cuda")}
        except Exception as exc:  # noqa: BLE001 (reported; the other rows still run)
            print(f"micro-step {case}: numbagrad cannot run it on CUDA: {exc}")
            continue
        peer = bench.torch_step(case, dtype, "adam", "cuda")
        if peer is not None:
            fns["torch"] = peer
        stats = bench.interleaved(fns, repeats=5, min_time=0.05, sync=sync)
        row = {"what": f"micro-step {case} float32 adam",
               "numbagrad": stats["numbagrad"]["best_s"] * 1e6, "unit": "µs",
               "spread": stats["numbagrad"]["spread"]}
        if peer is not None:
            row["peer"] = stats["torch"]["best_s"] * 1e6
            row["peer_name"] = "PyTorch eager (cuda)"
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    reason = ng.kernels.cuda_unavailable_reason()
    if reason is not None:
        print(f"no GPU to check: {reason}")
        return 2
    from numba import cuda
    device = cuda.get_current_device()
    name = device.name.decode() if isinstance(device.name, bytes) else device.name
    print(f"GPU: {name}, compute capability {device.compute_capability}", flush=True)
    tests = None if args.skip_tests else run_tests()
    rows = gemm_rows() + step_rows()
    print()
    print(f"{'measurement':32} {'numbagrad':>12} {'peer':>12} {'ratio':>7}  unit, peer")
    if tests is not None:
        print(f"{'CUDA tests on the GPU':32} {tests['summary']} ({tests['seconds']:.0f} s)")
    for r in rows:
        peer = r.get("peer")
        ratio = "" if peer is None else f"{r['numbagrad'] / peer:.2f}x"
        print(f"{r['what']:32} {r['numbagrad']:12,.1f} "
              f"{'n/a' if peer is None else f'{peer:,.1f}':>12} {ratio:>7}  "
              f"{r['unit']}, {r.get('peer_name', 'no peer installed')}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"gpu": name, "tests": tests, "rows": rows}, fh, indent=1)
    return 0 if tests is None or tests["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
