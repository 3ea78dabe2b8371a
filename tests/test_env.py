"""Importing numbagrad leaves the process environment, and so every other
library's threads, as they were (issue 21): Numba's OpenMP workers wait as
the runtime's default says, as they would without numbagrad."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = r"""
import ctypes, json, os, sys
before = dict(os.environ)
import numpy as np
import numba
if os.environ.get("PROBE_BARE"):                          # Numba's own threads, no numbagrad
    @numba.njit(parallel=True)
    def f(x):
        for i in numba.prange(x.size):
            x[i] += 1.0
    f(np.zeros(1000))
    after_import = dict(os.environ)
else:
    import numbagrad as ng
    after_import = dict(os.environ)
    x = ng.tensor(np.ones((512, 256), np.float32))      # past the threaded-kernel threshold
    ng.tanh(x)                                            # compute-bound: threaded from 65536
after_kernel = dict(os.environ)
sys.stdout.flush()
spin = None
if numba.threading_layer() == "omp":
    r, w = os.pipe()                                      # libgomp prints its settings to fd 2
    saved = os.dup(2)
    os.dup2(w, 2)
    ctypes.CDLL("libgomp.so.1").omp_display_env(1)
    os.dup2(saved, 2)
    os.close(w)
    text = os.read(r, 1 << 16).decode()
    spin = next(l.split("=")[1].strip(" '") for l in text.splitlines() if "GOMP_SPINCOUNT" in l)
print(json.dumps({"import": after_import == before, "kernel": after_kernel == before,
                  "layer": numba.threading_layer(), "spin": spin,
                  "policy": os.environ.get("OMP_WAIT_POLICY")}))
"""


def probe(**env) -> dict:
    import json
    full = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    full.update(PYTHONPATH=str(ROOT), NUMBAGRAD_PARALLEL_MIN="65536", NUMBA_NUM_THREADS="2",
                NUMBA_THREADING_LAYER="omp", **env)
    run = subprocess.run([sys.executable, "-c", PROBE], env=full, capture_output=True,
                         text=True, timeout=300, check=False, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_import_and_kernels_leave_the_environment_alone_and_the_runtime_default():
    out = probe()
    assert out["import"] and out["kernel"] and out["policy"] is None
    assert out["layer"] == "omp"
    bare = probe(PROBE_BARE="1")            # the same runtime loaded by Numba alone
    assert bare["layer"] == "omp" and bare["policy"] is None
    assert out["spin"] == bare["spin"] and int(out["spin"]) > 0   # not 0: not passive


def test_an_explicit_wait_policy_wins():
    out = probe(OMP_WAIT_POLICY="ACTIVE")
    assert out["import"] and out["kernel"] and out["policy"] == "ACTIVE"
    assert int(out["spin"]) > 300000
