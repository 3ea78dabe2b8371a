"""The benchmark's sections after the table, each in fresh processes: the
first micro-step (import, compile and run; cold then warm Numba cache) and
the allreduce share of a 2-rank data-parallel window (``train_dp.py``).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench_machine import installed

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
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
    if not installed("mpi4py"):
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

