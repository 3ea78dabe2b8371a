"""The benchmark's timing and scheduling: where each peer runs (``Local``:
this process; ``Remote``: its group's ``Worker`` process, ``bench_peers.py
--serve``) and ``interleaved``, which times a row's peers round by round
(A B C D, B C D A, ...) so a burst of load hits all of them.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
from bench_cases import CASES
from bench_peers import GROUPS, calibrate, peak_memory, run_calls, transient_bytes

HERE = os.path.dirname(os.path.abspath(__file__))
SETTLE_S = 0.005    # pause between two samples: the last process's spinning threads sleep


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
    """A peer's statistics over its samples: best, quartiles and spread."""
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

    def memory(self) -> dict[str, int | None]:
        return peak_memory(self.fn)


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

    def memory(self) -> dict[str, int | None]:
        return self.worker.call("memory", name=self.name)


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


def local_peers(case: str, dtype: str, opt_kind: str, device: str, peers: list[str],
                makers: dict[str, Callable], single_thread: Callable
                ) -> tuple[dict[str, Local], dict[str, str]]:
    """(name -> Local, name -> error) for ``--in-process``: each peer made by
    ``makers[name]``, plus "floor 1 thread" from ``single_thread`` (see
    ``bench_peers.one_blas_thread``) for a case with a stall check."""
    sync = sync_for(device)
    fns, notes = {}, {}
    for name in peers:
        try:
            fn = makers[name](case, np.dtype(dtype), opt_kind, device)
        except Exception as exc:  # a broken peer is reported, not fatal
            if name == "numbagrad":
                raise
            fn, notes[name] = None, f"{type(exc).__name__}: {exc}"
        if fn is not None:
            fns[name] = Local(fn, sync)
    if device == "cpu" and CASES[case].get("stall_check") and "floor" in fns:
        single = single_thread(fns["floor"].fn)
        if single is not None:
            fns["floor 1 thread"] = Local(single, sync)
    gc.collect()
    return fns, notes


def remote_peers(case: str, dtype: str, opt_kind: str, device: str, peers: list[str],
                 workers: dict[str, Worker]) -> tuple[dict[str, Remote], dict[str, str]]:
    """(name -> Remote, name -> error): each group's process builds its peers."""
    handles, notes = {}, {}
    for group, members in GROUPS.items():
        wanted = [p for p in peers if p in members]
        if not wanted or group not in workers:
            continue
        try:
            got = workers[group].call("setup", case=case, dtype=dtype, opt=opt_kind,
                                      device=device, peers=wanted,
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


def start_workers(peers: list[str], env: dict[str, str], threads: int | None
                  ) -> dict[str, Worker]:
    """One process per group of ``peers``, started together (their imports overlap)."""
    groups = [g for g, members in GROUPS.items() if any(p in members for p in peers)]
    return {g: Worker(g, env, threads) for g in groups}
