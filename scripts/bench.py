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
loop with preallocated buffers, PyTorch eager (on one thread and on its
default count, the faster kept), PyTorch with ``torch.compile``, JAX
(``jax.jit`` + ``optax.MultiSteps``) when importable, and the GEMM floor: the
matrix products no micro-step can avoid, timed alone through SciPy's BLAS,
the library numbagrad's kernels call.

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
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_peers import (CASES, GROUPS, K, PEERS, calibrate,  # noqa: E402,F401
                         compiled_step, floor_gemms, floor_step, initial_weights,
                         numbagrad_step, numpy_step, run_calls, scipy_gemm, torch_step,
                         transient_bytes)

SPREAD_LIMIT = 0.20          # a cell whose IQR / median exceeds this marks its row

# stall_check: the floor is also timed on one BLAS thread; when that beats all
# threads by STALL_LIMIT, the BLAS threads are waiting for cores others hold.
STALL_LIMIT = 1.25
MLP_ROW = ("float32", "adam")        # the one (dtype, optimizer) an MLP case runs
QUICK_CASES = ["tiny", "small", "large", "mlp-small", "mlp-large"]
QUICK_FLOAT32_ONLY = ("large",)      # --quick keeps to a few minutes on two cores:
QUICK_ROUNDS = {"large": 3, "mlp-large": 3}    # fewer rounds for the slow cases



def describe(case: str) -> str:
    c = CASES[case]
    if c["kind"] == "linear":
        d_out, d_in, batch = c["shape"]
        return f"linear {d_out}x{d_in} (d_out x d_in), batch {batch}, MSE"
    return (f"MLP {'-'.join(map(str, c['layers']))}, batch {c['batch']}, ReLU, "
            f"cross-entropy")


def short_size(case: str) -> str:
    c = CASES[case]
    if c["kind"] == "linear":
        d_out, d_in, batch = c["shape"]
        return f"{d_out}x{d_in} b{batch}"
    return f"{'-'.join(map(str, c['layers']))} b{c['batch']}"


def rows_of(case: str, dtypes, optimizers, quick: bool = False) -> list[tuple[str, str]]:
    if CASES[case]["kind"] == "mlp":
        return [MLP_ROW]
    if quick and case in QUICK_FLOAT32_ONLY:
        dtypes = [d for d in dtypes if d == "float32"] or dtypes
    return [(d, o) for d in dtypes for o in optimizers]


SUBJECTS = ("numbagrad", "numbagrad compiled")      # the ones whose ratios are reported
SHORT = {"numbagrad": "ng", "numbagrad compiled": "ngc", "numpy": "numpy", "torch": "torch",
         "torch compiled": "tc", "jax": "jax", "floor": "floor"}
DESCRIPTION = {
    "numbagrad": "ng ops on ng.grad_tape(), loss.backward(), opt.step()",
    "numbagrad compiled": "step = ng.compile(loss_fn, optimizer=opt); step(x, y)",
    "numpy": "the same math written by hand in NumPy, preallocated buffers",
    "torch": ("PyTorch eager, (loss / K).backward(), opt.step() + zero_grad() every K; "
              "on 1 thread and on its default count, the faster kept (the row says which)"),
    "torch compiled": ("the same with the loss function through torch.compile (inductor), "
                       "compiled before timing"),
    "jax": "jax.jit(value_and_grad + optax.MultiSteps update), donated buffers",
    "floor": "only the GEMMs a micro-step cannot avoid (forward, weight and hidden "
             "gradients), SciPy's BLAS (numbagrad's), timed alone: a lower bound, "
             "not a competitor",
}
# The variables these machines set for old OpenBLAS builds, which force an
# older kernel on newer CPUs (AVX2's Haswell on AVX-512: GEMMs at half speed).
BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
SETTLE_S = 0.005    # pause between two samples: the last process's spinning threads sleep


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def available_peers(torch_compile: bool = True) -> list[str]:
    """The peers whose libraries are installed (a row may still lack one);
    found without importing them: this process imports none of the peers."""
    names = ["numbagrad", "numbagrad compiled", "numpy"]
    if _installed("torch"):
        names += ["torch"] + (["torch compiled"] if torch_compile else [])
    if _installed("jax") and _installed("optax"):
        names.append("jax")
    return names + ["floor"]


# ------------------------------------------------------------------ timing
def sync_for(device: str) -> Callable[[], None]:
    """Drain the device for in-process timing (gpu_check.py, --in-process)."""
    if device != "cuda":
        return lambda: None
    import numbagrad as ng
    torch = sys.modules.get("torch")

    def sync():
        ng.cuda.synchronize()
        if torch is not None and torch.cuda.is_available():
            torch.cuda.synchronize()
    return sync


def summarize(samples: list[float], calls: int) -> dict:
    q1, med, q3 = np.percentile(samples, [25, 50, 75])
    return {"best_s": min(samples), "median_s": float(med), "q1_s": float(q1),
            "q3_s": float(q3), "spread": float((q3 - q1) / med) if med > 0 else 0.0,
            "samples_s": list(samples), "calls_per_sample": calls}


class Local:
    """A peer timed in this process (``--in-process``, tests, gpu_check.py)."""

    def __init__(self, fn: Callable[[], None], sync: Callable[[], None]) -> None:
        self.fn, self.sync, self.calls = fn, sync, 0

    def prepare(self, min_time: float, repeats: int) -> dict:
        self.calls, first = calibrate(self.fn, min_time, repeats, self.sync)
        return {"calls": self.calls, "first": first}

    def sample(self) -> float:
        return run_calls(self.fn, self.calls, self.sync)

    def bytes(self) -> int:
        return transient_bytes(self.fn)


class WorkerError(RuntimeError):
    """A peer process failed or answered with an error."""


class Worker:
    """A process serving one group of peers (``bench_peers.py --serve``)."""

    def __init__(self, group: str, env: dict[str, str], threads: int | None = None) -> None:
        self.group = group
        self.log = tempfile.TemporaryFile("w+")
        cmd = [sys.executable, os.path.join(HERE, "bench_peers.py"), "--serve", group]
        if threads:
            cmd += ["--threads", str(threads)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, env=env, text=True, bufsize=1)

    def call(self, cmd: str, **kwargs):
        try:
            self.proc.stdin.write(json.dumps({"cmd": cmd, **kwargs}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            raise WorkerError(f"the {self.group} process died:\n{self.stderr_tail()}")
        reply = json.loads(line)
        if "error" in reply:
            raise WorkerError(reply["error"])
        return reply["ok"]

    def stderr_tail(self, chars: int = 2000) -> str:
        self.log.seek(0)
        return self.log.read()[-chars:]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        self.log.close()


class Remote:
    """A peer timed in its group's process."""

    def __init__(self, worker: Worker, name: str) -> None:
        self.worker, self.name = worker, name

    def prepare(self, min_time: float, repeats: int) -> dict:
        return self.worker.call("prepare", name=self.name, min_time=min_time, repeats=repeats)

    def sample(self) -> float:
        time.sleep(SETTLE_S)
        return self.worker.call("sample", name=self.name)

    def bytes(self) -> int:
        return self.worker.call("bytes", name=self.name)


def interleaved(peers: dict, repeats: int, min_time: float,
                sync: Callable[[], None] = lambda: None) -> dict[str, dict]:
    """Time every peer in rounds (A B C D, B C D A, ...); each sample runs a
    whole number of K-call windows for at least ``min_time`` seconds.

    ``peers`` maps a name to a ``Local``/``Remote`` peer or to a plain
    callable (timed here). Each is first warmed up and calibrated (see
    ``bench_peers.calibrate``); a calibration pass that already was one
    sample of a slow call counts as its first-round sample, as the
    calibration passes themselves run peer after peer like a round."""
    handles = {n: p if hasattr(p, "prepare") else Local(p, sync) for n, p in peers.items()}
    calls: dict[str, int] = {}
    extra: dict[str, dict] = {}
    samples: dict[str, list[float]] = {name: [] for name in handles}
    for name, handle in handles.items():
        prep = handle.prepare(min_time, repeats)
        calls[name] = prep["calls"]
        if prep.get("first") is not None:
            samples[name].append(prep["first"])
        extra[name] = {k: v for k, v in prep.items() if k not in ("calls", "first")}
    names = list(handles)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if len(samples[name]) < repeats:
                samples[name].append(handles[name].sample())
    return {name: {**summarize(samples[name], calls[name]), **extra[name]} for name in names}


def measure(fn: Callable[[], None], repeats: int, min_time: float,
            sync: Callable[[], None]) -> tuple[float, float]:
    """(best, median) seconds per call of one callable alone."""
    s = interleaved({"fn": fn}, repeats, min_time, sync)["fn"]
    return s["best_s"], s["median_s"]


def rounds_of(case: str, args) -> int:
    if args.quick and not args.repeats_given:
        return QUICK_ROUNDS.get(case, args.repeats)
    return args.repeats


def _local_peers(case: str, dtype: str, opt_kind: str, args, peers: list[str]
                 ) -> tuple[dict, dict]:
    """(name -> Local, name -> error) for ``--in-process``: every maker here."""
    sync = sync_for(args.device)
    fns, notes = {}, {}
    for name in peers:
        try:
            fn = PEERS[name](case, np.dtype(dtype), opt_kind, args.device)
        except Exception as exc:  # a broken peer is reported, not fatal
            if name == "numbagrad":
                raise
            fn, notes[name] = None, f"{type(exc).__name__}: {exc}"
        if fn is not None:
            fns[name] = Local(fn, sync)
    if args.device == "cpu" and CASES[case].get("stall_check") and "floor" in fns:
        single = one_blas_thread(fns["floor"].fn)
        if single is not None:
            fns["floor 1 thread"] = Local(single, sync)
    gc.collect()
    return fns, notes


def _remote_peers(case: str, dtype: str, opt_kind: str, args, peers: list[str],
                  workers: dict[str, Worker]) -> tuple[dict, dict]:
    """(name -> Remote, name -> error): each group's process builds its peers."""
    handles, notes = {}, {}
    for group, members in GROUPS.items():
        wanted = [p for p in peers if p in members]
        if not wanted or group not in workers:
            continue
        try:
            got = workers[group].call("setup", case=case, dtype=dtype, opt=opt_kind,
                                      device=args.device, peers=wanted,
                                      stall_check=bool(CASES[case].get("stall_check")))
        except WorkerError as exc:
            notes.update({p: str(exc) for p in wanted})
            continue
        notes.update(got["errors"])
        handles.update({name: Remote(workers[group], name) for name in got["peers"]})
    if "numbagrad" not in handles:
        raise RuntimeError(f"numbagrad could not run {case} {dtype} {opt_kind}: "
                           f"{notes.get('numbagrad', 'no numbagrad process')}")
    return handles, notes


def one_blas_thread(fn: Callable[[], None]) -> Callable[[], None] | None:
    """``bench_peers.one_blas_thread`` (kept here for the tests to replace)."""
    from bench_peers import one_blas_thread as limited
    return limited(fn)


def measure_row(case: str, dtype: str, opt_kind: str, args, peers: list[str],
                workers: dict[str, Worker] | None = None) -> dict:
    start = time.perf_counter()
    if workers is None:
        handles, notes = _local_peers(case, dtype, opt_kind, args, peers)
        gc.freeze()
    else:
        handles, notes = _remote_peers(case, dtype, opt_kind, args, peers, workers)
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
    row["ratios"] = {f"{a}/{b}": best[a] / best[b] for a in SUBJECTS if a in best
                     for b in peers if b in best and b not in SUBJECTS}
    flags = [f"{n} spread {100 * s['spread']:.0f}%" for n, s in stats.items()
             if s["spread"] > SPREAD_LIMIT]
    if "floor 1 thread" in best and best["floor 1 thread"] * STALL_LIMIT < best["floor"]:
        flags.append(f"BLAS threads stalled (floor {fmt_us(best['floor'])} µs, "
                     f"{fmt_us(best['floor 1 thread'])} µs on one thread)")
    if "floor" in best and CASES[case].get("stall_check"):
        # GEMM-bound cases only: tiny GEMMs run as plain loops, below the BLAS call cost
        flags += [f"{n} below its floor ({best[n] / best['floor']:.2f}x)"
                  for n in ("numbagrad", "numbagrad compiled", "numpy")
                  if n in best and best[n] < best["floor"] and args.device == "cpu"]
    row["flags"] = flags
    row["seconds"] = time.perf_counter() - start
    return row


# ------------------------------------------------------------------ other sections
FIRST_STEP = """
import time
t0 = time.perf_counter()
import numpy as np
import numbagrad as ng
W = ng.param(np.ones((2, 3)))
opt = ng.optim.Adam([W], lr=1e-3, accumulate_steps=1)
with ng.grad_tape():
    loss = ng.mse_loss(W @ ng.tensor(np.ones((3, 1))), np.zeros((2, 1)))
loss.backward()
opt.step()
print(time.perf_counter() - t0)
"""


def first_step_times(env: dict[str, str]) -> dict[str, dict[str, float]]:
    """Import + first micro-step in fresh processes: cold, then warm cache."""
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(env, NUMBA_CACHE_DIR=cache, PYTHONPATH=ROOT)
        for label in ("cold", "warm"):
            start = time.perf_counter()
            run = subprocess.run([sys.executable, "-c", FIRST_STEP], env=env, check=True,
                                 capture_output=True, text=True, stdin=subprocess.DEVNULL)
            out[label] = {"process_s": time.perf_counter() - start,
                          "import_and_step_s": float(run.stdout.strip().splitlines()[-1])}
    return out


def dp_allreduce_share(env: dict[str, str], ranks: int = 2) -> dict | None:
    """Run scripts/train_dp.py --bench on local MPI ranks; None if no MPI."""
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) \
        or shutil.which("mpiexec")
    if not _installed("mpi4py"):
        mpiexec = None
    if mpiexec is None:
        print("  skipped: mpi4py or mpiexec missing (pip install numbagrad[mpi] mpich)")
        return None
    threads = str(max(1, (os.cpu_count() or 1) // ranks))
    env = dict(env, OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads,
               UCX_TLS="self,sm", UCX_NET_DEVICES="lo", HYDRA_IFACE="lo")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "dp.json")
        run_ = subprocess.run([mpiexec, "-n", str(ranks), sys.executable, "-m", "mpi4py",
                               os.path.join(HERE, "train_dp.py"), "--bench", "--json", out],
                              env=env, capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL, check=False)
        if run_.returncode != 0:
            print("  failed:\n" + run_.stderr[-2000:])
            return None
        print("  " + run_.stdout.strip().splitlines()[-1])
        with open(out) as fh:
            result = json.load(fh)
    return {"ranks": ranks, "share": result["allreduce_share"], "threads_per_rank": threads}


# ------------------------------------------------------------------ machine and BLAS
BLAS_PROBE = ("import json, numpy, scipy.linalg, threadpoolctl; print(json.dumps("
              "[lib.get('architecture') for lib in threadpoolctl.threadpool_info()"
              " if lib['user_api'] == 'blas']))")


def blas_kernels(env: dict[str, str]) -> list[str] | None:
    """The OpenBLAS kernels NumPy's and SciPy's BLAS pick in a process with
    ``env`` (threadpoolctl's ``architecture``), or None without threadpoolctl."""
    if not _installed("threadpoolctl"):
        return None
    run = subprocess.run([sys.executable, "-c", BLAS_PROBE], env=env, capture_output=True,
                         text=True, stdin=subprocess.DEVNULL, check=False, timeout=120)
    return json.loads(run.stdout) if run.returncode == 0 else None


def blas_environment(keep: bool) -> tuple[dict[str, str], dict]:
    """(the environment the peers' processes get, what was found and done).

    When ``OPENBLAS_CORETYPE`` (or ``OPENBLAS_L2_SIZE``) is set, the kernel it
    forces is compared with the one OpenBLAS picks for this CPU by itself; if
    they differ the run warns and, unless ``keep``, runs its children without
    those variables, as the library's users run."""
    env = dict(os.environ)
    found = {k: env[k] for k in BLAS_ENV if k in env}
    report = {"variables": found, "kept": keep, "forced": None, "native": None,
              "removed": False, "warning": None}
    if not found:
        return env, report
    native_env = {k: v for k, v in env.items() if k not in BLAS_ENV}
    report["forced"], report["native"] = blas_kernels(env), blas_kernels(native_env)
    if report["forced"] != report["native"]:
        what = " ".join(f"{k}={v}" for k, v in found.items())
        report["warning"] = (f"WARNING: {what} forces OpenBLAS kernel(s) {report['forced']}; "
                             f"this CPU's own is {report['native']}"
                             + ("; kept (--keep-blas-env): every BLAS figure is slower than "
                                "users see" if keep else
                                "; the peers run without those variables (--keep-blas-env "
                                "keeps them)"))
    if not keep:
        env, report["removed"] = native_env, True
    return env, report


def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh
                        if ln.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    from importlib import metadata
    versions = {"python": platform.python_version()}
    for name in ("numbagrad", "numpy", "numba", "llvmlite", "scipy", "torch", "jax", "jaxlib",
                 "optax"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"cpu": cpu, "cores": os.cpu_count(), "usable_cores": usable,
            "platform": platform.platform(), "versions": versions, "processes": {}}


def blas_summary(info: dict) -> str:
    """The BLAS numbagrad's process runs (SciPy's: numbagrad's GEMMs and the
    floor's), as threadpoolctl names it, with its kernel."""
    libs = [lib for p in info.get("processes", {}).values() for lib in p.get("blas", [])
            if lib["user_api"] == "blas"]
    mine = [lib for lib in libs if "scipy" in (lib["filepath"] or "")] or libs
    if not mine:
        return "BLAS unknown (pip install threadpoolctl)"
    lib = mine[0]
    return (f"{lib['internal_api']} {lib['version']}, kernel {lib['architecture']} "
            f"({lib['num_threads']} threads)")


def process_summary(info: dict) -> list[str]:
    """One line per peer process: its BLAS libraries, versions and kernels."""
    out = []
    for group, p in info.get("processes", {}).items():
        libs = ", ".join(f"{os.path.basename(lib['filepath'] or '?')} {lib['version']} "
                         f"kernel {lib['architecture']}, {lib['num_threads']} threads"
                         for lib in p.get("blas", []) if lib["user_api"] == "blas")
        out.append(f"  {group:<15} {libs or 'no BLAS that threadpoolctl sees'}")
    return out


# ------------------------------------------------------------------ report
def fmt_us(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    us = seconds * 1e6
    return f"{us:.2f}" if us < 10 else f"{us:.1f}" if us < 100 else f"{us:.0f}"


def fmt_ratio(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}x" if value < 0.1 else f"{value:.2f}x"


def columns(peers: list[str]) -> list[tuple[str, str, int]]:
    """(header line 1, header line 2, width) of every table column."""
    cols = [("", "dtype", 7), ("", "opt", 4)]
    cols += [(n if n != "numbagrad compiled" else "ng compiled", "best/med µs", 13)
             for n in peers]
    cols += [(f"{SHORT[a]}/", SHORT[b], 7) for a in SUBJECTS if a in peers
             for b in peers if b not in SUBJECTS]
    cols += [("spread", "IQR/med", 7), ("ng B", "/step", 7), ("np B", "/step", 8), ("", "", 1)]
    return cols


def table_cells(row: dict, peers: list[str]) -> list[str]:
    cells = [row["dtype"], row["optimizer"]]
    for n in peers:
        s = row.get(n)
        cells.append("n/a" if s is None else f"{fmt_us(s['best_s'])}/{fmt_us(s['median_s'])}")
    cells += [fmt_ratio(row["ratios"].get(f"{a}/{b}")) for a in SUBJECTS if a in peers
              for b in peers if b not in SUBJECTS]
    spreads = [row[n]["spread"] for n in peers if row.get(n)]
    cells.append(f"{100 * max(spreads):.0f}%" if spreads else "n/a")
    cells += [str(row.get("numbagrad_bytes", "n/a")), str(row.get("numpy_bytes", "n/a")),
              "!" if row["flags"] else ""]
    return cells


def line(cells: list[str], cols) -> str:
    first = cells[0].ljust(cols[0][2]) + " " + cells[1].ljust(cols[1][2])
    return (first + " " + " ".join(c.rjust(w) for c, (_, _, w) in zip(cells[2:], cols[2:]))
            ).rstrip()


def legend(args, peers: list[str]) -> list[tuple[str, str]]:
    """(column, meaning) for every column of the table, as printed."""
    items = [
        ("micro-step", (f"forward, loss, backward into the gradient accumulator, then "
                        f"optimizer.step() with accumulate_steps={K}; one call in {K} "
                        f"applies the update")),
        ("best/med µs", (f"µs per micro-step: the best and the median of {args.repeats} rounds;"
                         f" a row's peers run interleaved so load bursts hit them all")),
    ]
    items += [(n, DESCRIPTION[n]) for n in peers]
    items += [
        ("ng/X", ("numbagrad's best time / X's best time, same rounds: below 1.00x numbagrad "
                  "is faster; ng/floor near 1.00x is the best possible")),
        ("spread", (f"the widest interquartile range / median among the row's peers "
                    f"(timing noise); over {100 * SPREAD_LIMIT:.0f}% marks the row")),
        ("ng B, np B", ("bytes numbagrad / the NumPy loop allocate in one steady-state "
                        "micro-step (tracemalloc; n/a for PyTorch, JAX, CUDA)")),
        ("!", (f"noisy row: a spread over {100 * SPREAD_LIMIT:.0f}%, a time below the floor, "
               f"or BLAS threads stalling (the floor faster on one thread); unreliable")),
    ]
    if "numbagrad compiled" in peers:
        items.insert(-3, ("ngc/X", "the same ratios for numbagrad compiled"))
    return items


def print_legend(items: list[tuple[str, str]]) -> None:
    print("\nHow to read the table (lower is better in every column but the case line):")
    for key, text in items:
        print(f"  {key:<19} {text}")


def print_header(cols) -> None:
    print()
    print(line([c[0] for c in cols], cols))
    print(line([c[1] for c in cols], cols))


# ------------------------------------------------------------------ verdict
# (label, case, subject, peer, limit): subject/peer best-time ratio must be <= limit
TARGETS = [
    ("tiny linear step", "tiny", "numbagrad", "numpy", 1.5),
    ("tiny linear step", "tiny", "numbagrad", "torch", 0.1),
    ("large linear step", "large", "numbagrad", "floor", 1.15),
    ("large linear step", "large", "numbagrad", "torch", 1.0),
    ("MLP 64-64-10 b32", "mlp-small", "numbagrad", "numpy", 1.0),
    ("MLP 784-1024-1024-10 b256", "mlp-large", "numbagrad", "floor", 1.15),
    ("MLP 784-1024-1024-10 b256", "mlp-large", "numbagrad", "torch", 0.7),
    ("tiny linear, compiled", "tiny", "numbagrad compiled", "numpy", 0.6),
    ("tiny linear, compiled", "tiny", "numbagrad compiled", "torch", 0.03),
    ("MLP 64-64-10, compiled", "mlp-small", "numbagrad compiled", "numpy", 0.5),
    ("MLP 64-64-10, compiled", "mlp-small", "numbagrad compiled", "torch", 0.15),
    ("MLP 64-64-10, compiled", "mlp-small", "numbagrad compiled", "jax", 0.35),
    ("large linear, compiled", "large", "numbagrad compiled", "floor", 1.10),
    ("large linear, compiled", "large", "numbagrad compiled", "torch", 1.0),
    ("large linear, compiled", "large", "numbagrad compiled", "jax", 1.0),
    ("MLP 784-1024-1024-10, compiled", "mlp-large", "numbagrad compiled", "floor", 1.10),
    ("MLP 784-1024-1024-10, compiled", "mlp-large", "numbagrad compiled", "torch", 1.0),
    ("MLP 784-1024-1024-10, compiled", "mlp-large", "numbagrad compiled", "jax", 1.0),
]
PEER_NAME = {"numpy": "NumPy loop", "torch": "PyTorch eager", "jax": "JAX jit",
             "floor": "GEMM floor"}


def verdict(rows: list[dict], peers: list[str]) -> list[dict]:
    """Each target's worst ratio over the case's rows (every dtype and
    optimizer run), leaving out noisy rows unless all are; compiled targets
    only when the compiled peer ran."""
    out = []
    for label, case, subject, peer, limit in TARGETS:
        if subject not in peers:
            continue
        found = [(r["ratios"][f"{subject}/{peer}"], r) for r in rows
                 if r["case"] == case and f"{subject}/{peer}" in r["ratios"]]
        entry = {"target": label, "case": case, "subject": subject, "peer": peer,
                 "limit": limit, "ratio": None, "status": "not measured", "row": None,
                 "rows": 0, "noisy_rows_left_out": 0, "best_row_ratio": None, "noisy": False}
        clean = [(v, r) for v, r in found if not r["flags"]]
        if found:
            use = clean or found
            value, row = max(use, key=lambda t: t[0])
            entry.update(ratio=value, status="met" if value <= limit else "missed",
                         row=f"{row['dtype']} {row['optimizer']}", noisy=not clean,
                         rows=len(use), noisy_rows_left_out=len(found) - len(use),
                         best_row_ratio=min(v for v, _ in use))
        out.append(entry)
    return out


def print_verdict(entries: list[dict]) -> None:
    print("\nVerdict: the issues' targets; each ratio is the worst over the case's rows "
          "(noisy rows left out when others are clean)")
    for e in entries:
        what = f"{e['subject']} / {PEER_NAME[e['peer']]}"
        head = f"  {e['target']:<31} {what:<35} <= {fmt_ratio(e['limit']):<6}"
        if e["ratio"] is None:
            print(f"{head} {'':>7}  not measured (case {e['case']} not run)")
            continue
        where = e["row"]
        if e["rows"] > 1:
            where += (f", worst of {e['rows']}{' clean' if not e['noisy'] else ''} rows, best "
                      f"{fmt_ratio(e['best_row_ratio'])}")
        if e["noisy_rows_left_out"]:
            where += f"; {e['noisy_rows_left_out']} noisy left out"
        if e["noisy"]:
            where += "; noisy: unreliable"
        print(f"{head} {fmt_ratio(e['ratio']):>7}  {e['status']:<6} ({where})")
    measured = [e for e in entries if e["ratio"] is not None]
    met = sum(e["status"] == "met" for e in measured)
    print(f"  {met} of {len(measured)} measured targets met"
          + (f"; {len(entries) - len(measured)} not measured" if len(measured) < len(entries)
             else ""))


# ------------------------------------------------------------------ plot
def plot(result: dict, path: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not importable: no plot written")
        return False
    rows, peers = result["rows"], [p for p in result["peers"] if p != "floor"]
    cases = [c for c in CASES if any(r["case"] == c for r in rows)]
    ncol = min(3, len(cases))
    nrow = math.ceil(len(cases) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 4.2 * nrow), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.8 / len(peers)
    for ax, case in zip(axes.flat, cases):
        mine = [r for r in rows if r["case"] == case]
        for j, name in enumerate(peers):
            xs, best, med, lo, hi = [], [], [], [], []
            for i, r in enumerate(mine):
                s = r.get(name)
                if s is None:
                    continue
                xs.append(i + (j - (len(peers) - 1) / 2) * width)
                best.append(s["best_s"] * 1e6)
                med.append(s["median_s"] * 1e6)
                lo.append((s["median_s"] - s["q1_s"]) * 1e6)
                hi.append((s["q3_s"] - s["median_s"]) * 1e6)
            color = colors[j % len(colors)]
            ax.bar(xs, best, width, color=color, label=name if case == cases[0] else None)
            ax.errorbar(xs, med, yerr=[lo, hi], fmt="o", markersize=3, capsize=2,
                        color="black", elinewidth=1)
        for i, r in enumerate(mine):
            if r.get("floor"):
                ax.hlines(r["floor"]["best_s"] * 1e6, i - 0.45, i + 0.45, colors="black",
                          linestyles="--", label="GEMM floor" if case == cases[0] and i == 0
                          else None)
        ax.set_yscale("log")
        ax.set_ylabel("µs per micro-step (lower is better)")
        ax.set_xticks(range(len(mine)), [f"{r['dtype']}\n{r['optimizer']}"
                                         + ("\n! noisy" if r["flags"] else "") for r in mine],
                      fontsize=8)
        ax.set_title(f"{case}: {short_size(case)}", fontsize=10)
    for ax in list(axes.flat)[len(cases):]:
        ax.axis("off")
    m = result["machine"]
    fig.suptitle(f"numbagrad micro-step (accumulate_steps={K}, device {rows[0]['device']}) "
                 f"on {m['cpu']}, {m['usable_cores']} cores, {blas_summary(m)}\n"
                 f"bars: best of the interleaved rounds (what the "
                 f"ratios use); dots and whiskers: median and interquartile range; dashed: "
                 f"GEMM floor (best)", fontsize=10)
    fig.legend(loc="lower center", ncol=len(peers) + 1, fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 0.93))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot written to {path}")
    return True


# ------------------------------------------------------------------ main
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"cases {' '.join(QUICK_CASES)} (large in float32 only), "
                             f"short rounds, torch.compile on the MLP cases only: a few "
                             f"minutes on two cores")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--cases", nargs="+", default=None, choices=list(CASES))
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
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--plot", metavar="PATH")
    args = parser.parse_args(argv)
    args.cases = args.cases or (QUICK_CASES if args.quick else list(CASES))
    args.repeats_given = args.repeats is not None
    args.repeats = args.repeats or (5 if args.quick else 9)
    args.min_time = args.min_time if args.min_time is not None else (
        0.01 if args.quick else 0.05)
    return args


def limit_threads(n: int) -> None:
    """This process's thread pools to n threads (``--in-process``; a peer
    process limits its own with ``bench_peers.limit_threads``)."""
    from bench_peers import limit_threads as limit_env
    limit_env(n)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(n)
    except ImportError:
        print("threadpoolctl not installed: --threads cannot limit the BLAS")


def peers_of(case: str, args, peers: list[str]) -> list[str]:
    """A row's peers: ``--quick`` compiles with torch.compile for the MLPs only."""
    if args.quick and CASES[case]["kind"] != "mlp":
        return [p for p in peers if p != "torch compiled"]
    return peers


def start_workers(peers: list[str], env: dict[str, str], args) -> dict[str, Worker]:
    """One process per group of ``peers``, started together (their imports overlap)."""
    groups = [g for g, members in GROUPS.items() if any(p in members for p in peers)]
    return {g: Worker(g, env, args.threads) for g in groups}


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    peers = available_peers(torch_compile=not args.no_torch_compile)
    info = machine_info()
    env, blas_report = blas_environment(args.keep_blas_env)
    info["blas_environment"] = blas_report
    workers = None
    if args.in_process:
        if args.threads:
            limit_threads(args.threads)
    else:
        workers = start_workers(peers, env, args)
    try:
        return _main(args, peers, info, env, workers)
    finally:
        for worker in (workers or {}).values():
            worker.close()


def _main(args, peers: list[str], info: dict, env: dict[str, str],
          workers: dict[str, Worker] | None) -> dict:
    v = info["versions"]
    if workers is not None:
        info["processes"] = {g: w.call("info") for g, w in workers.items()}
    print(f"numbagrad micro-step benchmark on {info['cpu']}, {info['usable_cores']} of "
          f"{info['cores']} cores, numbagrad's BLAS {blas_summary(info)}")
    print("numbagrad {numbagrad} | numpy {numpy} | numba {numba} | scipy {scipy} | "
          "torch {torch} | jax {jax} | optax {optax}".format(
              **{k: v.get(k) or "not installed" for k in v})
          + f" | device {args.device} | {args.repeats} rounds of >= {args.min_time * 1e3:g} ms"
          + (f" | threads limited to {args.threads}" if args.threads else ""))
    if workers is None:
        print("every peer in this one process (--in-process): the libraries change each "
              "other's threads and speed")
    else:
        print("each peer group in a process of its own, with its library's defaults:")
        print("\n".join(process_summary(info)))
    if info["blas_environment"]["warning"]:
        print(info["blas_environment"]["warning"])
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
            print(line(table_cells(row, peers), cols), flush=True)
            for name, err in row.get("errors", {}).items():
                print(f"    ({name} could not run: {err.strip().splitlines()[-1]})")
            threads = {n: row[n]["threads"] for n in peers if row.get(n) and "threads" in row[n]}
            if threads:
                print("    (" + "; ".join(f"{n} on {t} thread{'s' * (t > 1)}"
                                          for n, t in threads.items()) + ")")
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
    noisy = [r for r in rows if r["flags"]]
    result["warning"] = None
    if noisy:
        why = "; ".join(f"{r['case']} {r['dtype']} {r['optimizer']}: {r['flags'][0]}"
                        for r in noisy[:3]) + ("; ..." if len(noisy) > 3 else "")
        stalled = any("stalled" in f for r in noisy for f in r["flags"])
        result["warning"] = (
            f"WARNING: the machine was noisy, {len(noisy)} of {len(rows)} rows are marked ! "
            f"({why}): rerun with --repeat {2 * args.repeats + 1}"
            + (" --threads 1" if stalled and not args.threads else "")
            + " or on an idle machine")
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
