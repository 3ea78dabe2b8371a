"""Times each CPU kernel's serial variant against its threaded twin, to choose
the threads threshold (``NUMBAGRAD_PARALLEL_MIN``, ``kernels/cpu/_threads.py``).

For 2**e elements it prints serial/threaded ns per element and, for the op
kernels, threaded time / serial time: the best of ``--blocks`` medians, the
two variants interleaved block by block. The op kernels (the ``_mt`` twins
the op layer picks) run on 2-D operands of 256 columns (cross-entropy: 64
classes); ``--optim`` times the optimizer kernels (Adam, SGD, sumsq) on one
flat segment instead. Run it on a quiet machine, from the repository root::

    python scripts/time_threads.py                    # op kernels, 2**12..2**20
    python scripts/time_threads.py --optim            # optimizer kernels, 2**12..2**22
    python scripts/time_threads.py --exponents 14 17 --dtypes float32 --only relu add
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numba  # noqa: E402
import numpy as np  # noqa: E402

from numbagrad.kernels import cpu as k  # noqa: E402
from numbagrad.kernels import codes as S  # noqa: E402
from numbagrad.kernels.cpu import optim  # noqa: E402


def op_cases(dtype, n: int) -> dict[str, tuple[str, tuple]]:
    """name -> (kernel name, arguments) for every op kernel with an ``_mt`` twin."""
    f = dtype
    rng = np.random.default_rng(0)
    rows, cols = max(1, n // 256), 256
    x, y, g = (rng.normal(size=(rows, cols)).astype(dtype) for _ in range(3))
    o, d = np.empty_like(x), np.empty_like(x)
    bias, colsum, one = x[:1].copy(), np.empty((1, cols), dtype), np.empty((1, 1), dtype)
    loss = np.zeros((), dtype)
    logits = rng.normal(size=(max(1, n // 64), 64)).astype(dtype)
    labels = rng.integers(0, 64, size=logits.shape[0])
    ce_grad = np.empty_like(logits)
    return {
        "relu": ("unary", (S.RELU, x, o, f(0), f(1), f(0))),
        "tanh": ("unary", (S.TANH, x, o, f(0), f(1), f(0))),
        "relu'": ("unary_backward", (S.RELU, x, o, g, d, 1.0, f(0))),
        "add": ("binary", (S.ADD, x, y, o)),
        "add_bias": ("binary", (S.ADD, x, bias, o)),
        "mul'": ("binary_backward", (S.MUL, x, y, g, d, 0.0, True, o, 0.0, True)),
        "colsum": ("sum_to", (x, colsum, 1.0, 1.0)),
        "sum": ("sum_to", (x, one, f(1), f(0))),
        "softmax": ("softmax", (x, o, 1, True)),
        "softmax'": ("softmax_backward", (o, g, d, 0.0, 1, True)),
        "mse": ("mse", (x, y, loss, o, 1.0 / n)),
        "bce": ("pointwise_loss", (S.BCE_LOGITS, x, y, loss, o, 1.0 / n)),
        "xent": ("cross_entropy", (logits, labels, loss, ce_grad, 0.1)),
        "axpby": ("axpby", (1.0, x, 1.0, d)),
        "scaled_add": ("scaled_add", (loss, x, 1.0, d)),
    }


def optim_cases(dtype, n: int) -> dict[str, tuple[Callable, Callable, tuple]]:
    """name -> (serial, threaded, arguments) for the optimizer kernels."""
    f = dtype
    rng = np.random.default_rng(0)
    w, g, m = (rng.normal(size=n).astype(dtype) for _ in range(3))
    v = np.abs(rng.normal(size=n)).astype(dtype)
    seg, live = np.array([0, n], np.int64), np.ones(1, np.uint8)
    steps, out = np.zeros(1, np.int64), np.zeros(1)
    adam = (w, g, m, v, seg, live, steps, steps.copy(), 1e-3, 0.9, 0.999, f(0.1),
            f(0.999), f(0.001), f(1e-8), f(0.5), f(1.0))
    sgd = (w, g, v, seg, live, f(1e-3), f(0.9), f(0.5), f(0.0))
    return {"adam": (optim._adam_serial, optim._adam_parallel, adam),
            "sgd": (optim._sgd_serial, optim._sgd_parallel, sgd),
            "sumsq": (optim._sumsq_serial, optim._sumsq_parallel, (g, out))}


def ns_per_element(fn: Callable, args: tuple, n: int, reps: int) -> float:
    """The median of ``reps`` calls, in ns per element."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / n * 1e9


def best_pair(pair: tuple[Callable, Callable], args: tuple, n: int, blocks: int,
              work: int) -> list[float]:
    """Serial and threaded ns per element, the best of ``blocks`` interleaved medians."""
    for fn in pair:
        fn(*args)                                   # compile (or load from the cache)
    reps = max(7, min(301, work // n))
    best = [float("inf"), float("inf")]
    for _ in range(blocks):
        for i, fn in enumerate(pair):
            best[i] = min(best[i], ns_per_element(fn, args, n, reps))
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--optim", action="store_true", help="time the optimizer kernels")
    parser.add_argument("--exponents", type=int, nargs=2, metavar=("LO", "HI"),
                        help="time 2**LO .. 2**HI elements (default 12 20; --optim 12 22)")
    parser.add_argument("--blocks", type=int, help="interleaved blocks (default 5; --optim 3)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"],
                        choices=["float32", "float64"])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these cases")
    args = parser.parse_args(argv)
    lo, hi = args.exponents or (12, 22 if args.optim else 20)
    blocks = args.blocks or (3 if args.optim else 5)
    if lo < 8 or hi < lo or blocks < 1:
        parser.error(f"need 8 <= LO <= HI and --blocks >= 1, got {lo} {hi}, {blocks}")
    print(f"{numba.get_num_threads()} threads; serial/threaded ns per element "
          f"(threaded time / serial time)")
    for dtype in (np.dtype(name).type for name in args.dtypes):
        for e in range(lo, hi + 1):
            n = 1 << e
            if args.optim:
                cases = {name: ((s, t), a) for name, (s, t, a) in optim_cases(dtype, n).items()}
            else:
                cases = {name: ((getattr(k, kern), getattr(k, kern + "_mt")), a)
                         for name, (kern, a) in op_cases(dtype, n).items()}
            row = []
            for name, (pair, call_args) in cases.items():
                if args.only and name not in args.only:
                    continue
                best = best_pair(pair, call_args, n, blocks, 4_000_000 if args.optim
                                 else 2_000_000)
                row.append(f"{name} {best[0]:.2f}/{best[1]:.2f} ({best[1] / best[0]:.2f})")
            print(f"{np.dtype(dtype).name} 2^{e}: " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
