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
    # a .grad without a step() on rank 1: a flush that finds every window empty
    # applies nothing and leaves each rank's .grad as it was (None on rank 0,
    # whose backward afterwards then gives the same gradient as rank 1's)
    def backward():
        with ng.grad_tape():
            loss = ng.mse_loss(W @ ng.tensor(x[:, :2]), ng.tensor(y[:, :2]))
        loss.backward()
    if rank == 1:
        backward()
    empty_with_grad = opt.flush()
    none = W.grad is None
    if rank == 0:
        backward()
    grad = np.array(W.grad).tolist()
    opt.zero_grad()
    flush = dict(w=W.numpy().tolist(), t=opt.t, empty=empty, calls=opt.allreduce_calls,
                 empty_with_grad=empty_with_grad, none=none == (rank == 0), grad=grad)

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
    # (an empty flush costs an allreduce too: it is how every rank learns that
    # every window is empty, matching whatever collective another rank is in)
    assert (got["t"], got["empty"], got["calls"]) == (2, False, 4)
    assert (got["empty_with_grad"], got["none"]) == (False, True)

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


def test_an_uncaught_exception_is_reported_in_one_write(monkeypatch):
    """The job's excepthook writes the traceback and its abort line at once:
    Python's own hook writes a traceback in pieces, and two ranks failing
    together interleaved theirs mid-line in mpiexec's output."""
    import numbagrad.distributed as dist

    class World:
        aborted = []

        def Get_rank(self):
            return 1

        def Get_size(self):
            return 2

        def Abort(self, code):
            self.aborted.append(code)

    class Stream:
        writes = []

        def write(self, text):
            self.writes.append(text)

        def flush(self):
            pass

    monkeypatch.setattr(dist, "MPI", type("FakeMPI", (), {"COMM_WORLD": World()}))
    monkeypatch.setattr(dist, "ABORT_DELAY", 0.0)
    monkeypatch.setattr(dist, "_previous_excepthook", None)
    monkeypatch.setattr(sys, "stderr", Stream())
    try:
        raise RuntimeError("rank 1 fails")
    except RuntimeError as exc:
        dist._abort_on_uncaught(RuntimeError, exc, exc.__traceback__)
    (text,) = Stream.writes
    assert text.startswith("Traceback (most recent call last):")
    assert text.endswith("RuntimeError: rank 1 fails\nnumbagrad.distributed: rank 1 of 2 "
                         "raised RuntimeError; aborting the job (MPI_Abort)\n")
    assert World.aborted == [1]


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


# ------------------------------------------ every rank's optimizer must be the same
HYPER = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[2])
import numbagrad as ng
import numbagrad.distributed as dist
from numbagrad.optim import schedules

comm = dist.init()
rank = dist.rank()
W0 = np.random.default_rng(0).normal(size=(2, 3))
mine = (lambda a, b: a if rank == 0 else b)
cases = {
    "lr": lambda W: ng.optim.SGD([W], lr=mine(0.1, 0.2)),
    "momentum": lambda W: ng.optim.SGD([W], lr=0.1, momentum=mine(0.9, 0.5)),
    "betas": lambda W: ng.optim.Adam([W], betas=mine((0.9, 0.999), (0.8, 0.999))),
    "eps": lambda W: ng.optim.Adam([W], eps=mine(1e-8, 1e-6)),
    "weight_decay": lambda W: ng.optim.AdamW([W], weight_decay=mine(0.01, 0.0)),
    "schedule": lambda W: ng.optim.SGD([W], lr=schedules.cosine(0.1, mine(100, 200))),
}
found = {}
for name, make in cases.items():
    try:
        dist.DistributedOptimizer(make(ng.param(W0)))
        found[name] = None
    except ValueError as exc:
        found[name] = str(exc)

# The same optimizer everywhere at construction, then rank 1 changes lr: the
# first window refuses to apply anything on every rank.
W = ng.param(W0)
opt = dist.DistributedOptimizer(ng.optim.SGD([W], lr=0.1, momentum=0.9, accumulate_steps=2))
if rank == 1:
    opt.lr = 0.3
try:
    for i in range(4):
        with ng.grad_tape():
            loss = ng.mse_loss(W @ ng.tensor(np.ones((3, 2)) * i), ng.tensor(np.zeros((2, 2))))
        loss.backward()
        opt.step()
    found["first window"] = None
except ValueError as exc:
    found["first window"] = str(exc)
found["w"] = W.numpy().tolist()
everyone = comm.gather(found, root=0)
if rank == 0:
    with open(sys.argv[1], "w") as fh:
        json.dump(everyone, fh)
"""


def test_ranks_must_agree_on_every_hyperparameter(tmp_path):
    script, out = tmp_path / "hyper.py", tmp_path / "hyper.json"
    script.write_text(HYPER)
    run = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "mpi4py", str(script),
                          str(out), str(ROOT)], env=dict(os.environ, **MPI_ENV),
                         capture_output=True, text=True, timeout=TIMEOUT,
                         stdin=subprocess.DEVNULL, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    ranks = json.loads(out.read_text())
    want = {
        "lr": r"ranks disagree on lr \(rank 0: 0\.1, rank 1: 0\.2\)",
        "momentum": r"ranks disagree on momentum \(rank 0: 0\.9, rank 1: 0\.5\)",
        "betas": r"ranks disagree on betas \(rank 0: \(0\.9, 0\.999\), rank 1: \(0\.8, 0\.999\)\)",
        "eps": r"ranks disagree on eps \(rank 0: 1e-08, rank 1: 1e-06\)",
        "weight_decay": r"ranks disagree on weight_decay \(rank 0: 0\.01, rank 1: 0\.0\)",
        "schedule": (r"ranks disagree on lr \(rank 0: \{'schedule': 'cosine', 'peak': 0\.1, "
                     r"'total_updates': 100, .*rank 1: \{.*'total_updates': 200"),
        "first window": r"ranks disagree on lr \(rank 0: 0\.1, rank 1: 0\.3\)",
    }
    for found in ranks:      # every rank raises, naming the value of each rank
        for case, message in want.items():
            assert found[case] and re.match(message, found[case]), (case, found[case])
        # and the first window applied nothing: the ranks have not diverged
        np.testing.assert_array_equal(found["w"], np.random.default_rng(0).normal(size=(2, 3)))


# --------------------- failing ranks, uneven data: every job ends, and ends quickly
UNEVEN = r"""
import json, sys, time
sys.path.insert(0, sys.argv[3])
import numpy as np
import numbagrad as ng
import numbagrad.distributed as dist

scenario, out = sys.argv[1], sys.argv[2]
if scenario == "before-init" and dist.MPI.COMM_WORLD.Get_rank() == 1:
    raise RuntimeError("rank 1 fails before init()")
comm = dist.init()
rank, size = dist.rank(), dist.size()


def batch(r, j, n=2):        # rank r's micro-batch j (n columns)
    rng = np.random.default_rng(1000 + 100 * r + j)
    return rng.normal(size=(3, n)), rng.normal(size=(2, n))


def train(opt, W, steps, samples=None):
    for j in range(steps):
        n = samples(rank, j) if samples else 2
        x, y = batch(rank, j, n)
        with ng.grad_tape():
            loss = ng.mse_loss(W @ ng.tensor(x), ng.tensor(y),
                               reduction="sum" if samples else "mean")
        loss.backward()
        if scenario == "exit" and rank == 1 and j == 3:
            sys.exit(0)      # a clean exit in the middle of a window
        if scenario == "timeout" and rank == 1 and j == 1:
            time.sleep(30)   # a rank that hangs
        opt.step(samples=n if samples else None)


W = ng.param(np.random.default_rng(0).normal(size=(2, 3)))
dist.broadcast_parameters([W])
opt = dist.DistributedOptimizer(ng.optim.SGD([W], lr=0.1, momentum=0.9, accumulate_steps=2))
if scenario in ("before-init", "exit"):
    train(opt, W, 8)
elif scenario == "timeout":
    dist.init(timeout=2)
    train(opt, W, 8)
elif scenario == "uneven":
    train(opt, W, [8, 7][rank])
elif scenario == "uneven-flush":
    train(opt, W, [8, 7][rank])
    opt.flush()
elif scenario == "join-one-rank":
    if rank == 0:
        with opt.join():
            train(opt, W, 4)
    else:
        train(opt, W, 6)
elif scenario == "join":
    # 8, 5 and 0 micro-steps of 2 columns; then micro-batches of 1 to 3 samples
    with opt.join():
        train(opt, W, [8, 5, 0][rank])
    V = ng.param(np.random.default_rng(0).normal(size=(2, 3)))
    adam = dist.DistributedOptimizer(ng.optim.Adam([V], lr=0.05, accumulate_steps=2,
                                                   average="samples"))
    with adam.join():
        train(adam, V, [3, 6, 1][rank], samples=lambda r, j: 1 + (r + j) % 3)
    mine = dict(w=W.numpy().tolist(), t=opt.t, calls=opt.allreduce_calls,
                v=V.numpy().tolist(), adam_t=adam.t, adam_calls=adam.allreduce_calls)
    everyone = comm.gather(mine, root=0)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(everyone, fh)
"""


def run_uneven(tmp_path, scenario, n=2, timeout=60):
    """Launch UNEVEN plainly (no -m mpi4py); (returncode, output, seconds)."""
    script, out = tmp_path / "uneven.py", tmp_path / f"{scenario}.json"
    script.write_text(UNEVEN)
    start = time.perf_counter()
    proc = subprocess.Popen([MPIEXEC, "-n", str(n), sys.executable, str(script), scenario,
                             str(out), str(ROOT)], env=dict(os.environ, **MPI_ENV), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)      # mpiexec and every rank
        output, _ = proc.communicate()
        pytest.fail(f"{scenario}: the job hung for {timeout} s\n{output}"[-3000:])
    return proc.returncode, output, time.perf_counter() - start, out


@pytest.mark.parametrize("scenario, messages", [
    ("before-init", [r"RuntimeError: rank 1 fails before init\(\)",
                     r"rank 1 of 2 raised RuntimeError; aborting the job"]),
    ("exit", [r"RuntimeError: the gradient allreduce of the window for update t=1 cannot "
              r"complete: rank 1 has left the job \(its script ended or called sys.exit\(\); "
              r"its SGD at t=1 with 1 micro-step\(s\) pending\) while rank 0 waits for it"]),
    ("uneven", [r"RuntimeError: the gradient allreduce of the window for update t=3 cannot "
                r"complete: rank 1 has left the job .*SGD at t=3 with 1 micro-step\(s\) "
                r"pending.*run every rank's loop inside `with opt.join\(\):`"]),
    ("uneven-flush", [r"RuntimeError: the ranks are out of step: rank 0 closes a window of 2 "
                      r"micro-steps \(t=3\); rank 1 calls flush\(\) with 1 of 2 micro-step\(s\) "
                      r"\(t=3\)\. Their data ran out at different micro-steps"] * 2),
    ("join-one-rank", [r"RuntimeError: a rank ran out of data inside join\(\), but not every "
                       r"rank is inside join\(\): rank 0 has left join\(\): its data ran out "
                       r"\(t=2\); rank 1 closes a window of 2 micro-steps \(t=2\)"] * 2),
    ("timeout", [r"RuntimeError: the first window's check that the ranks' optimizers agree "
                 r"waited 2\.\d s for the other ranks \(timeout 2 s"]),
])
def test_a_failing_or_uneven_rank_ends_the_job_within_seconds(tmp_path, scenario, messages):
    rc, output, seconds, _ = run_uneven(tmp_path, scenario)
    assert rc != 0, output[-3000:]
    for message in messages:
        assert re.search(message, output), output[-3000:]
    for message in set(messages):   # as often as expected: every rank, or the waiting one
        assert len(re.findall(message, output)) == messages.count(message), output[-3000:]
    assert seconds < 20, f"{scenario} took {seconds:.1f} s"


def test_join_trains_uneven_shards_as_one_process_over_the_same_windows(tmp_path):
    rc, output, seconds, out = run_uneven(tmp_path, "join", n=3)
    assert rc == 0, output[-3000:]
    ranks = json.loads(out.read_text())
    assert seconds < 20, f"join took {seconds:.1f} s"

    def windows(counts, n=lambda r, j: 2, samples=False):
        """Rank r's micro-batch j lands in window j // 2: one full batch per window."""
        cols = {}
        for r, count in enumerate(counts):
            for j in range(count):
                cols.setdefault(j // 2, []).append(_uneven_batch(r, j, n(r, j)))
        return [(np.hstack([x for x, _ in c]), np.hstack([y for _, y in c]),
                 sum(x.shape[1] for x, _ in c) if samples else None)
                for _, c in sorted(cols.items())]

    # 8, 5 and 0 micro-steps: windows of 4, 4, 3 (rank 1's last) and 2 micro-batches
    want, _ = single_process(lambda W: ng.optim.SGD([W], lr=0.1, momentum=0.9),
                             windows([8, 5, 0]))
    sizes = lambda r, j: 1 + (r + j) % 3       # noqa: E731
    want_v, _ = single_process(lambda W: ng.optim.Adam([W], lr=0.05, average="samples"),
                               windows([3, 6, 1], sizes, samples=True))
    for r in ranks:
        np.testing.assert_allclose(r["w"], want, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(r["v"], want_v, rtol=1e-10, atol=1e-12)
        # one allreduce per window on every rank, and one more that ends the join
        assert (r["t"], r["calls"], r["adam_t"], r["adam_calls"]) == (4, 5, 3, 4)


def _uneven_batch(r, j, n):
    rng = np.random.default_rng(1000 + 100 * r + j)
    return rng.normal(size=(3, n)), rng.normal(size=(2, n))
