"""scripts/train_mlp.py runs end to end, plots, checkpoints and resumes exactly."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")

from numbagrad.serialization import load

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
import train_mlp

# Small and quick: 1347 digits, 3 updates of 2 x 256 per epoch (the last one flushed short).
TINY = ["--hidden", "16", "--batch-size", "256", "--accumulate", "2", "--no-progress"]


def test_trains_prints_checkpoints_and_plots(tmp_path, capsys):
    ckpt, png = tmp_path / "run.npz", tmp_path / "curves.png"
    result = train_mlp.main(TINY + ["--epochs", "3", "--lr", "0.01", "--checkpoint", str(ckpt),
                                    "--plot", str(png)])
    out = capsys.readouterr().out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("epoch")] == \
        ["1/3", "2/3", "3/3"]
    assert "test acc" in out and "final test accuracy" in out
    history = result["history"]
    assert len(history["train_loss"]) == 3 and history["train_loss"][-1] < history["train_loss"][0]
    assert history["test_acc"][-1] > 0.5
    assert result["updates"] == 3 * 3
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = load(ckpt)
    assert saved["epoch"] == 3 and saved["history"]["test_acc"] == history["test_acc"]
    assert set(saved["model"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}


def test_resume_continues_bit_identically(tmp_path, capsys):
    args = TINY + ["--epochs", "4", "--data", "breast_cancer", "--batch-size", "64",
                   "--accumulate", "3"]
    straight = train_mlp.main(args + ["--checkpoint", str(tmp_path / "a.npz")])
    ckpt = tmp_path / "b.npz"
    for stop in (1, 3):   # interrupted after epoch 1, resumed, interrupted again, resumed
        train_mlp.main(args + ["--checkpoint", str(ckpt), "--stop-after", str(stop)]
                       + (["--resume", str(ckpt)] if stop > 1 else []))
    resumed = train_mlp.main(args + ["--resume", str(ckpt)])
    assert resumed["history"] == straight["history"]
    assert resumed["updates"] == straight["updates"]
    for name, array in straight["weights"].items():
        np.testing.assert_array_equal(resumed["weights"][name], array, err_msg=name)
    assert "resumed" in capsys.readouterr().out


def test_resume_refuses_other_settings(tmp_path):
    ckpt = tmp_path / "c.npz"
    train_mlp.main(TINY + ["--epochs", "2", "--stop-after", "1", "--checkpoint", str(ckpt)])
    with pytest.raises(SystemExit, match="hidden"):
        train_mlp.main(["--hidden", "8", "--batch-size", "256", "--accumulate", "2",
                        "--epochs", "2", "--resume", str(ckpt), "--no-progress"])
    with pytest.raises(SystemExit, match="epochs"):
        train_mlp.main(TINY + ["--epochs", "5", "--resume", str(ckpt)])


def test_command_line_with_progress_bar(tmp_path):
    pytest.importorskip("tqdm")
    done = subprocess.run([sys.executable, str(SCRIPTS / "train_mlp.py"), "--epochs", "1",
                           "--hidden", "8", "--batch-size", "512", "--accumulate", "1",
                           "--checkpoint", str(tmp_path / "d.npz")],
                          check=False, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "epoch   1/1" in done.stdout
    assert "batch" in done.stderr and "3/3" in done.stderr   # tqdm's bar: 1347 / 512


def test_compare_sklearn_reports_both(tmp_path, capsys):
    summary = train_mlp.main(["--compare-sklearn", "--repeats", "1",
                              "--json", str(tmp_path / "cmp.json")])
    assert abs(summary["numbagrad"]["accuracy"] - summary["scikit-learn"]["accuracy"]) <= 0.01
    assert summary["ratio"] > 0 and "fit time" in capsys.readouterr().out
