"""ng.compile's elementwise fusion, timed: a functional residual MLP compiled
three ways, interleaved in one process.

    python scripts/bench_fusion.py                      # width 1024, batch 512
    python scripts/bench_fusion.py --width 256 --batch 64

The model is ``h = h + tanh(h @ W + b) * 0.5`` three times, then an MSE loss,
float32 Adam: each layer's bias add, tanh, scale and residual add (and
their gradients) are a chain of elementwise kernels after a GEMM. The three
compiled steps are ``fuse_elementwise=False`` (every kernel as recorded),
fused chains with the GEMM folding off (``compile.fusion.FOLD``), and the
default (a chain after a threaded GEMM runs in its blocks). All three give
the same bits; the table gives each one's median step time, its quartiles
and its ratio to the unfused step (rounds alternate between the three).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

import numbagrad as ng  # noqa: E402
from numbagrad.compile import fusion  # noqa: E402

VARIANTS = (("unfused", False, False), ("fused", True, False), ("fused+fold", True, True))


def _model(width: int, layers: int) -> tuple:
    rng = np.random.default_rng(0)
    params = []
    for _ in range(layers):
        params += [ng.param((rng.normal(size=(width, width)) / width ** 0.5).astype(np.float32)),
                   ng.param((rng.normal(size=width) * 0.1).astype(np.float32))]

    def loss_fn(x, y):
        h = x
        for W, b in zip(params[::2], params[1::2]):
            h = h + ng.tanh(h @ W + b) * 0.5
        return ng.mse_loss(h, y)
    return params, loss_fn, ng.optim.Adam(params, lr=1e-4)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=10, help="steps per timed sample")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(1)
    x = ng.tensor(rng.normal(size=(args.batch, args.width)).astype(np.float32))
    y = ng.tensor(rng.normal(size=(args.batch, args.width)).astype(np.float32))
    cache = tempfile.mkdtemp(prefix="ng-bench-fusion-")
    steps, params, folded = {}, {}, {}
    try:
        for name, fuse, fold in VARIANTS:
            fusion.FOLD = fold
            p, fn, opt = _model(args.width, args.layers)
            steps[name] = ng.compile(fn, optimizer=opt, cache_dir=cache, fuse_elementwise=fuse)
            steps[name](x, y)
            folded[name] = sum(c[0].startswith(("gemm", "linear"))
                               for c in steps[name].stats[-1]["fused"])
            params[name] = p
    finally:
        fusion.FOLD = True
    for _ in range(16):    # past the compiled steps' early verifying calls
        for step in steps.values():
            step(x, y)
    same = all(a.numpy().tobytes() == b.numpy().tobytes()
               for name in steps for a, b in zip(params[name], params["unfused"]))
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(args.calls):
                step(x, y)
            times[name].append((time.perf_counter() - start) / args.calls * 1e3)
    base = statistics.median(times["unfused"])
    rows = []
    print(f"width {args.width}, batch {args.batch}, {args.layers} layers, float32 Adam; "
          f"the same bits in all three: {same}")
    print(f"{'step':12s} {'median ms':>10s} {'q25-q75 ms':>16s} {'/ unfused':>10s} "
          f"{'folded loops':>13s}")
    for name, values in times.items():
        q = statistics.quantiles(values, n=4)
        med = statistics.median(values)
        rows.append({"step": name, "ms": med, "q25": q[0], "q75": q[2], "ratio": med / base,
                     "folded": folded[name], "same_bits": same})
        print(f"{name:12s} {med:10.3f} {q[0]:7.3f}-{q[2]:<8.3f} {med / base:10.3f} "
              f"{folded[name]:13d}")
    return rows


if __name__ == "__main__":
    main()
