"""Data-parallel training on MPI: mpiexec runs scripts/train_dp.py on loopback."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import numbagrad as ng

pytest.importorskip("mpi4py")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import train_dp

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
                          timeout=timeout, stdin=subprocess.DEVNULL, check=False)


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


# --------------------------------- samples, flush, clipping, non-finite windows
FEATURES = r'''
import json, sys, warnings
import numpy as np
sys.path.insert(0, sys.argv[3])
import numbagrad as ng
import numbagrad.distributed as dist

comm = dist.init()
rank, size = dist.rank(), dist.size()
scenario, out = sys.argv[1], sys.argv[2]
W0 = np.random.default_rng(0).normal(size=(2, 3))


def columns(window, n):      # the same on every rank
    rng = np.random.default_rng(100 + window)
    return rng.normal(size=(3, n)), rng.normal(size=(2, n))


def micro_step(W, opt, x, y, samples=None):
    with ng.grad_tape():
        loss = ng.mse_loss(W @ ng.tensor(x), ng.tensor(y),
                           reduction="sum" if samples else "mean")
    loss.backward()
    return opt.step(samples=samples)


def report(**mine):
    everyone = comm.gather(mine, root=0)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(everyone, fh)


if scenario == "features":
    # samples: rank 0 feeds micro-batches of 3 and 1 columns, rank 1 of 2 and 4;
    # the window's total is clipped after the allreduce.
    W = ng.param(W0)
    opt = dist.DistributedOptimizer(ng.optim.SGD([W], lr=0.1, momentum=0.9, accumulate_steps=2,
                                                 average="samples", max_grad_norm=0.3))
    sizes = [(3, 1), (2, 4)][rank]
    start = sum(sum(s) for s in [(3, 1), (2, 4)][:rank])
    norms = []
    for window in range(2):
        x, y = columns(window, 10)
        a = start
        for n in sizes:
            micro_step(W, opt, x[:, a:a + n], y[:, a:a + n], samples=n)
            a += n
        norms.append(opt.last_grad_norm)
    samples = dict(w=W.numpy().tolist(), norms=norms, t=opt.t, calls=opt.allreduce_calls)

    # flush: 3 + 3 micro-steps, then 2 on rank 0 and 1 on rank 1; then an
    # empty flush, which every rank must see as empty.
    W = ng.param(W0)
    opt = dist.DistributedOptimizer(ng.optim.Adam([W], lr=0.05, accumulate_steps=4))
    for window, counts in enumerate([(3, 3), (2, 1)]):
        x, y = columns(10 + window, 12)
        first = sum(counts[:rank])
        for i in range(first, first + counts[rank]):
            micro_step(W, opt, x[:, 2 * i:2 * i + 2], y[:, 2 * i:2 * i + 2])
        assert opt.flush() is True
    empty = opt.flush()
    flush = dict(w=W.numpy().tolist(), t=opt.t, empty=empty, calls=opt.allreduce_calls)

    # non-finite: rank 1 poisons window 1; every rank skips it ("skip") or
    # raises ("raise") after the allreduce.
    W = ng.param(W0)
    opt = dist.DistributedOptimizer(ng.optim.SGD([W], lr=0.1, accumulate_steps=2,
                                                 nonfinite="skip"))
    for window in range(3):
        x, y = columns(20 + window, 4)
        if window == 1 and rank == 1:
            x = x.copy()
            x[0, 2] = np.nan     # in rank 1's columns
        cols = slice(2 * rank, 2 * rank + 2)
        micro_step(W, opt, x[:, cols], y[:, cols])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            micro_step(W, opt, x[:, cols], y[:, cols])
        assert (len(caught) == 1) == (window == 1), [str(c.message) for c in caught]
    skip = dict(w=W.numpy().tolist(), t=opt.t, skipped=opt.skipped)
    V = ng.param(W0)
    opt = dist.DistributedOptimizer(ng.optim.SGD({"V": V}, lr=0.1))
    x, y = columns(30, 2)
    if rank == 1:
        x[0, 0] = np.inf
    try:
        micro_step(V, opt, x, y)
        raised = None
    except FloatingPointError as exc:
        raised = str(exc)
    report(samples=samples, flush=flush, skip=skip, raised=raised, v=V.numpy().tolist(),
           t_raise=opt.t)

elif scenario == "bad-shape":
    W = ng.param(np.ones((2, 3)) if rank == 0 else np.ones((3, 3)))
    b = ng.param(np.ones(2))
    dist.broadcast_parameters({"b": b, "W": W})
elif scenario == "bad-count":
    params = {"W": ng.param(np.ones((2, 3)))}
    if rank == 1:
        params["b"] = ng.param(np.ones(2))
    dist.broadcast_parameters(params)
elif scenario == "bad-k":
    opt = ng.optim.SGD([ng.param(np.ones((2, 3)))], lr=0.1, accumulate_steps=2 + rank)
    dist.DistributedOptimizer(opt)
elif scenario == "bad-class":
    W = ng.param(np.ones((2, 3)))
    opt = ng.optim.SGD([W], lr=0.1) if rank == 0 else ng.optim.Adam([W])
    dist.DistributedOptimizer(opt)
comm.Barrier()
'''


def run_features(tmp_path, scenario, n=2, timeout=TIMEOUT):
    script = tmp_path / "features.py"
    script.write_text(FEATURES)
    out = tmp_path / f"{scenario}.json"
    start = time.perf_counter()
    run = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, "-m", "mpi4py", str(script),
                          scenario, str(out), str(ROOT)],
                         env=dict(os.environ, **MPI_ENV), capture_output=True, text=True,
                         timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    return run, out, time.perf_counter() - start


def single_process(make, windows):
    """One process, one full-batch update per window: [(x, y, samples)]."""
    W = ng.param(np.random.default_rng(0).normal(size=(2, 3)))
    opt = make(W)
    for x, y, samples in windows:
        with ng.grad_tape():
            loss = ng.mse_loss(W @ ng.tensor(x), ng.tensor(y),
                               reduction="sum" if samples else "mean")
        loss.backward()
        opt.step(samples=samples)
    return W.numpy(), opt


def columns(window, n):
    rng = np.random.default_rng(100 + window)
    return rng.normal(size=(3, n)), rng.normal(size=(2, n))


def test_samples_flush_clipping_and_nonfinite_windows_across_ranks(tmp_path):
    run, out, _ = run_features(tmp_path, "features")
    assert run.returncode == 0, run.stdout + run.stderr
    ranks = json.loads(out.read_text())
    assert len(ranks) == 2
    for key in ("samples", "flush", "skip"):    # every rank lands on the same weights
        assert ranks[0][key] == ranks[1][key], key

    # samples: the window divides by the 10 samples of both ranks, clipped by the
    # reduced total's norm, in one allreduce per window
    want, ref = single_process(
        lambda W: ng.optim.SGD([W], lr=0.1, momentum=0.9, average="samples",
                               max_grad_norm=0.3),
        [(*columns(w, 10), 10) for w in range(2)])
    got = ranks[0]["samples"]
    np.testing.assert_allclose(got["w"], want, rtol=1e-10, atol=1e-12)
    assert got["norms"][-1] == pytest.approx(ref.last_grad_norm, rel=1e-10)
    assert got["norms"][0] > 0.3            # clipping was active
    assert (got["t"], got["calls"]) == (2, 2)

    # flush: 6 micro-batches, then 3 (2 on rank 0, 1 on rank 1): each the full batch
    windows = [(*columns(10, 12), None), tuple(a[:, :6] for a in columns(11, 12)) + (None,)]
    want, _ = single_process(lambda W: ng.optim.Adam([W], lr=0.05), windows)
    got = ranks[0]["flush"]
    np.testing.assert_allclose(got["w"], want, rtol=1e-10, atol=1e-12)
    assert (got["t"], got["empty"], got["calls"]) == (2, False, 2)

    # non-finite: rank 1's NaN makes every rank skip window 1
    windows = [(*columns(w, 4), None) for w in (20, 22)]
    want, _ = single_process(lambda W: ng.optim.SGD([W], lr=0.1), windows)
    got = ranks[0]["skip"]
    np.testing.assert_allclose(got["w"], want, rtol=1e-10, atol=1e-12)
    assert (got["t"], got["skipped"]) == (2, 1)
    for r in ranks:    # and with "raise" every rank raises, naming the param
        assert r["raised"] and "in V; nothing was applied" in r["raised"]
        assert r["t_raise"] == 0
        np.testing.assert_array_equal(r["v"], np.random.default_rng(0).normal(size=(2, 3)))


@pytest.mark.parametrize("scenario, message", [
    ("bad-shape", (r"param W differs across ranks \(rank 0: shape \(2, 3\) float64, "
                   r"rank 1: shape \(3, 3\) float64\)")),
    ("bad-count", r"ranks have different numbers of params \(rank 0: 1, rank 1: 2\)"),
    ("bad-k", r"ranks disagree on accumulate_steps \(rank 0: 2, rank 1: 3\)"),
    ("bad-class", r"ranks disagree on the optimizer class \(rank 0: SGD, rank 1: Adam\)"),
])
def test_misconfigured_ranks_end_the_job_quickly_with_a_clear_message(tmp_path, scenario,
                                                                      message):
    run, _, seconds = run_features(tmp_path, scenario, timeout=60)
    assert run.returncode != 0
    output = run.stdout + run.stderr
    assert re.search("ValueError: " + message, output), output[-3000:]
    assert seconds < 30


def test_the_configuration_check_passes_on_agreeing_ranks():
    from mpi4py import MPI

    import numbagrad.distributed as dist
    dist.init(MPI.COMM_SELF)
    W = ng.param(np.ones((2, 3)))
    dist.broadcast_parameters([W])
    opt = dist.DistributedOptimizer(ng.optim.AdamW([W], average="samples"))
    with pytest.raises(ValueError, match="already wrapped"):
        dist.DistributedOptimizer(opt.optimizer)
    W.grad = np.ones((2, 3))
    assert opt.step(samples=3) is True and opt.allreduce_calls == 1


# ------------------------------------- a plain launch (no -m mpi4py) that raises
RAISES = r'''
import sys, time
sys.path.insert(0, sys.argv[2])
import numpy as np
import numbagrad as ng
import numbagrad.distributed as dist

dist.init()
rank = dist.rank()
W = ng.param(np.ones((2, 3)))
opt = dist.DistributedOptimizer(ng.optim.SGD([W], lr=0.1))
x = ng.tensor(np.ones((3 if rank == 0 else 4, 5)))    # rank 1: a shape error
if rank == 1:
    with open(sys.argv[1], "w") as fh:
        fh.write(repr(time.time()))
with ng.grad_tape():
    loss = ng.mse_loss(W @ x, np.zeros((2, 5)))
loss.backward()
opt.step()            # rank 0 waits here for rank 1's part of the allreduce
'''


def test_init_makes_a_rank_that_raises_abort_a_plain_launch(tmp_path):
    script, stamp = tmp_path / "raises.py", tmp_path / "raised_at"
    script.write_text(RAISES)
    proc = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, str(script), str(stamp),
                             str(ROOT)], env=dict(os.environ, **MPI_ENV), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)      # mpiexec and both ranks
        out, err = proc.communicate()
        pytest.fail(f"the job hung: rank 0 still waited {TIMEOUT} s after rank 1 raised\n"
                    f"{out}{err}"[-3000:])
    ended = time.time()
    assert proc.returncode != 0, out + err
    assert ended - float(stamp.read_text()) < 10, "the job outlived the failing rank by 10 s"
    assert "ValueError: matmul: shapes (2, 3) and (4, 5) are not aligned" in err, err[-3000:]
    assert "rank 1 of 2 raised ValueError; aborting the job" in err, err[-3000:]
