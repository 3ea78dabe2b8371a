"""The benchmark scripts run end to end (tiny sizes, one repeat)."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import numbagrad as ng

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import bench  # noqa: E402

QUICK = ["--cases", "tiny", "--dtypes", "float64", "--repeats", "1", "--min-time", "0",
         "--no-first-step", "--no-dp"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_bench_reports_every_system_and_ratio(tmp_path, device, capsys):
    if device == "cuda" and not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    out = tmp_path / "bench.json"
    bench.main(QUICK + ["--device", device, "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["case"], r["optimizer"]) for r in rows] == [("tiny", "sgd"), ("tiny", "adam")]
    for row in rows:
        assert row["numbagrad"]["best_s"] > 0 and row["numpy"]["best_s"] > 0
        assert row["numbagrad"]["median_s"] >= row["numbagrad"]["best_s"]
    printed = capsys.readouterr().out
    assert "ng/numpy" in printed and "x " in printed
    if device == "cpu":
        assert rows[0]["floor"]["best_s"] > 0 and "numbagrad_bytes" in rows[0]


@pytest.mark.parametrize("opt_kind", ["sgd", "adam"])
def test_bench_peers_compute_the_same_update(opt_kind):
    # The peers must do the same math, or the ratios compare nothing.
    steps = [bench.numbagrad_step("small", "float64", opt_kind, "cpu"),
             bench.numpy_step("small", "float64", opt_kind, "cpu")]
    if bench.torch is not None:
        steps.append(bench.torch_step("small", "float64", opt_kind, "cpu"))
    for _ in range(3 * bench.K):
        for step in steps:
            step()
    want = steps[0].weights()
    assert not np.allclose(want, bench.problem("small", "float64")[0])
    for step in steps[1:]:
        np.testing.assert_allclose(step.weights(), want, rtol=1e-9, atol=1e-12)
