"""The scripts run end to end: the benchmark (tiny sizes, one round), its
timing and report machinery, its peers' agreement, and train_dp's convergence."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import numbagrad as ng

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import bench

QUICK = ["--cases", "tiny", "--dtypes", "float64", "--repeats", "1", "--min-time", "0",
         "--no-first-step", "--no-dp", "--no-torch-compile"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_bench_reports_every_system_ratio_legend_and_verdict(tmp_path, device, capsys):
    if device == "cuda" and not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    out = tmp_path / "bench.json"
    # the CPU run also starts the optional peers' processes (tinygrad, autograd, mygrad)
    extra = [] if device == "cpu" else ["--no-extra-peers"]
    bench.main(QUICK + ["--device", device, "--json", str(out)] + extra)
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [(r["case"], r["optimizer"]) for r in rows] == [("tiny", "sgd"), ("tiny", "adam")]
    for row in rows:
        assert row["numbagrad"]["best_s"] > 0 and row["numpy"]["best_s"] > 0
        assert row["numbagrad"]["median_s"] >= row["numbagrad"]["best_s"]
        assert row["numbagrad"]["spread"] >= 0 and row["ratios"]["numbagrad/numpy"] > 0
        assert row["size"] == "linear 2x3 (d_out x d_in), batch 1, MSE"
    printed = capsys.readouterr().out
    assert "lower is better" in printed and "GEMMs a micro-step cannot avoid" in printed
    assert "best/med µs" in printed and "tiny: linear 2x3 (d_out x d_in), batch 1" in printed
    assert "Verdict" in printed and "tiny linear step" in printed
    assert {e["target"] for e in result["verdict"]} >= {"tiny linear step", "large linear step"}
    vs_numpy = next(e for e in result["verdict"] if e["case"] == "tiny" and e["peer"] == "numpy")
    assert vs_numpy["status"] in ("met", "missed") and vs_numpy["ratio"] > 0
    assert result["machine"]["cores"] >= 1 and result["machine"]["versions"]["numpy"]
    if device == "cpu":
        assert rows[0]["floor"]["best_s"] > 0 and "numbagrad_bytes" in rows[0]
        for name in set(bench.EXTRA_PEERS) & set(result["peers"]):
            # timed, or (tinygrad without clang) the row says why not
            assert rows[0][name] or name in rows[0].get("errors", {}), name
    assert all(r["best_peer"] not in ("numbagrad", "numbagrad compiled", "floor")
               for r in rows) and "ng / best peer" in printed


PARENT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import bench
result = bench.main(sys.argv[2:])
print(json.dumps({"modules": sorted(m for m in ("numbagrad", "numba", "torch", "jax")
                                    if m in sys.modules),
                  "processes": result["machine"]["processes"],
                  "torch": result["rows"][0]["torch"]}))
"""


def test_each_peer_group_runs_in_a_process_of_its_own(tmp_path):
    # The parent imports no peer library; every group reports its own pid,
    # BLAS libraries and kernel; PyTorch's row says how many threads it kept.
    pytest.importorskip("torch")
    run = subprocess.run([sys.executable, "-c", PARENT, str(ROOT / "scripts"), *QUICK,
                          "--optimizers", "sgd"], capture_output=True, text=True,
                         timeout=600, check=False, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["modules"] == []
    procs = out["processes"]
    assert {"numbagrad", "numpy", "torch"} <= set(procs)
    pids = [p["pid"] for p in procs.values()]
    assert len(set(pids)) == len(pids) and os.getpid() not in pids
    ng_blas = [lib for lib in procs["numbagrad"]["blas"] if lib["user_api"] == "blas"]
    assert ng_blas and all(lib["architecture"] for lib in ng_blas)
    cores = os.cpu_count() or 1
    assert set(out["torch"]["tried_s"]) == {str(n) for n in {1, min(2, cores), cores}}
    assert str(out["torch"]["threads"]) in out["torch"]["tried_s"]
    assert "each peer group in a process of its own" in run.stdout


def test_a_forced_blas_kernel_is_reported_and_left_out(monkeypatch):
    pytest.importorskip("threadpoolctl")
    native = bench.blas_kernels({k: v for k, v in os.environ.items()
                                 if k not in bench.BLAS_ENV})
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Prescott")       # SSE3: older than any CI CPU
    forced = bench.blas_kernels(dict(os.environ))
    assert forced and native and forced != native
    env, report = bench.blas_environment(keep=False)
    assert "OPENBLAS_CORETYPE" not in env and report["removed"]
    assert report["forced"] == forced and report["native"] == native
    assert "Prescott" in report["warning"] and "--keep-blas-env" in report["warning"]
    assert bench.blas_kernels(env) == native
    env, report = bench.blas_environment(keep=True)
    assert env["OPENBLAS_CORETYPE"] == "Prescott" and not report["removed"]
    assert "kept" in report["warning"]
    monkeypatch.delenv("OPENBLAS_CORETYPE")
    monkeypatch.delenv("OPENBLAS_L2_SIZE", raising=False)
    env, report = bench.blas_environment(keep=False)
    assert report["warning"] is None and env == dict(os.environ)


def test_the_floor_calls_scipys_blas_in_place():
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        a, b = rng.normal(size=(5, 7)).astype(dtype), rng.normal(size=(7, 3)).astype(dtype)
        for x, y in [(a, b), (a.T.copy().T, b), (a, b.T.copy().T)]:
            out = np.full((5, 3), np.nan, dtype)
            bench.scipy_gemm(x, y, out)()
            np.testing.assert_allclose(out, a @ b, rtol=1e-5 if dtype == np.float32 else 1e-12)


def test_the_floor_takes_each_gemm_on_its_faster_thread_count():
    """``faster`` keeps the call whose best timed run is the shortest (a fake
    clock: one candidate is slow only in its first trials, one always)."""
    import bench_peers
    now, runs = [0.0], {"a": 0, "b": 0}

    def timed(name, costs):
        def call():
            runs[name] += 1
            now[0] += costs(runs[name])
        return call
    a = timed("a", lambda k: 5.0 if k < 4 else 1.0)   # its best: 1.0
    b = timed("b", lambda k: 2.0)
    assert bench_peers.faster([a, b], trials=5, clock=lambda: now[0]) is a
    assert runs == {"a": 6, "b": 6}                     # a warm-up call + 5 trials each
    assert bench_peers.faster([b, a], trials=2, clock=lambda: now[0]) is a
    assert bench_peers.faster([b], trials=1, clock=lambda: now[0]) is b


def test_bench_repeat_flag_and_its_old_spelling():
    assert bench.parse(["--repeat", "7"]).repeats == 7
    assert bench.parse(["--repeats", "7"]).repeats == 7
    quick = bench.parse(["--quick"])
    assert "mlp-small" in quick.cases and "mlp-large" in quick.cases
    assert bench.rows_of("large", ["float32", "float64"], ["sgd"], quick=True) == [
        ("float32", "sgd")]
    assert bench.rows_of("mlp-small", ["float64"], ["sgd"]) == [bench.MLP_ROW]


def test_cases_take_commas_and_spaces_and_refuse_unknown_names(capsys):
    assert bench.parse(["--cases", "gpt,cnn"]).cases == ["gpt", "cnn"]
    assert bench.parse(["--cases", "tiny", "cnn,dqn"]).cases == ["tiny", "cnn", "dqn"]
    with pytest.raises(SystemExit):
        bench.parse(["--cases", "cnn,nope"])
    assert "unknown case nope" in capsys.readouterr().err


def test_peers_are_timed_interleaved_round_by_round():
    calls = []

    def peer(name):
        def fn():
            calls.append(name)
        return fn
    stats = bench.interleaved({n: peer(n) for n in "ABC"}, repeats=3, min_time=0,
                              sync=lambda: None)
    timed = calls[-3 * 3 * bench.K:]           # the rounds, after warm-up and calibration
    runs = [timed[i] for i in range(0, len(timed), bench.K)]
    assert runs == list("ABC" "BCA" "CAB")
    for s in stats.values():
        assert len(s["samples_s"]) == 3 and s["calls_per_sample"] % bench.K == 0
        assert s["best_s"] <= s["q1_s"] <= s["median_s"] <= s["q3_s"]


def test_noisy_rows_are_marked_and_the_run_ends_with_a_warning(monkeypatch, capsys):
    # A fake peer that stalls every other sample, and one faster than the floor.
    state = {"n": 0}

    def make(delay_s):
        def fn():
            until = time.perf_counter() + delay_s
            while time.perf_counter() < until:
                pass
        return lambda *args: fn

    def jittery(*args):
        def fn():
            state["n"] += 1
            time.sleep(0.002 if (state["n"] // bench.K) % 2 else 0)
        return fn
    monkeypatch.setattr(bench, "PEERS", {"numbagrad": jittery, "numpy": make(1e-5),
                                         "floor": make(2e-5)})
    monkeypatch.setattr(bench, "available_peers", lambda **kw: ["numbagrad", "numpy", "floor"])
    monkeypatch.setattr(bench, "one_blas_thread", lambda fn: None)
    result = bench.main(["--cases", "large", "--dtypes", "float32", "--optimizers", "sgd",
                         "--repeat", "4", "--min-time", "0", "--no-first-step", "--no-dp",
                         "--in-process"])
    row = result["rows"][0]
    assert any("numpy below its floor" in f for f in row["flags"]), row["flags"]
    printed = capsys.readouterr().out
    assert "WARNING: the machine was noisy" in printed and "--repeat 9" in printed
    table_row = next(ln for ln in printed.splitlines() if ln.startswith("float32 sgd"))
    assert table_row.rstrip().endswith("!")
    measured = [e for e in result["verdict"] if e["ratio"] is not None]
    assert measured and all(e["case"] == "large" and e["noisy"] for e in measured)


def test_blas_threads_stalling_mark_the_row(monkeypatch, capsys):
    # The floor on one BLAS thread beating the floor on all threads means the
    # threads wait for cores that others hold: the row is unreliable.
    def busy(delay_s):
        def fn():
            until = time.perf_counter() + delay_s
            while time.perf_counter() < until:
                pass
        return fn
    monkeypatch.setattr(bench, "PEERS", {"numbagrad": lambda *a: busy(4e-5),
                                         "floor": lambda *a: busy(2e-5)})
    monkeypatch.setattr(bench, "available_peers", lambda **kw: ["numbagrad", "floor"])
    monkeypatch.setattr(bench, "one_blas_thread", lambda fn: busy(1e-5))
    result = bench.main(["--cases", "large", "--dtypes", "float32", "--optimizers", "sgd",
                         "--repeat", "3", "--min-time", "0", "--no-first-step", "--no-dp",
                         "--in-process"])
    row = result["rows"][0]
    assert any("BLAS threads stalled" in f for f in row["flags"]), row["flags"]
    assert row["floor_1_thread"]["best_s"] < row["floor"]["best_s"]
    assert "--threads 1" in capsys.readouterr().out


def test_bench_writes_a_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "bench.png"
    bench.main(QUICK + ["--optimizers", "sgd", "--no-extra-peers", "--plot", str(out)])
    assert out.stat().st_size > 10_000


PEER_CASES = [("small", "float64", "sgd"), ("small", "float64", "adam"),
              ("mlp-small", "float64", "sgd"), ("mlp-small", "float64", "adam"),
              ("mlp-large", "float64", "adam")]
PEER_CASES += [("attention", "float64", "adam")]


@pytest.mark.parametrize("case,dtype,opt_kind", PEER_CASES)
def test_bench_peers_compute_the_same_update(case, dtype, opt_kind):
    # The peers must do the same math from the same weights, or the ratios
    # compare nothing: numbagrad, NumPy, PyTorch and JAX agree after 2-3 windows.
    names = ["numbagrad", "numbagrad compiled", "numpy", "torch", "jax"]
    if (case, opt_kind) == ("small", "adam"):
        names.append("torch compiled")       # inductor compiles for ~10-40 s: one case
    steps = {n: bench.PEERS[n](case, np.dtype(dtype), opt_kind, "cpu") for n in names}
    steps = {n: s for n, s in steps.items() if s is not None}
    assert {"numbagrad", "numpy"} <= set(steps)
    for _ in range((2 if case == "mlp-large" else 3) * bench.K):
        for step in steps.values():
            step()
    want = steps["numpy"].weights()
    start = bench.initial_weights(case, dtype)
    assert [w.shape for w in want] == [w.shape for w in start]
    assert not np.allclose(want[0], start[0])
    tol = {"rtol": 1e-9, "atol": 1e-12}
    for name, step in steps.items():
        got = step.weights()
        assert len(got) == len(want), name
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, **tol, err_msg=name)


def test_floor_runs_the_unavoidable_gemms():
    assert len(bench.floor_gemms("large", np.float32)) == 2
    # 784-1024-1024-10: 3 forward products, 3 weight gradients, 2 hidden gradients
    gemms = bench.floor_gemms("mlp-large", np.float32)
    assert len(gemms) == 8
    for a, b, out in gemms:
        assert (a.shape[0], b.shape[1]) == out.shape and a.shape[1] == b.shape[0]


def test_bench_cnn_case_runs_and_reports_its_verdict(tmp_path, capsys):
    # One round of the cnn row in the peer processes: every peer that can run
    # is timed, the NumPy loop is n/a, and the compiled-vs-PyTorch target is judged.
    out = tmp_path / "bench.json"
    bench.main(["--cases", "cnn", "--repeats", "1", "--min-time", "0", "--no-first-step",
                "--no-dp", "--no-torch-compile", "--json", str(out)])
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert (row["case"], row["dtype"], row["optimizer"]) == ("cnn", *bench.MLP_ROW)
    timed = ["numbagrad", "numbagrad compiled", "floor"] + ["torch"] * ("torch" in
                                                                       result["peers"])
    for name in timed:
        assert row[name]["best_s"] > 0, name
    assert row["numpy"] is None and "numbagrad/numpy" not in row["ratios"]
    printed = capsys.readouterr().out
    assert "cnn: CNN 1x8x8: conv3x3 16, ReLU, maxpool 2, conv3x3 32" in printed
    assert "linear 128-10; batch 64" in printed
    entries = {e["peer"]: e for e in result["verdict"] if e["case"] == "cnn"}
    assert {p: (e["target"], e["subject"], e["limit"]) for p, e in entries.items()} == {
        "torch": ("cnn, compiled", "numbagrad compiled", 0.5),
        "floor": ("cnn, compiled", "numbagrad compiled", 1.5)}
    assert entries["floor"]["ratio"] == pytest.approx(row["numbagrad compiled"]["best_s"]
                                                      / row["floor"]["best_s"])
    entry = entries["torch"]
    if "torch" in result["peers"]:
        assert entry["status"] in ("met", "missed")
        assert entry["ratio"] == pytest.approx(row["numbagrad compiled"]["best_s"]
                                               / row["torch"]["best_s"])
        assert "cnn, compiled" in printed and "/ PyTorch eager" in printed


def test_the_compiled_vs_eager_target_takes_the_worst_clean_row_of_every_case(capsys):
    def row(case, eager, compiled, flags=()):
        return {"case": case, "dtype": "float32", "optimizer": "adam", "flags": list(flags),
                "ratios": {}, "numbagrad": {"best_s": eager},
                "numbagrad compiled": None if compiled is None else {"best_s": compiled}}
    peers = ["numbagrad", "numbagrad compiled"]
    rows = [row("tiny", 8e-6, 4e-6), row("cnn", 1e-3, 1.2e-3),
            row("dqn", 1e-4, 3e-4, ["torch spread 40%"]), row("gpt", 1e-2, None)]
    (entry,) = [e for e in bench.verdict(rows, peers) if e["peer"] == "numbagrad"]
    assert (entry["target"], entry["limit"], entry["status"]) == (
        "compiled vs eager, every case", 1.0, "missed")
    assert entry["ratio"] == pytest.approx(1.2) and entry["rows"] == 2
    assert entry["noisy_rows_left_out"] == 1 and entry["best_row_ratio"] == pytest.approx(0.5)
    bench.print_verdict([entry])
    assert "numbagrad compiled / numbagrad eager" in capsys.readouterr().out
    (entry,) = [e for e in bench.verdict(rows[:1], peers) if e["peer"] == "numbagrad"]
    assert entry["status"] == "met" and entry["ratio"] == pytest.approx(0.5)
    (entry,) = [e for e in bench.verdict([], peers) if e["peer"] == "numbagrad"]
    assert entry["status"] == "not measured"
    bench.print_verdict([entry])
    assert "not measured (no case run)" in capsys.readouterr().out


def test_bench_cnn_peers_compute_the_same_update():
    # numbagrad (eager and compiled), PyTorch and JAX train the same CNN from
    # the same weights: after two windows they agree (PyTorch the reference).
    pytest.importorskip("torch")
    names = ["numbagrad", "numbagrad compiled", "numpy", "torch", "jax"]
    steps = {n: bench.PEERS[n]("cnn", np.dtype(np.float64), "adam", "cpu") for n in names}
    assert steps["numpy"] is None                   # no hand-written NumPy CNN
    steps = {n: s for n, s in steps.items() if s is not None}
    assert {"numbagrad", "numbagrad compiled", "torch"} <= set(steps)
    for _ in range(2 * bench.K):
        for step in steps.values():
            step()
    want = steps["torch"].weights()
    start = bench.initial_weights("cnn", np.float64)
    assert [w.shape for w in want] == [(16, 1, 3, 3), (16,), (32, 16, 3, 3), (32,), (10, 128),
                                       (10,)] == [w.shape for w in start]
    assert all(not np.allclose(w, s) for w, s in zip(want, start))
    for name, step in steps.items():
        for got, w in zip(step.weights(), want, strict=True):
            np.testing.assert_allclose(got, w, rtol=1e-9, atol=1e-12, err_msg=name)
    # im2col GEMMs: 2 + 3 for the convolutions, 3 for the linear layer
    gemms = bench.floor_gemms("cnn", np.float32)
    assert len(gemms) == 8
    for a, b, out in gemms:
        assert (a.shape[0], b.shape[1]) == out.shape and a.shape[1] == b.shape[0]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_train_dp_defaults_converge_in_one_process(tmp_path, optimizer):
    pytest.importorskip("mpi4py")
    out = tmp_path / "result.json"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "train_dp.py"),
                          "--optimizer", optimizer, "--json", str(out)],
                         capture_output=True, text=True, timeout=120, check=False,
                         env=dict(os.environ, OPENBLAS_NUM_THREADS="1"),
                         stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    assert result["final_loss"] * 10 <= result["initial_loss"]
    assert result["losses"][-1] * 10 <= result["losses"][0]
    assert result["final_loss"] == pytest.approx(result["reference_final_loss"], rel=1e-9)
    assert "single-process full-batch final loss" in run.stdout


def test_compare_versions_times_two_trees_interleaved():
    # the same tree twice: every row is reported with both timings and a ratio
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_versions.py"),
                          str(ROOT), str(ROOT), "--rounds", "2", "--quick"],
                         capture_output=True, text=True, timeout=600, check=False,
                         stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line.split() for line in run.stdout.splitlines()[1:]]
    assert [r[0] for r in rows] == ["tiny/sgd/eager", "tiny/sgd/compiled"]
    for r in rows:
        old, new = (float(v) for v in r[1].split("/")[0:1] + r[2].split("/")[0:1])
        assert old > 0 and new > 0 and float(r[3].rstrip(",")) == pytest.approx(new / old,
                                                                                 rel=1e-2)


# --- dqn
def test_bench_dqn_case_runs_and_reports_its_verdict(tmp_path, capsys):
    # One round of the dqn row in the peer processes (quick: no torch.compile): both
    # compiled targets are judged, against PyTorch eager and JAX jit.
    assert "dqn" in bench.parse(["--quick"]).cases
    out = tmp_path / "bench.json"
    bench.main(["--cases", "dqn", "--repeats", "1", "--min-time", "0", "--no-first-step",
                "--no-dp", "--no-torch-compile", "--json", str(out)])
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert (row["case"], row["dtype"], row["optimizer"]) == ("dqn", *bench.MLP_ROW)
    for name in ["numbagrad", "numbagrad compiled", "floor"] + [
            p for p in ("torch", "jax") if p in result["peers"]]:
        assert row[name]["best_s"] > 0, name
    assert row["numpy"] is None
    printed = capsys.readouterr().out
    assert "dqn: DQN update, Q-network 4-64-64-2 (ReLU), batch 64: gather Q(s, a)" in printed
    entries = {e["peer"]: e for e in result["verdict"] if e["case"] == "dqn"}
    assert {p: (e["target"], e["subject"], e["limit"]) for p, e in entries.items()} == {
        "torch": ("dqn, compiled", "numbagrad compiled", 0.10),
        "jax": ("dqn, compiled", "numbagrad compiled", 0.50)}
    for peer, entry in entries.items():
        if peer in result["peers"]:
            assert entry["status"] in ("met", "missed")
            assert entry["ratio"] == pytest.approx(row["numbagrad compiled"]["best_s"]
                                                   / row[peer]["best_s"])
    if "torch" in result["peers"]:
        assert "dqn, compiled" in printed and "/ PyTorch eager" in printed


def test_bench_dqn_peers_compute_the_same_update():
    # numbagrad (eager and compiled), PyTorch and JAX run the same DQN update from the
    # same weights and batch (the target network fixed): after two windows they agree.
    pytest.importorskip("torch")
    names = ["numbagrad", "numbagrad compiled", "numpy", "torch", "jax"]
    steps = {n: bench.PEERS[n]("dqn", np.dtype(np.float64), "adam", "cpu") for n in names}
    assert steps.pop("numpy") is None                 # no hand-written NumPy DQN
    steps = {n: s for n, s in steps.items() if s is not None}
    assert {"numbagrad", "numbagrad compiled", "torch"} <= set(steps)
    for _ in range(2 * bench.K):
        for step in steps.values():
            step()
    want = steps["torch"].weights()
    start = bench.initial_weights("dqn", np.float64)
    assert [w.shape for w in want] == [(64, 4), (64,), (64, 64), (64,), (2, 64), (2,)] == \
        [w.shape for w in start]
    assert all(not np.allclose(w, s) for w, s in zip(want, start))
    for name, step in steps.items():
        for got, w in zip(step.weights(), want, strict=True):
            np.testing.assert_allclose(got, w, rtol=1e-9, atol=1e-12, err_msg=name)
    # Q(s) and Q_target(s2): 3 + 3 forward products; 3 weight and 2 hidden gradients
    gemms = bench.floor_gemms("dqn", np.float32)
    assert len(gemms) == 11
    for a, b, out in gemms:
        assert (a.shape[0], b.shape[1]) == out.shape and a.shape[1] == b.shape[0]


# --- gpt: the char GPT case
# one block: the generated step's compile time grows with its length, and a
# second block adds no kind of call the first lacks
TINY_GPT = {"kind": "gpt", "vocab": 13, "batch": 2, "block": 8, "n_layer": 1, "n_head": 2,
            "n_embd": 16}


def test_bench_gpt_case_runs_and_reports_its_verdict(monkeypatch, capsys):
    # The gpt row at a tiny size, timed in this process (one round): every peer
    # that can run is timed, the NumPy loop is n/a, and both gpt targets are judged.
    assert bench.CASES["gpt"]["n_embd"] == 128 and "gpt" not in bench.QUICK_CASES
    monkeypatch.setitem(bench.CASES, "gpt", TINY_GPT)
    args = bench.parse(["--cases", "gpt", "--repeats", "1", "--min-time", "0", "--in-process"])
    peers = [p for p in bench.available_peers(torch_compile=False)
             if p not in ("numpy", *bench.EXTRA_PEERS)]      # those run linear and MLP cases
    row = bench.measure_row("gpt", *bench.MLP_ROW, args, peers + ["numpy"])
    assert (row["case"], row["dtype"], row["optimizer"]) == ("gpt", *bench.MLP_ROW)
    for name in peers:
        assert row[name]["best_s"] > 0, name
    assert row["numpy"] is None and "numbagrad/numpy" not in row["ratios"]
    assert bench.describe("gpt") == ("char GPT 1 layers x 2 heads x 16, vocab 13, batch 2 x 8, "
                                     "AdamW + clipping")
    entries = {e["peer"]: e for e in bench.verdict([row], peers) if e["case"] == "gpt"}
    assert {p: (e["target"], e["subject"], e["limit"]) for p, e in entries.items()} == {
        "floor": ("gpt, compiled", "numbagrad compiled", 1.15),
        "torch": ("gpt, compiled", "numbagrad compiled", 0.6),
        "jax": ("gpt, compiled", "numbagrad compiled", 1.0)}
    for peer, entry in entries.items():
        if peer in peers:
            assert entry["ratio"] == pytest.approx(row["numbagrad compiled"]["best_s"]
                                                   / row[peer]["best_s"])
            assert entry["status"] in ("met", "missed")
    bench.print_verdict(list(entries.values()))
    assert "gpt, compiled" in capsys.readouterr().out


def test_bench_gpt_peers_compute_the_same_update(monkeypatch):
    # numbagrad (eager and compiled), PyTorch and JAX train the same GPT from the
    # same weights and batch with the same AdamW and clipping: two windows agree.
    pytest.importorskip("torch")
    monkeypatch.setitem(bench.CASES, "gpt", TINY_GPT)
    names = ["numbagrad", "numbagrad compiled", "numpy", "torch", "jax"]
    steps = {n: bench.PEERS[n]("gpt", np.dtype(np.float64), "adam", "cpu") for n in names}
    assert steps["numpy"] is None                   # no hand-written NumPy transformer
    steps = {n: s for n, s in steps.items() if s is not None}
    for _ in range(2 * bench.K):
        for step in steps.values():
            step()
    want = steps["torch"].weights()
    start = bench.initial_weights("gpt", np.float64)
    assert len(want) == len(start) == 2 + 1 * 12 + 2
    assert all(not np.array_equal(w, s) for w, s in zip(want, start))
    for name, step in steps.items():
        # JAX's clip_by_global_norm divides by the norm, PyTorch's by norm + 1e-6
        atol = 1e-9 if name == "jax" else 1e-12
        for got, w in zip(step.weights(), want, strict=True):
            np.testing.assert_allclose(got, w, rtol=1e-9, atol=atol, err_msg=name)
    # per layer 4 linear layers x 3 GEMMs and 6 per attention slice (batch x heads),
    # then the head's 3
    assert len(bench.floor_gemms("gpt", np.float32)) == 1 * (12 + 6 * 2 * 2) + 3


def test_bench_contention_times_serial_and_default_beside_busy_loops(tmp_path):
    out = tmp_path / "contention.json"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_contention.py"),
                          "--cases", "attention", "--repeats", "1", "--min-time", "0.01",
                          "--busy", "1", "--variants", "default", "--json", str(out)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(out.read_text())
    rows = got["cases"]["attention"]
    assert set(rows) == {"busy=0", "busy=1"}
    for row in rows.values():
        assert set(row) == {"serial", "default"}
        assert all(v["median_s"] > 0 for v in row.values())
    assert "/ serial" in run.stdout and "busy=1" in run.stdout


# --- lstm: the LSTM case
TINY_LSTM = {"kind": "lstm", "input": 3, "hidden": 4, "num_layers": 2, "seq": 3, "batch": 2,
             "out": 2}


def test_bench_lstm_case_runs_and_reports_its_verdict(monkeypatch, capsys):
    # The lstm row at a tiny size, timed in this process (one round): every peer
    # that can run is timed, the NumPy loop is n/a, and the compiled target is judged.
    assert bench.CASES["lstm"]["hidden"] == 128 and "lstm" not in bench.QUICK_CASES
    monkeypatch.setitem(bench.CASES, "lstm", TINY_LSTM)
    args = bench.parse(["--cases", "lstm", "--repeats", "1", "--min-time", "0", "--in-process"])
    peers = [p for p in bench.available_peers(torch_compile=False)
             if p not in ("numpy", *bench.EXTRA_PEERS)]      # those run linear and MLP cases
    row = bench.measure_row("lstm", *bench.MLP_ROW, args, peers + ["numpy"])
    assert (row["case"], row["dtype"], row["optimizer"]) == ("lstm", *bench.MLP_ROW)
    for name in peers:
        assert row[name]["best_s"] > 0, name
    assert row["numpy"] is None and "numbagrad/numpy" not in row["ratios"]
    assert bench.describe("lstm") == ("LSTM 2 layers x 4 hidden, input 3, seq 3 x batch 2, "
                                      "linear 4-2 on the last step, MSE")
    entries = [e for e in bench.verdict([row], peers) if e["case"] == "lstm"]
    assert [(e["target"], e["subject"], e["peer"], e["limit"]) for e in entries] == [
        ("lstm, compiled", "numbagrad compiled", "torch", 0.8)]
    if "torch" in peers:
        assert entries[0]["ratio"] == pytest.approx(row["numbagrad compiled"]["best_s"]
                                                    / row["torch"]["best_s"])
        assert entries[0]["status"] in ("met", "missed")
    bench.print_verdict(entries)
    assert "lstm, compiled" in capsys.readouterr().out


def test_bench_lstm_peers_compute_the_same_update(monkeypatch):
    # numbagrad (eager and compiled), PyTorch and JAX train the same LSTM from the
    # same weights and batch with Adam: after two windows they agree.
    pytest.importorskip("torch")
    monkeypatch.setitem(bench.CASES, "lstm", TINY_LSTM)
    names = ["numbagrad", "numbagrad compiled", "numpy", "torch", "jax"]
    steps = {n: bench.PEERS[n]("lstm", np.dtype(np.float64), "adam", "cpu") for n in names}
    assert steps.pop("numpy") is None                 # no hand-written NumPy LSTM
    steps = {n: s for n, s in steps.items() if s is not None}
    assert {"numbagrad", "numbagrad compiled", "torch"} <= set(steps)
    for _ in range(2 * bench.K):
        for step in steps.values():
            step()
    want = steps["torch"].weights()
    start = bench.initial_weights("lstm", np.float64)
    assert [w.shape for w in want] == [(16, 3), (16, 4), (16,), (16,), (16, 4), (16, 4), (16,),
                                       (16,), (2, 4), (2,)] == [w.shape for w in start]
    assert all(not np.allclose(w, s) for w, s in zip(want, start))
    for name, step in steps.items():
        for got, w in zip(step.weights(), want, strict=True):
            np.testing.assert_allclose(got, w, rtol=1e-9, atol=1e-12, err_msg=name)
    # per layer 2 (3 above the first) projection GEMMs, 2 per step after the first and
    # dW_hh's one over those steps, then the head's 3
    assert len(bench.floor_gemms("lstm", np.float32)) == 2 + 3 + 2 * (2 * 2 + 1) + 3


def test_bench_fusion_times_three_compiled_twins_with_the_same_bits(capsys):
    import bench_fusion
    from numbagrad.compile import fusion
    rows = bench_fusion.main(["--width", "64", "--batch", "64", "--layers", "1", "--rounds", "2",
                              "--calls", "1"])
    assert [r["step"] for r in rows] == ["unfused", "fused", "fused+fold"]
    assert all(r["same_bits"] and r["ms"] > 0 for r in rows)
    assert rows[0]["ratio"] == 1.0 and fusion.FOLD is True
    assert "the same bits in all three: True" in capsys.readouterr().out
