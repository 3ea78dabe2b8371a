"""scripts/train_cnn.py trains the cnn case's network on digits, prints a
confusion matrix, plots, checkpoints and resumes bit-identically."""
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")

from numbagrad.serialization import load

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
import train_cnn

# Small and quick: 1347 training digits, 5 micro-batches of 256 an epoch (the 67 left over
# are dropped), windows of 2: three updates an epoch, the last one flushed short.
TINY = ["--batch-size", "256", "--accumulate", "2", "--lr", "0.01"]


def test_trains_prints_confusion_checkpoints_and_plots(tmp_path, capsys):
    pytest.importorskip("tqdm")
    ckpt, png = tmp_path / "run.npz", tmp_path / "curves.png"
    result = train_cnn.main(TINY + ["--epochs", "2", "--checkpoint", str(ckpt),
                                    "--plot", str(png)])
    captured = capsys.readouterr()
    out = captured.out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("epoch")] == \
        ["1/2", "2/2"]
    assert "final test accuracy" in out and "confusion matrix" in out
    assert "batch" in captured.err and "10/10" in captured.err      # tqdm's bar
    history = result["history"]
    assert history["train_loss"][1] < history["train_loss"][0]
    assert result["updates"] == 2 * 3
    counts = result["confusion"]
    assert counts.shape == (10, 10) and counts.sum() == 450            # the 25% test split
    assert counts.sum(axis=1).tolist() == np.bincount(train_cnn.dataset(0.25, 0, "float32")[3],
                                                      minlength=10).tolist()
    assert np.trace(counts) / 450 == pytest.approx(history["test_acc"][-1])
    rows = out[out.index("true\\pred"):].splitlines()[1:11]
    assert [int(v) for v in rows[3].split()[1:]] == counts[3].tolist()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = load(ckpt)
    assert saved["epoch"] == 2 and saved["history"]["test_acc"] == history["test_acc"]
    assert set(saved["model"]) == {f"{i}.{p}" for i in (0, 3, 7) for p in ("weight", "bias")}


def test_resume_continues_bit_identically(tmp_path, capsys):
    # The straight run is compiled; the interrupted one runs its first epoch eagerly and
    # the rest compiled: the same bits either way (ng.compile replays eager's kernels).
    args = TINY + ["--epochs", "2", "--no-progress"]
    straight = train_cnn.main(args + ["--checkpoint", str(tmp_path / "a.npz")])
    ckpt = str(tmp_path / "b.npz")
    train_cnn.main(args + ["--checkpoint", ckpt, "--stop-after", "1", "--no-compile"])
    resumed = train_cnn.main(args + ["--resume", ckpt])
    assert "resumed" in capsys.readouterr().out
    assert resumed["history"] == straight["history"]
    assert resumed["updates"] == straight["updates"] == 6
    for name, array in straight["weights"].items():
        np.testing.assert_array_equal(resumed["weights"][name], array, err_msg=name)
    np.testing.assert_array_equal(resumed["confusion"], straight["confusion"])


def test_resume_refuses_other_settings(tmp_path):
    ckpt = str(tmp_path / "c.npz")
    train_cnn.main(TINY + ["--epochs", "2", "--stop-after", "1", "--checkpoint", ckpt,
                           "--no-progress"])
    with pytest.raises(SystemExit, match="batch_size"):
        train_cnn.main(["--batch-size", "128", "--accumulate", "2", "--lr", "0.01",
                        "--epochs", "2", "--resume", ckpt, "--no-progress"])
    with pytest.raises(SystemExit, match="epochs"):
        train_cnn.main(TINY + ["--epochs", "5", "--resume", ckpt, "--no-progress"])


def test_the_network_is_the_bench_cases():
    import bench_peers
    import numbagrad as ng
    model = train_cnn.build(_args())[0]
    assert list(model.state_dict()) == list(bench_peers.CNN_NAMES)
    shapes = [w.shape for w in bench_peers.initial_weights("cnn", np.float32)]
    assert [a.shape for a in model.state_dict().values()] == shapes
    assert model(ng.as_tensor(np.zeros((2, 1, 8, 8), np.float32))).shape == (2, 10)


def _args():
    args = train_cnn.parse([])
    args._n_train = 1347
    return args
