"""Activation checkpointing on the GPT training step: time and peak memory.

    python scripts/bench_checkpoint.py                 # 8 layers, eager steps
    python scripts/bench_checkpoint.py --n-layer 4 --steps 5 --compile

Runs ``scripts/train_gpt.py``'s micro-step (forward, backward, AdamW update;
nanoGPT's CPU config: batch 12, block 64, 128 wide, 4 heads) with and without
``--checkpoint-blocks``, each measurement in a process of its own:

* time: the median of ``--steps`` steps after two warm-up steps, buffer pool on
  (as training runs), in ``--rounds`` processes per variant run alternately
  (the fastest median counts: on a shared machine other jobs only slow a run);
* memory: ``tracemalloc`` over one step after the warm-up, with the buffer
  pool off (``NUMBAGRAD_POOL_BYTES=0``) so every array the step makes is a
  fresh allocation: the step's peak is the most bytes it held at once above
  what it started with (the model, the optimizer's state, the gradients).

Prints each run and the ratios checked / unchecked. Under ``--compile``
a step's buffers live in one arena for its whole run, so checkpointing there
costs time and saves no memory: the memory row is eager's in any case.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import tracemalloc

HERE = os.path.dirname(os.path.abspath(__file__))


def child(mode: str, checked: bool, n_layer: int, steps: int, compiled: bool) -> dict:
    sys.path.insert(0, HERE)
    import numpy as np
    import train_gpt

    import numbagrad as ng

    argv = ["--n-layer", str(n_layer), "--checkpoint", "", "--no-progress"]
    argv += ["--compile" if compiled and mode == "time" else "--no-compile"]
    argv += ["--checkpoint-blocks"] if checked else []
    args = train_gpt.parse(argv)
    ng.manual_seed(0)
    model, opt = train_gpt.build(args, 65)
    step = train_gpt.micro_step_fn(model, opt, args.compile)
    rng = np.random.default_rng(0)

    def batch():
        return (rng.integers(0, 65, (args.batch_size, args.block_size)),
                rng.integers(0, 65, (args.batch_size, args.block_size)))
    for _ in range(2):
        step(*batch()).item()
    if mode == "time":
        times = []
        for _ in range(steps):
            x, y = batch()
            t0 = time.perf_counter()
            step(x, y).item()
            times.append(time.perf_counter() - t0)
        return {"step_s": statistics.median(times)}
    x, y = batch()
    tracemalloc.start()
    held = tracemalloc.get_traced_memory()[0]
    step(x, y).item()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"step_peak_mb": (peak - held) / 2**20}


def run(mode: str, checked: bool, ns: argparse.Namespace) -> dict:
    env = dict(os.environ)
    if mode == "memory":
        env["NUMBAGRAD_POOL_BYTES"] = "0"
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--n-layer",
           str(ns.n_layer), "--steps", str(ns.steps)] + (["--checked"] if checked else []) \
        + (["--compile"] if ns.compile else [])
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n-layer", type=int, default=8)
    p.add_argument("--steps", type=int, default=10, help="timed steps (median)")
    p.add_argument("--rounds", type=int, default=3,
                   help="timing processes per variant, interleaved (the fastest median counts)")
    p.add_argument("--compile", action="store_true", help="time compiled steps (ng.compile)")
    p.add_argument("--child", choices=["time", "memory"], help=argparse.SUPPRESS)
    p.add_argument("--checked", action="store_true", help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.child:
        print(json.dumps(child(ns.child, ns.checked, ns.n_layer, ns.steps, ns.compile)))
        return
    res = {checked: run("memory", checked, ns) for checked in (False, True)}
    for _ in range(ns.rounds):     # interleaved: a busy spell slows both alike
        for checked in (False, True):
            t = run("time", checked, ns)["step_s"]
            res[checked]["step_s"] = min(t, res[checked].get("step_s", t))
    for checked in (False, True):
        name = "checkpointed" if checked else "unchecked"
        print(f"{name:>13}: step {res[checked]['step_s'] * 1e3:8.1f} ms "
              f"({'compiled' if ns.compile else 'eager'}), step peak "
              f"{res[checked]['step_peak_mb']:7.1f} MiB (eager, tracemalloc)")
    mem = res[True]["step_peak_mb"] / res[False]["step_peak_mb"]
    tim = res[True]["step_s"] / res[False]["step_s"]
    print(f"GPT {ns.n_layer} layers, every block checkpointed: peak memory {mem:.2f}x, "
          f"time {tim:.2f}x the unchecked step")


if __name__ == "__main__":
    main()
