"""Elementwise codes in the CPU's shared loop against codes with a loop of their own.

    python scripts/bench_elementwise.py              # 1M elements, one thread
    python scripts/bench_elementwise.py --compile    # cold-cache compile of the unary kernels

The records of ``kernels/codes.py`` with ``own_loop=False`` run in one loop
per kernel that picks the formula per element; the others have a loop
specialised to them. This times one op of each kind next to NumPy and
PyTorch (interleaved samples, medians), so a record's flag can be chosen
from numbers: a libm-bound code costs about the same either way, a cheap one
loses its vectorised loop. ``--compile`` times the first call of the unary
kernels in a fresh process with an empty Numba cache (what each record's
own loop costs).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

COMPILE = """
import time, numpy as np
from numbagrad.kernels.cpu import elementwise as e
for dt in (np.float64, np.float32):
    x = np.ones((4, 5), dt); out = np.empty_like(x)
    for name in ("unary", "unary_backward", "unary_mt", "unary_backward_mt"):
        t = time.perf_counter()
        f = getattr(e, name)
        f(0, x, x, x, out, 0.0, 0.0) if "backward" in name else f(0, x, out, 0.0, 1.0, 0.0)
        print(np.dtype(dt).name, name, round(time.perf_counter() - t, 1))
"""


def _median_ms(fn, samples: int) -> float:
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        fn()
        fn()
        times.append((time.perf_counter() - start) / 2)
    return statistics.median(times) * 1e3


def run(size: int, samples: int) -> None:
    import numpy as np
    import torch
    import numbagrad as ng
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    for dt in (np.float32, np.float64):
        x = rng.normal(size=size).astype(dt)
        t, tt = ng.tensor(x), torch.tensor(x)
        cases = [("sin (shared)", lambda: ng.sin(t), lambda: np.sin(x), lambda: torch.sin(tt)),
                 ("tanh (own loop)", lambda: ng.tanh(t), lambda: np.tanh(x),
                  lambda: torch.tanh(tt)),
                 ("floor (shared, cheap)", lambda: ng.floor(t), lambda: np.floor(x),
                  lambda: torch.floor(tt)),
                 ("abs (own loop, cheap)", lambda: ng.abs(t), lambda: np.abs(x),
                  lambda: torch.abs(tt)),
                 ("atan2 (shared)", lambda: ng.atan2(t, t), lambda: np.arctan2(x, x),
                  lambda: torch.atan2(tt, tt)),
                 ("mul (own loop)", lambda: ng.mul(t, t), lambda: np.multiply(x, x),
                  lambda: torch.mul(tt, tt))]
        for name, *fns in cases:
            for fn in fns:
                fn()
            rows = [[] for _ in fns]
            for _ in range(samples):       # interleaved: one sample of each in turn
                for k, fn in enumerate(fns):
                    rows[k].append(_median_ms(fn, 1))
            ng_ms, np_ms, torch_ms = (statistics.median(r) for r in rows)
            print(f"{np.dtype(dt).name:8s} {name:22s} numbagrad {ng_ms:7.2f} ms  "
                  f"numpy {np_ms:7.2f} ms  torch {torch_ms:7.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--compile", action="store_true",
                        help="time the unary kernels' compile from an empty cache instead")
    args = parser.parse_args()
    if args.compile:
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, NUMBA_CACHE_DIR=cache)
            subprocess.run([sys.executable, "-c", COMPILE], env=env, check=True)
        return
    if os.environ.get("NUMBA_NUM_THREADS") != "1":   # one thread, set before Numba loads
        env = dict(os.environ, NUMBA_NUM_THREADS="1")
        sys.exit(subprocess.run([sys.executable, *sys.argv], env=env).returncode)
    run(args.size, args.samples)


if __name__ == "__main__":
    main()
