"""Micro-benchmark: one training micro-step, numbagrad next to its peers.

A micro-step is: forward matmul, MSE loss, backward into the gradient
accumulator, then ``optimizer.step()`` with ``accumulate_steps=K`` (so one
call in K applies the update). Each case is timed for, in this process and
this run:

- numbagrad (``--device cpu`` or ``cuda``),
- a hand-written NumPy loop doing the same math into preallocated buffers,
- PyTorch eager, when importable (on the GPU too for ``--device cuda``),
- the GEMM floor: the two matrix products no micro-step can avoid
  (``W @ X`` and ``R @ X.T``) timed alone.

Times are µs per micro-step (best and median of the repeats); ratios are
of best-of times from this one run. Also reported: the first micro-step in
a fresh process with a cold and a warm Numba cache, and the transient memory
a steady-state micro-step allocates (tracemalloc; PyTorch's allocator is
not traced, so it shows as n/a).

    python scripts/bench.py --quick              # the README's main job
    python scripts/bench.py --json out.json --plot out.png
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import numbagrad as ng  # noqa: E402

CASES = {  # name: (d_out, d_in, batch)
    "tiny": (2, 3, 1),
    "small": (64, 64, 32),
    "medium": (256, 512, 128),
    "large": (1024, 1024, 512),
}
K = 4
LR, MOMENTUM, BETAS, EPS = 1e-3, 0.9, (0.9, 0.999), 1e-8

try:
    import torch
except ImportError:
    torch = None


def problem(case: str, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d_out, d_in, batch = CASES[case]
    rng = np.random.default_rng(0)
    W = (rng.normal(size=(d_out, d_in)) / np.sqrt(d_in)).astype(dtype)
    X = rng.normal(size=(d_in, batch)).astype(dtype)
    Y = rng.normal(size=(d_out, batch)).astype(dtype)
    return W, X, Y


# ------------------------------------------------------------------ systems
def numbagrad_step(case, dtype, opt_kind, device) -> Callable[[], None]:
    w0, x0, y0 = problem(case, dtype)
    W = ng.param(w0, device=device)
    X, Y = ng.tensor(x0, device=device), ng.tensor(y0, device=device)
    if opt_kind == "sgd":
        opt = ng.optim.SGD([W], lr=LR, momentum=MOMENTUM, accumulate_steps=K)
    else:
        opt = ng.optim.Adam([W], lr=LR, betas=BETAS, eps=EPS, accumulate_steps=K)
    matmul, mse_loss, tape = ng.matmul, ng.mse_loss, ng.grad_tape

    def micro_step():
        with tape():
            loss = mse_loss(matmul(W, X), Y)
        loss.backward()
        opt.step()
    micro_step.weights = W.numpy
    return micro_step


def numpy_step(case, dtype, opt_kind, device) -> Callable[[], None]:
    """The same math by hand in NumPy, with preallocated buffers."""
    W, X, Y = problem(case, dtype)
    P, G, T = np.empty_like(Y), np.zeros_like(W), np.empty_like(W)
    M, V = np.zeros_like(W), np.zeros_like(W)
    c = 2.0 / Y.size
    state = {"pos": 0, "t": 0}

    def micro_step():
        np.matmul(W, X, out=P)
        np.subtract(P, Y, out=P)                 # residual
        loss = np.vdot(P, P) / P.size            # noqa: F841 (computed, as a step must)
        np.multiply(P, c, out=P)                 # d loss / d pred
        np.matmul(P, X.T, out=T)
        np.add(G, T, out=G)
        state["pos"] += 1
        if state["pos"] < K:
            return
        state["pos"] = 0
        np.multiply(G, 1.0 / K, out=G)
        if opt_kind == "sgd":
            np.multiply(M, MOMENTUM, out=M)
            np.add(M, G, out=M)
            np.subtract(W, LR * M, out=W)
        else:
            state["t"] += 1
            t = state["t"]
            np.multiply(M, BETAS[0], out=M)
            np.add(M, (1 - BETAS[0]) * G, out=M)
            np.multiply(V, BETAS[1], out=V)
            np.add(V, (1 - BETAS[1]) * G * G, out=V)
            denom = np.sqrt(V)
            denom /= np.sqrt(1 - BETAS[1] ** t)
            denom += EPS
            np.subtract(W, (LR / (1 - BETAS[0] ** t)) * M / denom, out=W)
        G.fill(0)
    micro_step.weights = W.copy
    return micro_step


def torch_step(case, dtype, opt_kind, device) -> Callable[[], None] | None:
    if torch is None or (device == "cuda" and not torch.cuda.is_available()):
        return None
    w0, x0, y0 = problem(case, dtype)
    dev = "cuda" if device == "cuda" else "cpu"
    W = torch.tensor(w0, device=dev, requires_grad=True)
    X, Y = torch.tensor(x0, device=dev), torch.tensor(y0, device=dev)
    if opt_kind == "sgd":
        opt = torch.optim.SGD([W], lr=LR, momentum=MOMENTUM)
    else:
        opt = torch.optim.Adam([W], lr=LR, betas=BETAS, eps=EPS)
    mse = torch.nn.functional.mse_loss
    state = {"pos": 0}

    def micro_step():
        (mse(W @ X, Y) / K).backward()
        state["pos"] += 1
        if state["pos"] == K:
            state["pos"] = 0
            opt.step()
            opt.zero_grad()
    micro_step.weights = lambda: W.detach().cpu().numpy()
    return micro_step


def floor_step(case, dtype, opt_kind, device) -> Callable[[], None] | None:
    """Only the two GEMMs: W @ X and R @ X.T, into preallocated outputs."""
    W, X, Y = problem(case, dtype)
    if device == "cuda":
        if torch is None or not torch.cuda.is_available():
            return None
        W, X, Y = (torch.tensor(a, device="cuda") for a in (W, X, Y))
        P, G = torch.empty_like(Y), torch.empty_like(W)
        return lambda: (torch.matmul(W, X, out=P), torch.matmul(P, X.T, out=G))
    P, G = np.empty_like(Y), np.empty_like(W)
    return lambda: (np.matmul(W, X, out=P), np.matmul(P, X.T, out=G))


SYSTEMS = {"numbagrad": numbagrad_step, "numpy": numpy_step, "torch": torch_step,
           "floor": floor_step}


# ------------------------------------------------------------------ timing
def sync_for(device: str) -> Callable[[], None]:
    if device != "cuda":
        return lambda: None

    def sync():
        ng.cuda.synchronize()
        if torch is not None and torch.cuda.is_available():
            torch.cuda.synchronize()
    return sync


def measure(fn: Callable[[], None], repeats: int, min_time: float,
            sync: Callable[[], None]) -> tuple[float, float]:
    """(best, median) seconds per call; each repeat runs whole windows."""
    for _ in range(2 * K):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(K):
        fn()
    sync()
    per_call = (time.perf_counter() - start) / K
    n = K * max(1, int(min_time / max(per_call, 1e-9) / K))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / n)
    return min(samples), statistics.median(samples)


def transient_bytes(fn: Callable[[], None], steps: int = 2 * K) -> int:
    """Most memory (traced by tracemalloc) one steady-state call needs."""
    for _ in range(2 * K):
        fn()
    worst = 0
    tracemalloc.start()
    try:
        for _ in range(steps):
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            fn()
            worst = max(worst, tracemalloc.get_traced_memory()[1] - base)
    finally:
        tracemalloc.stop()
    return worst


FIRST_STEP = """
import time
t0 = time.perf_counter()
import numpy as np
import numbagrad as ng
W = ng.param(np.ones((2, 3)))
opt = ng.optim.Adam([W], lr=1e-3, accumulate_steps=1)
with ng.grad_tape():
    loss = ng.mse_loss(W @ ng.tensor(np.ones((3, 1))), np.zeros((2, 1)))
loss.backward()
opt.step()
print(time.perf_counter() - t0)
"""


def first_step_times() -> dict[str, dict[str, float]]:
    """Import + first micro-step in fresh processes: cold, then warm cache."""
    out = {}
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=root)
        for label in ("cold", "warm"):
            start = time.perf_counter()
            run = subprocess.run([sys.executable, "-c", FIRST_STEP], env=env, check=True,
                                 capture_output=True, text=True, stdin=subprocess.DEVNULL)
            out[label] = {"process_s": time.perf_counter() - start,
                          "import_and_step_s": float(run.stdout.strip().splitlines()[-1])}
    return out


def dp_allreduce_share(ranks: int = 2) -> dict | None:
    """Run scripts/train_dp.py --bench on local MPI ranks; None if no MPI."""
    import shutil
    here = os.path.dirname(os.path.abspath(__file__))
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) \
        or shutil.which("mpiexec")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        mpiexec = None
    if mpiexec is None:
        print("data-parallel: mpi4py or mpiexec missing (pip install numbagrad[mpi] mpich)")
        return None
    threads = str(max(1, (os.cpu_count() or 1) // ranks))
    env = dict(os.environ, OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads,
               UCX_TLS="self,sm", UCX_NET_DEVICES="lo", HYDRA_IFACE="lo")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "dp.json")
        run_ = subprocess.run([mpiexec, "-n", str(ranks), sys.executable, "-m", "mpi4py",
                               os.path.join(here, "train_dp.py"), "--bench", "--json", out],
                              env=env, capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL)
        if run_.returncode != 0:
            print("data-parallel benchmark failed:\n" + run_.stderr[-2000:])
            return None
        print(run_.stdout.strip().splitlines()[-1])
        with open(out) as fh:
            result = json.load(fh)
    return {"ranks": ranks, "share": result["allreduce_share"], "threads_per_rank": threads}


# ------------------------------------------------------------------ report
def fmt_us(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e6:,.1f}"


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None else f"{a / b:.2f}x"


def run(args) -> dict:
    sync = sync_for(args.device)
    rows = []
    for case in args.cases:
        for dtype in args.dtypes:
            floor = None
            for opt_kind in args.optimizers:
                row = {"case": case, "shape": CASES[case], "dtype": dtype, "optimizer": opt_kind,
                       "k": K, "device": args.device}
                for name, make in SYSTEMS.items():
                    if name == "floor" and floor is not None:
                        row["floor"] = floor
                        continue
                    fn = make(case, np.dtype(dtype), opt_kind, args.device)
                    row[name] = None if fn is None else dict(zip(
                        ("best_s", "median_s"), measure(fn, args.repeats, args.min_time, sync)))
                    if name == "floor":
                        floor = row[name]
                    if name in ("numbagrad", "numpy") and args.device == "cpu" and fn:
                        row[name + "_bytes"] = transient_bytes(fn)
                rows.append(row)
                print_row(row, first=len(rows) == 1)
    return {"rows": rows}


COLUMNS = ("case", "dtype", "opt", "numbagrad µs", "(median)", "numpy µs", "torch µs",
           "floor µs", "ng/numpy", "ng/torch", "ng/floor", "ng B/step", "np B/step")
WIDTHS = (7, 8, 5, 13, 11, 11, 11, 11, 9, 9, 9, 10, 10)


def print_row(row: dict, first: bool) -> None:
    best = {n: (row[n] or {}).get("best_s") for n in SYSTEMS}
    cells = (row["case"], row["dtype"], row["optimizer"], fmt_us(best["numbagrad"]),
             fmt_us(row["numbagrad"]["median_s"]), fmt_us(best["numpy"]), fmt_us(best["torch"]),
             fmt_us(best["floor"]), ratio(best["numbagrad"], best["numpy"]),
             ratio(best["numbagrad"], best["torch"]), ratio(best["numbagrad"], best["floor"]),
             str(row.get("numbagrad_bytes", "n/a")), str(row.get("numpy_bytes", "n/a")))
    if first:
        print(" ".join(c.rjust(w) for c, w in zip(COLUMNS, WIDTHS)))
    print(" ".join(c.rjust(w) for c, w in zip(cells, WIDTHS)), flush=True)


def plot(result: dict, path: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not importable: no plot written")
        return False
    rows = result["rows"]
    labels = [f"{r['case']}\n{r['dtype']}\n{r['optimizer']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.9), 5))
    width = 0.2
    for i, name in enumerate(SYSTEMS):
        ys = [(r[name] or {}).get("best_s", np.nan) * 1e6 for r in rows]
        ax.bar(np.arange(len(rows)) + (i - 1.5) * width, ys, width, label=name)
    ax.set_yscale("log")
    ax.set_ylabel("µs per micro-step (best of repeats, log scale)")
    ax.set_xticks(np.arange(len(rows)), labels, fontsize=7)
    ax.set_title(f"numbagrad micro-step, device={rows[0]['device']}, accumulate_steps={K}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")
    return True


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repeats (<1 min)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"],
                        choices=["float32", "float64"])
    parser.add_argument("--optimizers", nargs="+", default=["sgd", "adam"],
                        choices=["sgd", "adam"])
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--min-time", type=float, default=None,
                        help="seconds each repeat runs at least")
    parser.add_argument("--no-first-step", action="store_true",
                        help="skip the fresh-process first-step timings")
    parser.add_argument("--no-dp", action="store_true",
                        help="skip the 2-rank MPI allreduce-share measurement")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--plot", metavar="PATH")
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (3 if args.quick else 7)
    args.min_time = args.min_time if args.min_time is not None else (
        0.02 if args.quick else 0.2)

    import platform
    threads = torch.get_num_threads() if torch is not None else "n/a"
    print(f"numbagrad {ng.__version__} | numpy {np.__version__} | torch "
          f"{torch.__version__ if torch is not None else 'not installed'} | "
          f"{platform.processor() or platform.machine()} x{os.cpu_count()} | torch threads "
          f"{threads} | repeats {args.repeats} | accumulate_steps {K}")
    result = run(args)
    if not args.no_first_step and args.device == "cpu":
        result["first_step"] = first_step_times()
        for label, t in result["first_step"].items():
            print(f"first micro-step in a fresh process, {label} Numba cache: "
                  f"import+step {t['import_and_step_s']:.2f} s, whole process "
                  f"{t['process_s']:.2f} s")
    if not args.no_dp and args.device == "cpu":
        result["data_parallel"] = dp_allreduce_share()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
        print(f"json written to {args.json}")
    if args.plot:
        plot(result, args.plot)
    return result


if __name__ == "__main__":
    main()
