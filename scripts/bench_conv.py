"""Times one ``ng.conv2d`` layer's forward and backward (a 3x3, padding-1
layer on the tape, the input's gradient too unless it has one channel) by
the direct kernels and by im2col + GEMM, to choose the direct path's rule
(``ops/conv.py``'s ``DIRECT_MAX_TAPS`` and ``DIRECT_MIN_OUTPUTS``). Each
path's kernels are recorded once and each is timed on its own, the best of
``--blocks``; a path's time is their sum (what ``ng.compile`` replays, and
steadier on a busy machine than whole steps). Prints the µs of each and
direct / im2col. Run from the repository root (NUMBAGRAD_PARALLEL_MIN=0
times the serial kernels, which a busy machine's governor runs anyway)::

    python scripts/bench_conv.py                        # the cnn case's layers and a sweep
    python scripts/bench_conv.py --shapes 64,3,32,16 --blocks 15
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import numbagrad as ng  # noqa: E402
from numbagrad import kernels  # noqa: E402
from numbagrad.ops import conv  # noqa: E402

# (batch, C_in, side, C_out): the cnn benchmark's two layers, then C_in and sides swept
SHAPES = [(64, 1, 8, 16), (64, 16, 4, 32), (64, 2, 8, 16), (64, 3, 8, 16), (64, 4, 8, 16),
          (64, 1, 16, 16), (64, 3, 16, 16), (64, 8, 16, 16), (32, 3, 32, 16), (16, 1, 28, 8)]


class _Calls:
    """An observer keeping every kernel call (``kernels.observe``)."""

    def __init__(self) -> None:
        self.calls: list = []

    def kernel(self, fn, name, args) -> None:
        self.calls.append((fn, args))

    def allocated(self, array) -> None:
        pass

    def temp(self, kern, shape, dtype) -> None:
        return None

    def host_read(self) -> None:
        pass

    def host_copy(self, copy, source) -> None:
        pass


def layer_step(batch: int, cin: int, side: int, cout: int, dtype) -> callable:
    """One 3x3, padding-1 convolution's forward and backward; the input needs a
    gradient unless it has one channel (an image)."""
    rng = np.random.default_rng(0)
    x0 = rng.normal(size=(batch, cin, side, side)).astype(dtype)
    x = ng.param(x0) if cin > 1 else ng.tensor(x0)
    w = ng.param(rng.normal(size=(cout, cin, 3, 3)).astype(dtype))
    b = ng.param(rng.normal(size=cout).astype(dtype))

    def step() -> None:
        with ng.grad_tape():
            y = ng.conv2d(x, w, b, padding=1).sum()   # (the same sum on both paths)
        ng.backward(y)   # (the gradients add up in their accumulators)
    return step


def kernel_us(step, direct: bool, blocks: int, reps: int) -> float:
    """The sum of the best µs of each kernel ``step`` runs on one path."""
    saved = conv.DIRECT_MAX_TAPS, conv.DIRECT_MIN_OUTPUTS
    conv.DIRECT_MAX_TAPS, conv.DIRECT_MIN_OUTPUTS = (sys.maxsize, 0) if direct else (0, 0)
    try:
        seen = _Calls()
        with kernels.observe(seen):
            step()
    finally:
        conv.DIRECT_MAX_TAPS, conv.DIRECT_MIN_OUTPUTS = saved
    total = 0.0
    for fn, args in seen.calls:
        args = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
        fn(*args)
        best = float("inf")
        for _ in range(blocks):
            start = time.perf_counter()
            for _ in range(reps):
                fn(*args)
            best = min(best, (time.perf_counter() - start) / reps)
        total += best
    return total * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=None,
                        help="batch,C_in,side,C_out each (default: the cnn layers, a sweep)")
    parser.add_argument("--blocks", type=int, default=9)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    args = parser.parse_args(argv)
    shapes = SHAPES if args.shapes is None else [tuple(map(int, s.split(","))) for s in args.shapes]
    print(f"{'batch,C_in,side,C_out':>22} {'taps':>5} {'direct µs':>10} {'im2col µs':>10} "
          f"{'ratio':>6}")
    for shape in shapes:
        step = layer_step(*shape, np.dtype(args.dtype))
        d = kernel_us(step, True, args.blocks, args.reps)
        i = kernel_us(step, False, args.blocks, args.reps)
        print(f"{','.join(map(str, shape)):>22} {shape[1] * 9:5d} {d:10.1f} {i:10.1f} "
              f"{d / i:6.2f}")


if __name__ == "__main__":
    main()
