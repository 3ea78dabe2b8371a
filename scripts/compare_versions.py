"""Time numbagrad's eager and compiled micro-steps in two checkouts, interleaved.

    python scripts/compare_versions.py OLD_TREE NEW_TREE [--rounds 4]

Each round runs one fresh process per tree (alternating which goes first),
and each process times the bench cases' numbagrad steps (``bench_peers``'s
own builders, float32) in that tree, best of many short blocks. The report
gives the best and median over rounds and new/old: how a change moved the
per-step cost, as the issues ask ("not slower than 0.2 by more than 5%").
``--child`` times the tree it runs in and prints JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROWS = [("tiny", "sgd", 200, 40), ("tiny", "adam", 200, 40), ("small", "adam", 100, 20),
        ("mlp-small", "adam", 100, 20)]


def _best(fn, blocks: int, n: int) -> float:
    for _ in range(max(20, n)):
        fn()
    best = float("inf")
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def child(rows: list) -> dict:
    """µs per micro-step of each row in the tree on ``sys.path`` (cwd)."""
    sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
    import numpy as np
    import bench_peers as bp
    out = {}
    for case, opt, blocks, n in rows:
        for kind, make in (("eager", bp.numbagrad_step), ("compiled", bp.compiled_step)):
            out[f"{case}/{opt}/{kind}"] = _best(make(case, np.dtype("float32"), opt, "cpu"),
                                                blocks, n)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", nargs="?")
    parser.add_argument("new", nargs="?")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="one short row (a smoke test)")
    args = parser.parse_args()
    rows = [("tiny", "sgd", 5, 5)] if args.quick else ROWS
    if args.child:
        print(json.dumps(child(rows)))
        return
    if not (args.old and args.new):
        parser.error("give the two checkouts to compare")
    trees = [os.path.abspath(args.old), os.path.abspath(args.new)]
    results: list[list] = [[], []]
    for r in range(args.rounds):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            cmd = [sys.executable, os.path.abspath(__file__), "--child"] + \
                (["--quick"] if args.quick else [])
            done = subprocess.run(cmd, cwd=trees[i], capture_output=True, text=True,
                                  check=True, env=dict(os.environ, PYTHONPATH=trees[i]))
            results[i].append(json.loads(done.stdout.strip().splitlines()[-1]))
    old, new = results
    print(f"{'row':26s} {'old best/med µs':>18s} {'new best/med µs':>18s}  new/old best, med")
    for key in old[0]:
        a, b = sorted(d[key] for d in old), sorted(d[key] for d in new)
        ma, mb = a[len(a) // 2], b[len(b) // 2]
        print(f"{key:26s} {f'{a[0]:.2f}/{ma:.2f}':>18s} {f'{b[0]:.2f}/{mb:.2f}':>18s}  "
              f"{b[0] / a[0]:.3f}, {mb / ma:.3f}")


if __name__ == "__main__":
    main()
