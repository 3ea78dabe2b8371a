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
         "--no-first-step", "--no-dp"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_bench_reports_every_system_ratio_legend_and_verdict(tmp_path, device, capsys):
    if device == "cuda" and not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    out = tmp_path / "bench.json"
    bench.main(QUICK + ["--device", device, "--json", str(out)])
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


def test_bench_repeat_flag_and_its_old_spelling():
    assert bench.parse(["--repeat", "7"]).repeats == 7
    assert bench.parse(["--repeats", "7"]).repeats == 7
    quick = bench.parse(["--quick"])
    assert "mlp-small" in quick.cases and "mlp-large" in quick.cases
    assert bench.rows_of("large", ["float32", "float64"], ["sgd"], quick=True) == [
        ("float32", "sgd")]
    assert bench.rows_of("mlp-small", ["float64"], ["sgd"]) == [bench.MLP_ROW]


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
    monkeypatch.setattr(bench, "available_peers", lambda: ["numbagrad", "numpy", "floor"])
    result = bench.main(["--cases", "tiny", "--dtypes", "float32", "--optimizers", "sgd",
                         "--repeat", "4", "--min-time", "0", "--no-first-step", "--no-dp"])
    row = result["rows"][0]
    assert any("numpy below its floor" in f for f in row["flags"]), row["flags"]
    printed = capsys.readouterr().out
    assert "WARNING: the machine was noisy" in printed and "--repeat 9" in printed
    table_row = next(ln for ln in printed.splitlines() if ln.startswith("float32 sgd"))
    assert table_row.rstrip().endswith("!")
    assert result["verdict"][0]["noisy"]


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
    monkeypatch.setattr(bench, "available_peers", lambda: ["numbagrad", "floor"])
    monkeypatch.setattr(bench, "one_blas_thread", lambda fn: busy(1e-5))
    result = bench.main(["--cases", "large", "--dtypes", "float32", "--optimizers", "sgd",
                         "--repeat", "3", "--min-time", "0", "--no-first-step", "--no-dp"])
    row = result["rows"][0]
    assert any("BLAS threads stalled" in f for f in row["flags"]), row["flags"]
    assert row["floor_1_thread"]["best_s"] < row["floor"]["best_s"]
    assert "--threads 1" in capsys.readouterr().out


def test_bench_writes_a_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "bench.png"
    bench.main(QUICK + ["--optimizers", "sgd", "--plot", str(out)])
    assert out.stat().st_size > 10_000


PEER_CASES = [("small", "float64", "sgd"), ("small", "float64", "adam"),
              ("mlp-small", "float64", "sgd"), ("mlp-small", "float64", "adam"),
              ("mlp-large", "float64", "adam")]


@pytest.mark.parametrize("case,dtype,opt_kind", PEER_CASES)
def test_bench_peers_compute_the_same_update(case, dtype, opt_kind):
    # The peers must do the same math from the same weights, or the ratios
    # compare nothing: numbagrad, NumPy, PyTorch and JAX agree after 2-3 windows.
    names = ["numbagrad", "numbagrad compiled", "numpy", "torch", "jax"]
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
