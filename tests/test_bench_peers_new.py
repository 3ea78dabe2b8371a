"""The benchmark's optional peers (tinygrad, HIPS autograd, mygrad), its
ng / best peer verdict and ``--scaling`` (tiny sizes, one round)."""
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import bench
import bench_cases
import bench_scaling

EXTRA = ("tinygrad", "autograd", "mygrad")


@pytest.mark.parametrize("case,dtype,opt_kind,names", [
    ("tiny", "float64", "sgd", EXTRA),
    ("small", "float64", "adam", ("autograd", "mygrad")),
    ("mlp-small", "float64", "adam", ("autograd", "mygrad")),
])
def test_new_peers_compute_the_numpy_loops_update(case, dtype, opt_kind, names):
    # Each new peer trains from the same weights on the same data with the same
    # accumulate_steps=K update as the NumPy loop: after three windows they agree.
    # tinygrad keeps its learning rate and Adam's bias corrections in float32, so
    # it agrees to float32's precision only (and runs the tiny case: its kernels
    # compile with clang, seconds a case).
    if shutil.which("clang") is None:          # tinygrad's CPU backend compiles with clang
        names = tuple(n for n in names if n != "tinygrad")
    steps = {n: bench.PEERS[n](case, np.dtype(dtype), opt_kind, "cpu") for n in names}
    steps = {n: s for n, s in steps.items() if s is not None}
    if not steps:
        pytest.skip("none of tinygrad, autograd, mygrad installed")
    steps["numpy"] = bench.PEERS["numpy"](case, np.dtype(dtype), opt_kind, "cpu")
    for _ in range(3 * bench.K):
        for step in steps.values():
            step()
    for step in steps.values():
        getattr(step, "sync", lambda: None)()
    want = steps["numpy"].weights()
    start = bench.initial_weights(case, dtype)
    assert not np.allclose(want[0], start[0])
    for name, step in steps.items():
        tol = {"rtol": 1e-6, "atol": 1e-7} if name == "tinygrad" else {"rtol": 1e-9,
                                                                        "atol": 1e-12}
        got = step.weights()
        assert [g.shape for g in got] == [w.shape for w in want], name
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, **tol, err_msg=name)


def test_new_peers_run_the_linear_and_mlp_cases_only():
    args = bench.parse(["--cases", "tiny,cnn"])
    peers = ["numbagrad", "numpy", *EXTRA, "floor"]
    assert bench.peers_of("tiny", args, peers) == peers
    assert bench.peers_of("mlp-small", args, peers) == peers
    assert bench.peers_of("cnn", args, peers) == ["numbagrad", "numpy", "floor"]
    for name in EXTRA:
        assert bench.PEERS[name]("cnn", np.dtype(np.float32), "adam", "cpu") is None
        assert bench.PEERS[name]("tiny", np.dtype(np.float32), "adam", "cuda") is None
    # each in a process of its own
    assert all(bench.GROUPS[name] == (name,) for name in EXTRA)


def test_best_peer_leaves_out_the_subjects_and_the_floor():
    best = {"numbagrad": 1.0, "numbagrad compiled": 0.5, "floor": 0.1, "numpy": 4.0,
            "mygrad": 2.0, "torch": 8.0}
    peers = list(best)
    assert bench.best_peer(best, peers) == "mygrad"
    r = bench.ratios(best, peers)
    assert r["numbagrad/best peer"] == pytest.approx(0.5)
    assert r["numbagrad compiled/best peer"] == pytest.approx(0.25)
    assert r["numbagrad/mygrad"] == pytest.approx(0.5)
    assert bench.best_peer({"numbagrad": 1.0, "floor": 0.1}, ["numbagrad", "floor"]) is None
    assert "numbagrad/best peer" not in bench.ratios({"numbagrad": 1.0}, ["numbagrad"])


def test_bench_names_the_best_peer_of_each_row(tmp_path, monkeypatch, capsys):
    # In this process (one round, the fast NumPy-based peers): each row names its
    # fastest rival, the table and the verdict print ng / best peer.
    have = [p for p in ("autograd", "mygrad") if bench_cases.installed(p)]
    monkeypatch.setattr(bench, "available_peers",
                        lambda **kw: ["numbagrad", "numbagrad compiled", "numpy", *have,
                                      "floor"])
    out = tmp_path / "bench.json"
    bench.main(["--cases", "tiny", "--dtypes", "float64", "--optimizers", "sgd", "--repeats",
                "1", "--min-time", "0", "--no-first-step", "--no-dp", "--in-process",
                "--json", str(out)])
    result = json.loads(out.read_text())
    row, = result["rows"]
    rivals = ["numpy", *have]
    fastest = min(rivals, key=lambda n: row[n]["best_s"])
    assert row["best_peer"] == fastest
    assert row["ratios"]["numbagrad/best peer"] == pytest.approx(
        row["numbagrad"]["best_s"] / row[fastest]["best_s"])
    entry, = result["best_peer"]
    assert (entry["case"], entry["best_peer"]) == ("tiny", fastest)
    assert entry["numbagrad compiled"] == row["ratios"]["numbagrad compiled/best peer"]
    printed = capsys.readouterr().out
    assert "ng / best peer" in printed and "ng/best, best peer" in printed


def test_scaling_sweeps_cover_the_issues_ranges():
    sizes = {name: [n for _, n in s["cases"]] for name, s in bench.SWEEPS.items()}
    assert sizes["mlp batch"][0] == 1 and sizes["mlp batch"][-1] == 512
    assert sizes["gpt batch"][0] == 1 and sizes["gpt batch"][-1] == 512
    assert sizes["attention T"][0] == 64 and sizes["attention T"][-1] == 4096
    assert len(sizes["mlp width"]) > 1 and len(sizes["gpt width"]) > 1
    # the sweeps' cases are not in a plain run
    assert not any(bench.CASES[c].get("scaling") for c in bench.parse([]).cases)
    args = bench.parse(["--scaling"])
    assert (args.repeats, args.min_time) == (3, 0.01)
    assert bench_scaling.slope([1, 2, 4], [3.0, 12.0, 48.0]) == pytest.approx(2.0)
    assert bench_scaling.slope([1], [3.0]) is None


def test_scaling_times_each_point_with_its_memory_and_slope(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    sweeps = {}
    monkeypatch.setattr(bench_cases, "SWEEPS", sweeps)
    for case in ("mlp-batch-t1", "mlp-batch-t4"):
        monkeypatch.setitem(bench.CASES, case, {"kind": "mlp", "layers": (8, 6, 3),
                                                "batch": int(case[-1]), "scaling": True})
    sweeps["mlp batch"] = {"axis": "batch", "cases": [("mlp-batch-t1", 1), ("mlp-batch-t4", 4)]}
    monkeypatch.setattr(bench_scaling, "SWEEPS", sweeps)
    monkeypatch.setattr(bench, "scaling_peers", lambda: ["numbagrad", "numbagrad compiled"])
    out, png = tmp_path / "scaling.json", tmp_path / "scaling.png"
    bench.main(["--scaling", "--in-process", "--repeats", "1", "--min-time", "0",
                "--json", str(out), "--plot", str(png)])
    result = json.loads(out.read_text())
    sweep = result["sweeps"]["mlp batch"]
    assert [p["size"] for p in sweep["points"]] == [1, 4]
    for point in sweep["points"]:
        for name in ("numbagrad", "numbagrad compiled"):
            s = point[name]
            assert s["best_s"] > 0 and s["traced_bytes"] >= 0
            if s["peak_rss_bytes"] is not None:            # Linux
                assert s["peak_rss_bytes"] > 0 and s["window_rss_bytes"] >= 0
    for name in ("numbagrad", "numbagrad compiled"):
        fit = sweep["slopes"][name]["fit"]
        times = [p[name]["best_s"] for p in sweep["points"]]
        assert fit == pytest.approx(np.log(times[1] / times[0]) / np.log(4))
    assert png.stat().st_size > 10_000
    assert "slope" in capsys.readouterr().out
