"""The overhead of ``ng.custom_op`` against the built-in op doing the same.

    python scripts/bench_custom_op.py                 # (8, 16) float32, 15 rounds
    python scripts/bench_custom_op.py --shape 256 256 --repeats 25

Each row times a trivial op written as a custom op (an @njit ``relu``, an
@njit ``scale``) next to the built-in (``ng.relu``, ``x * 0.5``):
an eager forward call, an eager training call (forward on the tape and its
backward) and an ``ng.compile`` step (forward, backward, SGD update). The
peers run interleaved (``bench_timing.interleaved``: A B, B A, ...), and the
ratio custom / built-in is given per round, as its median and quartiles.
The issue's bar: eager <= 1.2x, compiled about 1x.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_timing import interleaved  # noqa: E402


def _ops():
    """The custom ops (relu, scale) and their built-in twins."""
    from numba import njit

    import numbagrad as ng

    @njit
    def relu_forward(out, x):
        for i in range(x.size):
            v = x.flat[i]
            out.flat[i] = v if v > 0.0 else 0.0

    @njit
    def relu_backward(gout, out, x, gx):
        for i in range(x.size):
            if x.flat[i] > 0.0:
                gx.flat[i] += gout.flat[i]

    @njit
    def scale_forward(out, x, s):
        for i in range(x.size):
            out.flat[i] = s * x.flat[i]

    @njit
    def scale_backward(gout, out, x, s, gx):
        for i in range(x.size):
            gx.flat[i] += s * gout.flat[i]

    relu = ng.custom_op("relu", relu_forward, relu_backward)
    scale = ng.custom_op("scale", scale_forward, scale_backward)
    return {"relu": (relu, ng.relu), "scale": (lambda x: scale(x, 0.5), lambda x: x * 0.5)}


def _eager_forward(op):
    return lambda x, p: lambda: op(x)


def _eager_train(op):
    import numbagrad as ng

    def make(x, p):
        def run():
            with ng.grad_tape():
                op(p).sum().backward()
        return run
    return make


def _compiled(op):
    import numbagrad as ng

    def make(x, p):
        step = ng.compile(lambda x: op(p * x).sum(), optimizer=ng.optim.SGD([p], lr=1e-3))
        return lambda: step(x)
    return make


MODES = {"eager forward": _eager_forward, "eager train": _eager_train, "compiled": _compiled}


def measure(shape: tuple, repeats: int, min_time: float) -> list[dict]:
    """One row per (op, mode): the per-round ratios' median and quartiles."""
    import numbagrad as ng
    rng = np.random.default_rng(0)
    data = (rng.normal(size=shape) + 0.1).astype(np.float32)
    rows = []
    for name, (custom, builtin) in _ops().items():
        for mode, maker in MODES.items():
            peers = {}
            for who, op in (("custom", custom), ("built-in", builtin)):
                x, p = ng.tensor(data), ng.param(data)
                peers[who] = maker(op)(x, p)
            stats = interleaved(peers, repeats, min_time)
            ratios = np.array(stats["custom"]["samples_s"]) / np.array(
                stats["built-in"]["samples_s"])
            q1, med, q3 = np.percentile(ratios, [25, 50, 75])
            rows.append({"op": name, "mode": mode, "custom_us": stats["custom"]["median_s"] * 1e6,
                         "builtin_us": stats["built-in"]["median_s"] * 1e6,
                         "ratio": float(med), "q1": float(q1), "q3": float(q3)})
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--min-time", type=float, default=0.05,
                        help="seconds a sample runs for at least")
    args = parser.parse_args(argv)
    rows = measure(tuple(args.shape), args.repeats, args.min_time)
    print(f"custom op / built-in, float32 {tuple(args.shape)}, {args.repeats} interleaved "
          f"rounds (ratio: median [quartiles] of the per-round ratios)")
    for r in rows:
        print(f"  {r['op']:6s} {r['mode']:14s} custom {r['custom_us']:8.2f} us  built-in "
              f"{r['builtin_us']:8.2f} us  ratio {r['ratio']:.3f} [{r['q1']:.3f}, "
              f"{r['q3']:.3f}]")
    return rows


if __name__ == "__main__":
    main()
