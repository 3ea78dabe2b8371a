"""Times one ``ng.conv2d`` layer's forward and backward (eager, on the tape,
the input's gradient too unless it is the image), by the direct kernels and
by im2col + GEMM, interleaved block by block, to choose the direct path's
rule (``ops/conv.py``'s ``DIRECT_MAX_TAPS``). Prints the best block's µs per
step of each and direct / im2col. Run from the repository root::

    python scripts/bench_conv.py                       # the cnn case's layers and a C_in sweep
    python scripts/bench_conv.py --shapes 64,3,32,32,16 --blocks 9
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import numbagrad as ng  # noqa: E402
from numbagrad.ops import conv  # noqa: E402

# (batch, C_in, side, C_out): the cnn benchmark's two layers, then C_in swept at 8x8
SHAPES = [(64, 1, 8, 16), (64, 16, 4, 32), (64, 2, 8, 16), (64, 3, 8, 16), (64, 4, 8, 16),
          (64, 8, 8, 16)]


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


def best_us(step, taps: int, reps: int) -> float:
    conv.DIRECT_MAX_TAPS = taps
    step()
    start = time.perf_counter()
    for _ in range(reps):
        step()
    return (time.perf_counter() - start) / reps * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=None,
                        help="batch,C_in,side,C_out each (default: the cnn layers, a C_in sweep)")
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    args = parser.parse_args(argv)
    shapes = SHAPES if args.shapes is None else [tuple(map(int, s.split(","))) for s in args.shapes]
    saved = conv.DIRECT_MAX_TAPS
    print(f"{'batch,C_in,side,C_out':>22} {'taps':>5} {'direct µs':>10} {'im2col µs':>10} "
          f"{'ratio':>6}")
    try:
        for shape in shapes:
            step = layer_step(*shape, np.dtype(args.dtype))
            direct, im2col = [], []
            for _ in range(args.blocks):
                direct.append(best_us(step, sys.maxsize, args.reps))
                im2col.append(best_us(step, 0, args.reps))
            d, i = min(direct), min(im2col)
            print(f"{','.join(map(str, shape)):>22} {shape[1] * 9:5d} {d:10.1f} {i:10.1f} "
                  f"{d / i:6.2f}")
    finally:
        conv.DIRECT_MAX_TAPS = saved


if __name__ == "__main__":
    main()
