"""Micro-benchmark: one training micro-step, numbagrad next to its peers.

A micro-step is a forward pass, the loss, backward into the gradient
accumulator, then ``optimizer.step()`` with ``accumulate_steps=K`` (so one
call in K applies the update). The cases:

- linear: ``W @ X`` against ``Y`` with the MSE loss, SGD (momentum 0.9) or
  Adam, float32 or float64, at four sizes (``CASES``);
- MLP: 64-64-10 on a batch of 32 (digits-sized) and 784-1024-1024-10 on a
  batch of 256, ReLU, cross-entropy, Adam, float32.

Peers, all from the same weights and data, doing the same update:
numbagrad, ``numbagrad compiled`` (``ng.compile``), a hand-written NumPy
loop with preallocated buffers, PyTorch eager (on 1 and 2 threads and its
default count, the fastest kept), PyTorch with ``torch.compile``, JAX
(``jax.jit`` + ``optax.MultiSteps``) when importable, on the linear and MLP
cases tinygrad (CPU backend), HIPS autograd and mygrad when importable, and
the GEMM floor: the matrix products no micro-step can avoid, timed alone
through SciPy's BLAS, the library numbagrad's kernels call. Each row names
its fastest rival (every peer but numbagrad and the floor) and numbagrad's
ratio to it ("ng / best peer").

Each peer group runs in a process of its own (``bench_peers.py --serve``)
with its library's defaults, so no library changes another's threads or
wait policy; this process imports none of them. The peers of a row are
timed interleaved, round by round (A B C D, B C D A, ...), one process
timing at a time, each sample a whole number of accumulation windows, so a
burst of load on a shared machine hits all of them. Per peer: best, median
and spread (interquartile range / median) of the rounds; ratios are of best
times from the same rounds. A row whose spread is large, with a time below
its floor, or whose floor runs faster on one BLAS thread than on all
(threads waiting for cores that other processes hold) is marked, and the
run ends with a warning to rerun with ``--repeat`` (and ``--threads 1``,
which pins every library's thread pools). When ``OPENBLAS_CORETYPE`` forces
an older OpenBLAS kernel than this CPU's own, the run says so and drops the
variable for its children (``--keep-blas-env`` keeps it). Then: the first
micro-step in a fresh process, the allreduce share of a 2-rank window, and
the verdict on the issues' targets.

    python scripts/bench.py --quick              # the README's main job
    python scripts/bench.py --json out.json --plot out.png
    python scripts/bench.py --scaling --plot scaling.png   # time and memory vs size

This file is the command: its options, a row's measurement and the run.
The rest lives beside it, one concern a module: ``bench_cases`` (the
cases, their rows and peers), ``bench_peers`` (the peers and the process
that serves them), ``bench_timing`` (local and remote peers, the
interleaved rounds), ``bench_report`` (header, legend, table, noise marks,
verdict), ``bench_plot``, ``bench_machine`` (CPU, versions, BLAS and
threads), ``bench_sections`` (first step, allreduce share) and
``bench_scaling`` (``--scaling``'s sweeps and slopes). Their
public names are importable from here too.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# bench_peers first: it puts this checkout's numbagrad on the path.
from bench_peers import (GROUPS, PEERS, calibrate, compiled_step,  # noqa: E402,F401
                         floor_gemms, floor_step, initial_weights, numbagrad_step, numpy_step,
                         one_blas_thread, run_calls, scipy_gemm, torch_step, transient_bytes)
from bench_cases import (CASES, EXTRA_PEERS, K, MLP_ROW, QUICK_CASES, SWEEPS,  # noqa: E402,F401
                         available_peers, benchmark_cases, describe, peers_of, rounds_of,
                         rows_of, short_size)
from bench_machine import (BLAS_ENV, blas_environment, blas_kernels,  # noqa: E402,F401
                           limit_threads, machine_info)
from bench_plot import plot, plot_scaling  # noqa: E402
from bench_scaling import run_scaling, scaling_peers, write_json  # noqa: E402
from bench_report import (SPREAD_LIMIT, best_peer, best_peer_verdict, columns,  # noqa: E402
                          flags, legend, noise_warning, print_best_peer_verdict, print_header,
                          print_intro, print_legend, print_row, print_verdict, ratios, verdict)
from bench_sections import dp_allreduce_share, first_step_times  # noqa: E402
from bench_timing import (Worker, interleaved, local_peers, remote_peers,  # noqa: E402,F401
                          start_workers, sync_for)


def measure_row(case: str, dtype: str, opt_kind: str, args: argparse.Namespace,
                peers: list[str], workers: dict[str, Worker] | None = None) -> dict:
    """Time one (case, dtype, optimizer) row of ``peers``: in their processes
    (``workers``) or, with ``workers=None``, here with this module's ``PEERS``
    and ``one_blas_thread``; the row holds their statistics, ratios and flags."""
    start = time.perf_counter()
    if workers is None:
        handles, notes = local_peers(case, dtype, opt_kind, args.device, peers, PEERS,
                                     one_blas_thread)
        gc.freeze()
    else:
        handles, notes = remote_peers(case, dtype, opt_kind, args.device, peers, workers)
    stats = interleaved(handles, rounds_of(case, args), args.min_time)
    row = {"case": case, "size": describe(case), "shape": CASES[case].get("shape"),
           "layers": CASES[case].get("layers"), "batch": CASES[case].get("batch"),
           "dtype": dtype, "optimizer": opt_kind, "k": K, "device": args.device,
           "rounds": rounds_of(case, args)}
    for name in peers:
        row[name] = stats.get(name)
    row["floor_1_thread"] = stats.get("floor 1 thread")
    if notes:
        row["errors"] = notes
    if args.device == "cpu":
        for name in ("numbagrad", "numbagrad compiled", "numpy"):
            if name in handles:
                row[name.replace(" ", "_") + "_bytes"] = handles[name].bytes()
    best = {n: s["best_s"] for n, s in stats.items()}
    row["ratios"], row["best_peer"] = ratios(best, peers), best_peer(best, peers)
    row["flags"] = flags(case, args.device, stats)
    row["seconds"] = time.perf_counter() - start
    return row


def _case_list(text: str) -> list[str]:
    """``--cases gpt,cnn``: the names, each checked."""
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown case {', '.join(unknown) or repr(text)} "
                                         f"(choose from {', '.join(CASES)})")
    return names


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with the defaults ``--quick`` changes filled in."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"cases {' '.join(QUICK_CASES)} (large in float32 only), "
                             f"short rounds, torch.compile on the MLP cases only: a few "
                             f"minutes on two cores")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--cases", nargs="+", default=None, type=_case_list,
                        metavar="CASE", help=f"cases to run, space- or comma-separated: "
                                             f"{', '.join(benchmark_cases())} (and the "
                                             f"--scaling sweeps' points)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"],
                        choices=["float32", "float64"], help="of the linear cases")
    parser.add_argument("--optimizers", nargs="+", default=["sgd", "adam"],
                        choices=["sgd", "adam"], help="of the linear cases")
    parser.add_argument("--repeat", "--repeats", dest="repeats", type=int, default=None,
                        help="interleaved rounds per row (default 9; 5 with --quick, 3 for "
                             "its large cases)")
    parser.add_argument("--min-time", type=float, default=None,
                        help="seconds each sample runs at least (whole windows)")
    parser.add_argument("--threads", type=int, default=None,
                        help="limit every peer's thread pools (BLAS, OpenMP, torch, XLA) to N; "
                             "default: each library's own default")
    parser.add_argument("--no-torch-compile", action="store_true",
                        help="leave out the torch.compile peer (it compiles for 10-60 s a row)")
    parser.add_argument("--no-extra-peers", action="store_true",
                        help="leave out tinygrad, autograd and mygrad (the linear and MLP "
                             "cases' optional peers)")
    parser.add_argument("--keep-blas-env", action="store_true",
                        help="run the peers with OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE as set, "
                             "even when they force an older kernel than this CPU's")
    parser.add_argument("--in-process", action="store_true",
                        help="time every peer in this one process (how 0.2 measured; the "
                             "libraries then change each other's speed): for debugging")
    parser.add_argument("--no-first-step", action="store_true",
                        help="skip the fresh-process first-step timings")
    parser.add_argument("--no-dp", action="store_true",
                        help="skip the 2-rank MPI allreduce-share measurement")
    parser.add_argument("--scaling", action="store_true",
                        help="instead of the table: the MLP and GPT steps across batch sizes "
                             "(1-512) and widths, causal attention across T (64-4096), for "
                             "numbagrad eager and compiled and PyTorch eager, with each "
                             "point's peak memory and each curve's log-log slope; short rounds "
                             "(default 3 of >= 10 ms): about 2-3 minutes on two cores with "
                             "ng.compile's cache warm (the first run compiles the GPT steps: "
                             "up to ~10 minutes)")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--plot", metavar="PATH")
    args = parser.parse_args(argv)
    args.cases = ([c for group in args.cases for c in group] if args.cases else
                  QUICK_CASES if args.quick else benchmark_cases())
    args.repeats_given = args.repeats is not None
    args.repeats = args.repeats or (3 if args.scaling else 5 if args.quick else 9)
    args.min_time = args.min_time if args.min_time is not None else (
        0.01 if args.quick or args.scaling else 0.05)
    return args


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark as ``argv`` asks; returns what ``--json`` writes."""
    args = parse(argv)
    peers = (scaling_peers() if args.scaling else
             [p for p in available_peers(torch_compile=not args.no_torch_compile)
              if not (args.no_extra_peers and p in EXTRA_PEERS)])
    info = machine_info()
    env, blas_report = blas_environment(args.keep_blas_env)
    info["blas_environment"] = blas_report
    workers = None
    if args.in_process:
        if args.threads:
            limit_threads(args.threads)
    else:
        workers = start_workers(peers, env, args.threads)
    try:
        if args.scaling:
            return _scaling(args, peers, info, workers)
        return _main(args, peers, info, env, workers)
    finally:
        for worker in (workers or {}).values():
            worker.close()


def _scaling(args: argparse.Namespace, peers: list[str], info: dict,
             workers: dict[str, Worker] | None) -> dict:
    """``--scaling``: the sweeps, their slopes, ``--json`` and ``--plot``."""
    if workers is not None:
        info["processes"] = {g: w.call("info") for g, w in workers.items()}
    print_intro(info, args, in_process=workers is None)
    result = {"machine": info, "peers": peers,
              "settings": {"repeats": args.repeats, "min_time_s": args.min_time, "k": K,
                           "device": args.device, "threads": args.threads},
              **run_scaling(args, peers, workers, PEERS, one_blas_thread)}
    if args.json:
        write_json(result, args.json)
    if args.plot:
        plot_scaling(result, args.plot)
    return result


def _main(args: argparse.Namespace, peers: list[str], info: dict, env: dict[str, str],
          workers: dict[str, Worker] | None) -> dict:
    if workers is not None:
        info["processes"] = {g: w.call("info") for g, w in workers.items()}
    print_intro(info, args, in_process=workers is None)
    items = legend(args, peers)
    print_legend(items)
    cols = columns(peers)
    print_header(cols)
    rows = []
    for case in args.cases:
        rounds = rounds_of(case, args)
        print(f"{case}: {describe(case)}"
              + (f" ({rounds} rounds)" if rounds != args.repeats else ""), flush=True)
        for dtype, opt_kind in rows_of(case, args.dtypes, args.optimizers, args.quick):
            row = measure_row(case, dtype, opt_kind, args, peers_of(case, args, peers),
                              workers)
            rows.append(row)
            print_row(row, peers, cols)
    result = {"machine": info, "settings": {"repeats": args.repeats, "min_time_s": args.min_time,
                                            "k": K, "device": args.device,
                                            "spread_limit": SPREAD_LIMIT, "quick": args.quick,
                                            "threads": args.threads,
                                            "in_process": args.in_process},
              "peers": peers, "legend": dict(items), "rows": rows}
    if not args.no_first_step and args.device == "cpu":
        print("\nfirst micro-step in a fresh process (2 runs: empty then filled Numba cache; "
              "takes 10-30 s)...", flush=True)
        start = time.perf_counter()
        result["first_step"] = first_step_times(env)
        result["first_step"]["seconds"] = time.perf_counter() - start
        for label in ("cold", "warm"):
            t = result["first_step"][label]
            print(f"  {label} Numba cache: import+step {t['import_and_step_s']:.2f} s, "
                  f"whole process {t['process_s']:.2f} s")
    if not args.no_dp and args.device == "cpu":
        print("\nallreduce share of a data-parallel window (2 MPI ranks, 1024x1024 float32 "
              "Adam, k=4; takes about 10 s)...", flush=True)
        start = time.perf_counter()
        result["data_parallel"] = dp_allreduce_share(env)
        if result["data_parallel"]:
            result["data_parallel"]["seconds"] = time.perf_counter() - start
    result["verdict"] = verdict(rows, peers)
    print_verdict(result["verdict"])
    result["best_peer"] = best_peer_verdict(rows)
    print_best_peer_verdict(result["best_peer"])
    result["warning"] = noise_warning(rows, args)
    if result["warning"]:
        print("\n" + result["warning"])
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
        print(f"json written to {args.json}")
    if args.plot:
        plot(result, args.plot)
    return result


if __name__ == "__main__":
    main()
