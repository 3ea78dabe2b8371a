"""``bench.py --scaling``: how a micro-step's time and memory grow with its size.

Each sweep of ``bench_cases.SWEEPS`` (the MLP and the GPT step across batch
sizes 1 to 512 and widths, causal attention across T = 64 to 4,096) is timed
point by point for numbagrad eager, numbagrad compiled and PyTorch eager
(``SCALING_PEERS``), interleaved as a row of the main table, each peer in its
process; beside each time the peak memory of a window (``bench_peers.
peak_memory``). Per sweep and peer the log-log slope of the best time against
the size: over all points (a least-squares fit) and between the two largest
(where fixed per-call costs matter least): 1 is linear growth, 2 quadratic.
"""
from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
from bench_cases import CASES, K, MLP_ROW, SWEEPS, available_peers
from bench_report import fmt_us
from bench_timing import Worker, interleaved, local_peers, remote_peers

SCALING_PEERS = ("numbagrad", "numbagrad compiled", "torch")


def slope(sizes: list[float], times: list[float]) -> float | None:
    """The least-squares slope of log(time) against log(size); None under two points."""
    if len(sizes) < 2:
        return None
    return float(np.polyfit(np.log(sizes), np.log(times), 1)[0])


def slopes(points: list[dict], peers: list[str]) -> dict[str, dict[str, float | None]]:
    """Per peer: ``fit`` (all points) and ``last`` (the two largest) slopes."""
    out = {}
    for name in peers:
        got = [(p["size"], p[name]["best_s"]) for p in points if p.get(name)]
        sizes, times = [s for s, _ in got], [t for _, t in got]
        out[name] = {"fit": slope(sizes, times), "last": slope(sizes[-2:], times[-2:])}
    return out


def _mb(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2 ** 20:.1f}"


def measure_point(case: str, size: int, args: argparse.Namespace, peers: list[str],
                  workers: dict[str, Worker] | None, makers: dict, single) -> dict:
    """One point of a sweep: each peer's statistics and memory."""
    dtype, opt_kind = MLP_ROW
    if workers is None:
        handles, notes = local_peers(case, dtype, opt_kind, args.device, peers, makers, single)
    else:
        handles, notes = remote_peers(case, dtype, opt_kind, args.device, peers, workers)
    handles.pop("floor 1 thread", None)
    stats = interleaved(handles, args.repeats, args.min_time)
    point = {"case": case, "size": size, "dtype": dtype, "optimizer": opt_kind}
    for name in peers:
        point[name] = None if name not in stats else {**stats[name],
                                                      **handles[name].memory()}
    if notes:
        point["errors"] = notes
    return point


def print_point(point: dict, peers: list[str]) -> None:
    cells = [f"{point['size']:>6}"]
    for name in peers:
        s = point.get(name)
        cells.append(f"{'n/a':>26}" if s is None else
                     f"{fmt_us(s['best_s']):>10} {_mb(s['peak_rss_bytes']):>7} "
                     f"{_mb(s['window_rss_bytes']):>7}")
    print(" ".join(cells), flush=True)
    for name, err in point.get("errors", {}).items():
        print(f"    ({name} could not run: {err.strip().splitlines()[-1]})")


def run_scaling(args: argparse.Namespace, peers: list[str], workers: dict[str, Worker] | None,
                makers: dict, single, sweeps: dict[str, dict] | None = None) -> dict:
    """Time every sweep (default ``SWEEPS``); returns what ``--json`` writes."""
    sweeps = SWEEPS if sweeps is None else sweeps
    print(f"scaling: {', '.join(peers)}; {MLP_ROW[0]} {MLP_ROW[1]} (the GPT AdamW), k={K}, "
          f"{args.repeats} interleaved rounds of >= {args.min_time * 1e3:g} ms a point")
    print("per peer: best µs per micro-step, the process's peak resident MB over a window "
          "(everything it holds: libraries, weights, both numbagrad peers), and the MB "
          "that window added above what was resident before it")
    result: dict = {"sweeps": {}}
    for sweep, spec in sweeps.items():
        first = CASES[spec["cases"][0][0]]
        print(f"\n{sweep} ({spec['axis']}; e.g. {_case_words(first)})")
        print(f"{spec['axis'][:6]:>6} " + " ".join(f"{n[:26]:>26}" for n in peers))
        print(f"{'':>6} " + " ".join(f"{'µs':>10} {'peak MB':>7} {'+win MB':>7}" for _ in peers))
        start = time.perf_counter()
        points = []
        for case, size in spec["cases"]:
            points.append(measure_point(case, size, args, peers, workers, makers, single))
            print_point(points[-1], peers)
        fits = slopes(points, peers)
        print("slope " + " ".join(f"{_slope_cell(fits[n]):>26}" for n in peers))
        result["sweeps"][sweep] = {"axis": spec["axis"], "points": points, "slopes": fits,
                                   "seconds": time.perf_counter() - start}
    return result


def _slope_cell(s: dict) -> str:
    def f(v):
        return "n/a" if v is None or math.isnan(v) else f"{v:.2f}"
    return f"fit {f(s['fit'])}, last {f(s['last'])}"


def _case_words(c: dict) -> str:
    if c["kind"] == "mlp":
        return f"MLP {'-'.join(map(str, c['layers']))} batch {c['batch']}"
    if c["kind"] == "gpt":
        return (f"GPT {c['n_layer']} layers x {c['n_head']} heads x {c['n_embd']}, batch "
                f"{c['batch']} x {c['block']}")
    return f"attention (B, H, T, d) = {c['shape']}"


def scaling_peers(torch_compile: bool = False) -> list[str]:
    """``SCALING_PEERS`` that are installed."""
    have = available_peers(torch_compile=torch_compile)
    return [p for p in SCALING_PEERS if p in have]


def write_json(result: dict, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"json written to {path}")
