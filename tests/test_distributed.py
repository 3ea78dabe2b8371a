"""Data-parallel training on MPI: mpiexec runs scripts/train_dp.py on loopback."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mpi4py")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import train_dp  # noqa: E402

pytestmark = pytest.mark.mpi
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
TIMEOUT = 120

# Loopback only, as root on a one-interface CI machine, one BLAS thread a rank.
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "UCX_TLS": "self,sm", "UCX_NET_DEVICES": "lo", "HYDRA_IFACE": "lo",
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def mpirun(n, *args, timeout=TIMEOUT):
    assert MPIEXEC, "mpiexec not found: pip install mpich (or use the cluster's MPI)"
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, "-m", "mpi4py",
                           str(ROOT / "scripts" / "train_dp.py"), *map(str, args)],
                          env=dict(os.environ, **MPI_ENV), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_n_ranks_land_where_one_process_with_the_full_batch_lands(tmp_path, n, optimizer):
    out = tmp_path / "result.json"
    run = mpirun(n, "--optimizer", optimizer, "--json", out)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    assert result["size"] == n and result["final_equal"]
    assert result["t"] == result["windows"]
    assert result["allreduce_calls"] == result["windows"]   # one per window, no more
    want = train_dp.reference(train_dp.parse(["--optimizer", optimizer]), n)
    np.testing.assert_allclose(np.array(result["weights"]), want, rtol=1e-10, atol=1e-10)


def test_parameters_start_identical_after_broadcast(tmp_path):
    out = tmp_path / "result.json"
    run = mpirun(3, "--windows", 1, "--json", out)
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(out.read_text())["initial_equal"]
    # ... while the ranks' own initial weights differ before it
    assert not np.allclose(train_dp.initial_weights(train_dp.parse([]), 0),
                           train_dp.initial_weights(train_dp.parse([]), 1))


def test_a_rank_that_raises_aborts_the_whole_job(tmp_path):
    run = mpirun(2, "--fail-rank", 1, "--windows", 4, timeout=60)
    assert run.returncode != 0
    assert "fails on purpose" in run.stderr + run.stdout


def test_cuda_gradients_are_staged_through_the_host(tmp_path):
    import numbagrad as ng
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    out = tmp_path / "result.json"
    args = ["--device", "cuda", "--optimizer", "adam", "--windows", 2]
    run = mpirun(2, *args, "--json", out)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    want = train_dp.reference(train_dp.parse(list(map(str, args))), 2)
    np.testing.assert_allclose(np.array(result["weights"]), want, rtol=1e-10, atol=1e-10)
