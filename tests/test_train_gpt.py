"""scripts/train_gpt.py and scripts/gpt_model.py: the char GPT trains, checkpoints and
resumes bit-identically, its accumulated gradients equal the full batch's, and it
matches its PyTorch twin."""
import sys
from pathlib import Path

import numpy as np
import pytest

import numbagrad as ng
from numbagrad.serialization import load

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
import gpt_model  # noqa: E402
import train_gpt  # noqa: E402

# one block: the compiled step's first compile grows with its length
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "8",
        "--batch-size", "3", "--eval-batches", "2", "--no-progress"]


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("the quick brown fox jumps over the lazy dog; ünïcode too.\n" * 40,
                    encoding="utf-8")
    return path


def flat(tree, prefix=""):
    """A checkpoint's leaves by path."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in flat(sub, f"{prefix}/{key}").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for i, sub in enumerate(tree) for k, v in flat(sub, f"{prefix}/{i}").items()}
    return {prefix: tree}


def test_trains_evaluates_samples_plots_and_checkpoints(tmp_path, text_file, capsys):
    ckpt, png = tmp_path / "run.npz", tmp_path / "curves.png"
    result = train_gpt.main(TINY + ["--data", str(text_file), "--max-iters", "6", "--lr", "1e-2",
                                    "--warmup", "2", "--eval-every", "3", "--no-compile",
                                    "--checkpoint", str(ckpt), "--plot", str(png),
                                    "--sample", "30", "--top-k", "5"])
    out = capsys.readouterr().out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("iter")] == \
        ["3/6", "6/6"]
    assert "final val loss" in out and "--- sample (30 characters" in out
    history = result["history"]
    assert len(history["train_loss"]) == 6 and history["eval_iter"] == [3, 6]
    assert history["val_loss"][-1] < history["val_loss"][0] < np.log(result["vocab"]) + 0.5
    assert len(result["sample"]) == 30
    assert set(result["sample"]) <= set(text_file.read_text(encoding="utf-8"))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = load(ckpt)
    assert saved["iteration"] == 6 and saved["history"]["val_loss"] == history["val_loss"]
    weights = saved["model"]
    assert "transformer.h.0.mlp.c_proj.weight" in weights
    np.testing.assert_array_equal(weights["lm_head.weight"], weights["transformer.wte.weight"])


@pytest.mark.parametrize("compiled", [False, True])
def test_stop_and_resume_ends_with_the_same_checkpoint(tmp_path, text_file, compiled, capsys):
    # dropout > 0: the resumed run must restore numbagrad's random state too
    args = TINY + ["--data", str(text_file), "--max-iters", "6", "--dropout", "0.2",
                   "--accumulate-steps", "2", "--eval-every", "4",
                   "--compile" if compiled else "--no-compile"]
    train_gpt.main(args + ["--checkpoint", str(tmp_path / "a.npz")])
    ckpt = tmp_path / "b.npz"
    train_gpt.main(args + ["--checkpoint", str(ckpt), "--stop-at", "3"])
    assert load(ckpt)["iteration"] == 3
    train_gpt.main(args + ["--resume", str(ckpt)])
    assert "resumed" in capsys.readouterr().out
    straight, resumed = flat(load(tmp_path / "a.npz")), flat(load(ckpt))
    assert straight.keys() == resumed.keys()
    assert any("optimizer" in k for k in straight) and "/random/seed" in straight
    for key, value in straight.items():
        np.testing.assert_array_equal(resumed[key], value, err_msg=key)
    # and the run did draw dropout masks: without dropout it ends elsewhere
    train_gpt.main([a if a != "0.2" else "0.0" for a in args]
                   + ["--checkpoint", str(tmp_path / "c.npz")])
    other = load(tmp_path / "c.npz")["model"]["transformer.wte.weight"]
    assert not np.array_equal(other, load(ckpt)["model"]["transformer.wte.weight"])


def test_resume_refuses_other_settings(tmp_path, text_file):
    ckpt = tmp_path / "d.npz"
    args = TINY + ["--data", str(text_file), "--no-compile", "--max-iters", "4"]
    train_gpt.main(args + ["--stop-at", "1", "--checkpoint", str(ckpt)])
    with pytest.raises(SystemExit, match="n_embd"):
        train_gpt.main(args[:4] + ["--n-embd", "8"] + args[6:] + ["--resume", str(ckpt)])
    with pytest.raises(SystemExit, match="max_iters"):
        train_gpt.main(args[:-1] + ["5", "--resume", str(ckpt)])


def config(**kw):
    return gpt_model.GPTConfig(**{"vocab_size": 13, "block_size": 8, "n_layer": 2,
                                  "n_head": 2, "n_embd": 16, **kw})


def test_k_micro_batch_gradients_equal_the_full_batch_float64():
    # One window of k micro-batches (mean losses, averaged by the optimizer)
    # equals one full batch of k times as many sequences, to 1e-8.
    model = gpt_model.GPT(config(), dtype=np.float64, seed=1)
    rng = np.random.default_rng(2)
    x, y = rng.integers(0, 13, (12, 8)), rng.integers(0, 13, (12, 8))
    k = 3
    with ng.grad_tape():
        _, loss = model(x, y)
    full = ng.backward(loss)
    micro = {}
    for i in range(k):
        with ng.grad_tape():
            _, loss = model(x[i * 4:(i + 1) * 4], y[i * 4:(i + 1) * 4])
        for pid, g in ng.backward(loss).items():
            micro[pid] = micro.get(pid, 0) + np.asarray(g) / k
    params = model.named_parameters()
    assert len(full) == len(micro) == len(model.parameters()) == 2 + 2 * 12 + 2
    for name, p in params:
        np.testing.assert_allclose(micro[p.id], full[p.id], rtol=1e-8, atol=1e-10, err_msg=name)


def test_the_head_is_the_token_embedding():
    model = gpt_model.GPT(config(), dtype=np.float64)
    assert model.lm_head.weight is model.transformer.wte.weight
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names and "transformer.wte.weight" in names
    init = gpt_model.nanogpt_init(config(), seed=0, dtype=np.float64)
    assert list(init) == list(model.state_dict())
    assert np.std(init["transformer.h.0.attn.c_proj.weight"]) < 0.012 < \
        np.std(init["transformer.h.0.attn.c_attn.weight"])
    assert not init["transformer.h.0.mlp.c_fc.bias"].any()
    with pytest.raises(ValueError, match="block_size 8"):
        model(np.zeros((1, 9), np.int64))


def test_matches_the_pytorch_twin_float64():
    torch = pytest.importorskip("torch")
    model = gpt_model.GPT(config(), dtype=np.float64, seed=4)
    twin = gpt_model.TorchGPT(config(), dtype=np.float64, seed=4)
    assert model.state_dict().keys() == twin.state_dict().keys()
    rng = np.random.default_rng(5)
    x, y = rng.integers(0, 13, (3, 8)), rng.integers(0, 13, (3, 8))
    with ng.grad_tape():
        logits, loss = model(x, y)
    grads = ng.backward(loss)
    t_logits, t_loss = twin(torch.from_numpy(x), torch.from_numpy(y))
    t_loss.backward()
    np.testing.assert_allclose(logits.numpy(), t_logits.detach().numpy(), rtol=1e-9, atol=1e-12)
    assert loss.item() == pytest.approx(t_loss.item(), rel=1e-12)
    theirs = dict(twin.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(grads[p.id], theirs[name].grad.numpy(), rtol=1e-9,
                                   atol=1e-12, err_msg=name)


def test_torch_peer_trains_the_same_run(text_file):
    # Same init, batches, schedule, clipping and AdamW: the float64 loss curves agree.
    pytest.importorskip("torch")
    args = TINY + ["--data", str(text_file), "--max-iters", "4", "--dtype", "float64",
                   "--accumulate-steps", "2", "--warmup", "1", "--lr", "3e-2", "--clip", "0.5",
                   "--eval-every", "4", "--checkpoint", ""]
    ours = train_gpt.main(args + ["--no-compile"])["history"]
    theirs = train_gpt.main(args + ["--peer", "torch"])["history"]
    assert ours["train_loss"][-1] < ours["train_loss"][0]
    np.testing.assert_allclose(ours["train_loss"], theirs["train_loss"], rtol=1e-9)
    np.testing.assert_allclose(ours["val_loss"], theirs["val_loss"], rtol=1e-9)


def test_the_default_corpus_is_deterministic_and_offline():
    text = train_gpt.stdlib_corpus(50_000)
    assert len(text) == 50_000 and text == train_gpt.stdlib_corpus(50_000)
    assert text.startswith("Command-line parsing library")       # argparse comes first
    assert list(train_gpt.CORPUS_MODULES) == sorted(train_gpt.CORPUS_MODULES)
