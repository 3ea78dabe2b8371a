"""Threads on a busy machine (issue 35.1): numbagrad's attention and GPT steps
with the threads as shipped (the governor on) against the serial kernels
(``NUMBAGRAD_PARALLEL_MIN=0``) and the threads without the governor
(``NUMBAGRAD_THREAD_GOVERNOR=0``), first on a quiet machine, then beside
``--busy`` processes that spin on the cores.

Each variant runs in its own process (``bench_peers.py --serve numbagrad``);
their samples are interleaved round by round, so load that comes and goes
falls on both. It prints each variant's median time per step with the
spread ((q3 - q1) / median) and its ratio to serial; the issue asks default /
serial to stay under 1.10 while the cores are busy. From the repository root::

    python scripts/bench_contention.py                       # attention, gpt; 2 busy loops
    python scripts/bench_contention.py --cases attention --repeats 7 --json out.json
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from bench_cases import CASES, MLP_ROW, short_size  # noqa: E402
from bench_machine import blas_environment  # noqa: E402
from bench_timing import Remote, Worker, interleaved  # noqa: E402

# serial: no threads; default: as shipped (the governor on); ungoverned: the
# threads as the threshold says whatever the load (what the governor fixes)
VARIANTS = {"serial": {"NUMBAGRAD_PARALLEL_MIN": "0"}, "default": {},
            "ungoverned": {"NUMBAGRAD_THREAD_GOVERNOR": "0"}}


def _spin(stop: multiprocessing.synchronize.Event) -> None:
    """A busy loop: another user's job on one core."""
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def busy_loops(n: int) -> tuple[list[multiprocessing.Process], multiprocessing.Event]:
    stop = multiprocessing.Event()
    procs = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    return procs, stop


def measure(workers: dict[str, Worker], case: str, repeats: int, min_time: float,
            busy: int) -> dict[str, dict]:
    """Interleaved samples of every variant's step, beside ``busy`` spinning processes."""
    procs, stop = busy_loops(busy)
    try:
        time.sleep(1.0 if busy else 0.0)   # the governor's first windows see the load
        peers = {name: Remote(w, "numbagrad") for name, w in workers.items()}
        return interleaved(peers, repeats, min_time)
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=["attention", "gpt"],
                        choices=[c for c in CASES if CASES[c]["kind"] in ("attention", "gpt")])
    parser.add_argument("--busy", type=int, default=2, help="spinning processes (default 2)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds per sample")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args()

    env, _ = blas_environment(False)
    dtype, opt = MLP_ROW
    results: dict = {"cpus": os.cpu_count(), "busy": args.busy, "cases": {}}
    workers = {name: Worker("numbagrad", {**env, **VARIANTS[name]})
               for name in dict.fromkeys(["serial", *args.variants])}
    try:
        for case in args.cases:
            for w in workers.values():
                w.call("setup", case=case, dtype=dtype, opt=opt, device="cpu",
                       peers=["numbagrad"], stall_check=False)
            rows = {}
            for load in (0, args.busy):
                rows[f"busy={load}"] = measure(workers, case, args.repeats, args.min_time, load)
            results["cases"][case] = rows
            print(f"\n{short_size(case)} ({dtype}, {opt}), {os.cpu_count()} cores: ms per "
                  f"step ± spread, and / serial")
            print(f"  {'load':8}" + "".join(f"{name:>26}" for name in workers))
            for load, row in rows.items():
                base = row["serial"]["median_s"]
                cells = [f"{r['median_s'] * 1e3:9.2f} ±{r['spread']:5.1%} "
                         f"{r['median_s'] / base:6.2f}x" for r in (row[n] for n in workers)]
                print(f"  {load:8}" + "".join(f"{c:>26}" for c in cells))
    finally:
        for w in workers.values():
            w.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
