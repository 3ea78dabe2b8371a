"""``ng.compile`` next to eager numbagrad, a hand-written NumPy loop and PyTorch.

Times one training micro-step (forward, loss, backward, Adam with
``accumulate_steps=4``) with ``scripts/bench.py``'s peers and its interleaved
best-of-rounds timing, then the compile time of a new signature in fresh
processes, with a cold and a warm cache folder:

    python scripts/compile_demo.py [--rounds 7] [--min-time 0.05] [--no-torch]

Cases: the benchmark's tiny linear step (W (2, 3), x (3, 1)), the same with
x (3, 4), and the MLP 64-64-10 on a batch of 32 (ReLU, cross-entropy), float32.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, ROOT)

import bench
import numpy as np

import numbagrad as ng
from numbagrad.compile import compile as ng_compile

if not callable(getattr(ng, "compile", None)):   # until numbagrad/__init__.py exports it
    ng.compile = ng_compile

bench.CASES.setdefault("tiny-b4", {"kind": "linear", "shape": (2, 3, 4)})
CASES = ["tiny", "tiny-b4", "mlp-small"]

COMPILE_ONCE = textwrap.dedent("""
    import time
    t0 = time.perf_counter()
    import numpy as np
    import numbagrad as ng
    from numbagrad.compile import compile
    t1 = time.perf_counter()
    rng = np.random.default_rng(0)
    model = ng.nn.Sequential(ng.nn.Linear(64, 64, dtype=np.float32, rng=rng), ng.nn.ReLU(),
                             ng.nn.Linear(64, 10, dtype=np.float32, rng=rng))
    opt = ng.optim.Adam(model.parameters(), lr=1e-3, accumulate_steps=4)
    step = compile(lambda x, labels: ng.cross_entropy(model(x), labels), optimizer=opt)
    x = ng.tensor(rng.normal(size=(32, 64)).astype(np.float32))
    labels = rng.integers(0, 10, 32)
    t2 = time.perf_counter()
    step(x, labels)
    t3 = time.perf_counter()
    s = step.stats[-1]
    print(f"{t1 - t0:.3f} {t3 - t2:.3f} {s['jit_s']:.3f} {s['cache']}")
""")


def compile_times(runs: int = 2) -> list[tuple[str, list[str]]]:
    """First call with a new signature in fresh processes: cold then warm cache."""
    out = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBAGRAD_CACHE_DIR=cache, PYTHONPATH=ROOT)
        for label in ["cold"] + ["warm"] * (runs - 1):
            done = subprocess.run([sys.executable, "-c", COMPILE_ONCE], env=env, check=True,
                                  capture_output=True, text=True)
            out.append((label, done.stdout.split()))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-time", type=float, default=0.05)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--no-compile-times", action="store_true")
    parser.add_argument("--threads", type=int, default=1,
                        help="pin every library's thread pools (0: leave them)")
    args = parser.parse_args(argv)
    if args.threads:
        bench.limit_threads(args.threads)
    peers = {"compiled": bench.compiled_step, "eager": bench.numbagrad_step,
             "numpy": bench.numpy_step}
    if not args.no_torch and importlib.util.find_spec("torch") is not None:
        peers["torch"] = bench.torch_step
    print(f"micro-step, float32, Adam k={bench.K}; best of {args.rounds} interleaved rounds "
          f"(µs per step); ratios of best times")
    for case in CASES:
        fns = {name: make(case, np.dtype(np.float32), "adam", "cpu")
               for name, make in peers.items()}
        stats = bench.interleaved(fns, args.rounds, args.min_time, lambda: None)
        best = {name: s["best_s"] * 1e6 for name, s in stats.items()}
        cells = "  ".join(f"{name} {best[name]:7.2f}" for name in fns)
        ratios = "  ".join(f"compiled/{name} {best['compiled'] / best[name]:.3f}"
                           for name in fns if name != "compiled")
        print(f"{bench.short_size(case):>12}: {cells}\n{'':>14}{ratios}")
        twins = [make(case, np.dtype(np.float32), "adam", "cpu")
                 for make in (bench.compiled_step, bench.numbagrad_step)]
        for fn in twins:
            for _ in range(5 * bench.K + 1):
                fn()
        same = all(np.array_equal(a, b) for a, b in zip(*(fn.weights() for fn in twins)))
        print(f"{'':>14}weights == eager's after {5 * bench.K + 1} steps: {same}")
    if not args.no_compile_times:
        print("new signature (MLP 64-64-10), fresh process: import s, first call s, "
              "jit s, Numba cache")
        for label, fields in compile_times():
            print(f"  {label}: {' '.join(fields)}")


if __name__ == "__main__":
    main()
