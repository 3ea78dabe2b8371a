"""Does importing numbagrad change other libraries' speed? (issue 21)

Each variant runs in a fresh process, the variants alternated round by
round; each process times a warm micro-step (scripts/bench_peers.py) and
reports its best and median. Variants:

- ``torch``: PyTorch's 64-64-10 MLP step alone;
- ``torch+ng``: the same after ``import numbagrad``;
- ``torch+0.2``: the same with ``OMP_WAIT_POLICY=PASSIVE``, what importing
  numbagrad 0.2 set for the whole process;
- ``ng``: numbagrad's 784-1024-1024-10 MLP step (its threaded kernels load
  the OpenMP runtime at its default policy, as ``import torch`` would);
- ``ng-0.2``: the same with ``OMP_WAIT_POLICY=PASSIVE`` set beforehand (0.2).

    python scripts/import_effect.py [--rounds 5] [--variants ng ng-0.2 ...]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import json, statistics, sys
sys.path.insert(0, sys.argv[1])
variant = sys.argv[2]
if variant == "torch+ng":
    import numbagrad  # noqa: F401
import numpy as np
import bench_peers as bp
case = "mlp-small" if variant.startswith("torch") else "mlp-large"
maker = bp.torch_step if variant.startswith("torch") else bp.numbagrad_step
fn = maker(case, np.dtype("float32"), "adam", "cpu")
calls, _ = bp.calibrate(fn, 0.2, 2)
times = [bp.run_calls(fn, calls) for _ in range(7)]
print(json.dumps({"best": min(times), "median": statistics.median(times)}))
"""
VARIANTS = {"torch": {}, "torch+ng": {}, "torch+0.2": {"OMP_WAIT_POLICY": "PASSIVE"},
            "ng": {}, "ng-0.2": {"OMP_WAIT_POLICY": "PASSIVE"}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    args = parser.parse_args(argv)
    base = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    results: dict[str, list[dict]] = {v: [] for v in args.variants}
    names = list(args.variants)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            run = subprocess.run([sys.executable, "-c", CHILD, HERE, name],
                                 env=dict(base, **VARIANTS[name]), capture_output=True,
                                 text=True, check=False, stdin=subprocess.DEVNULL)
            if run.returncode != 0:
                raise RuntimeError(f"variant {name} failed:\n{run.stderr[-3000:]}")
            results[name].append(json.loads(run.stdout.strip().splitlines()[-1]))
    print(f"µs per micro-step, float32 Adam k=4; {args.rounds} fresh processes per variant, "
          f"alternated; best of the processes' best, and the median of their medians")
    out = {}
    for name, runs in results.items():
        best = min(r["best"] for r in runs) * 1e6
        med = statistics.median(r["median"] for r in runs) * 1e6
        out[name] = {"best_us": best, "median_us": med}
        print(f"  {name:<10} best {best:9.1f}   median {med:9.1f}")
    return out


if __name__ == "__main__":
    main()
