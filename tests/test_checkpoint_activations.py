"""Activation checkpointing (ng.checkpoint, ng.nn.Checkpoint): gradients
bit-identical to the unchecked run (dropout included), PyTorch's checkpoint's
values, ng.compile, both devices, and the memory it saves."""
import tracemalloc

import numpy as np
import pytest
import torch
import torch.utils.checkpoint

import numbagrad as ng


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("compiled"))


class Block(ng.nn.Module):
    """A pre-norm residual MLP block with dropout."""

    def __init__(self, width, device="cpu", p=0.25, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        kw = {"dtype": np.float64, "device": device, "rng": rng}
        self.norm = ng.nn.LayerNorm(width, dtype=np.float64, device=device)
        self.up = ng.nn.Linear(width, 2 * width, **kw)
        self.down = ng.nn.Linear(2 * width, width, **kw)
        self.drop = ng.nn.Dropout(p)

    def forward(self, x):
        return x + self.drop(self.down(ng.gelu(self.up(self.norm(x)))))


def host(a):
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.array(a)


def test_dropout_block_grads_are_bit_identical_to_the_unchecked_run(dev):
    blocks = 1 if dev.name == "cuda" else 2     # the simulator is slow
    model = ng.nn.ModuleList([Block(3, dev.name, seed=s) for s in range(blocks)])
    x = dev.param(np.random.default_rng(1).standard_normal((2, 3)))
    results = []
    for checked, seed in ((False, 3), (True, 3), (False, 4)):
        for p in model.parameters():
            p.grad = None
        x.grad = None
        ng.manual_seed(seed)
        with ng.grad_tape():
            h = x
            for block in model:
                h = ng.checkpoint(block, h) if checked else block(h)
            loss = (h * h).mean()
        loss.backward()
        results.append([loss.item()] + [host(p.grad) for p in model.parameters()]
                       + [host(x.grad)])
        results[-1].append(ng.random.get_state())   # the rerun drew nothing new
    plain, checked, other = results
    assert plain[0] == checked[0]
    for a, b in zip(plain[1:-1], checked[1:-1]):
        assert np.array_equal(a, b)
    assert plain[-1] == checked[-1]
    # the masks matter: another seed gives other gradients
    assert not all(np.array_equal(a, b) for a, b in zip(plain[1:-1], other[1:-1]))


def test_values_and_grads_match_torch_checkpoint():
    rng = np.random.default_rng(2)
    w1, w2, xs = rng.standard_normal((4, 3)), rng.standard_normal((3, 4)), \
        rng.standard_normal((5, 3))
    W1, W2, X = ng.param(w1), ng.param(w2), ng.param(xs)

    def seg(x):
        return ng.tanh(ng.matmul(ng.relu(ng.matmul(x, W1.T)), W2.T))

    with ng.grad_tape():
        loss = (ng.checkpoint(seg, X) ** 2).sum()
    grads = ng.backward(loss)           # collected too: returned and added to .grad
    t1, t2, tx = (torch.tensor(a, requires_grad=True) for a in (w1, w2, xs))
    tloss = (torch.utils.checkpoint.checkpoint(
        lambda x: torch.tanh(torch.relu(x @ t1.T) @ t2.T), tx, use_reentrant=False) ** 2).sum()
    tloss.backward()
    np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-12)
    for p, t in ((W1, t1), (W2, t2), (X, tx)):
        np.testing.assert_allclose(grads[p.id], t.grad.numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(p.grad, grads[p.id])


def test_gradcheck_through_a_checkpoint_and_a_closed_over_recorded_tensor():
    rng = np.random.default_rng(4)
    W, V = ng.param(rng.standard_normal((3, 3))), ng.param(rng.standard_normal(3))

    def loss_fn():
        s = V * 2.0                               # recorded outside, read inside
        h = ng.checkpoint(lambda x: ng.sigmoid(ng.matmul(x, W) + s), V.reshape((1, 3)))
        return ng.cross_entropy(h, np.array([1]))  # a loss right on the segment's output

    ng.gradcheck(loss_fn, [W, V])


def test_nn_checkpoint_is_transparent():
    plain = ng.nn.Sequential(Block(3, seed=0), Block(3, seed=1))
    wrapped = ng.nn.Sequential(*[ng.nn.Checkpoint(Block(3, seed=9)) for _ in range(2)])
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    wrapped.load_state_dict(plain.state_dict())
    names = [n for n, _ in wrapped.named_parameters()]
    assert names == [n for n, _ in plain.named_parameters()]
    assert wrapped[0].up is wrapped[0].module.up
    assert wrapped[0].parameters() == wrapped[0].module.parameters()
    x = np.random.default_rng(5).standard_normal((2, 3))
    wrapped.eval()
    plain.eval()
    assert not wrapped[0].training and not wrapped[0].module.drop.training
    np.testing.assert_array_equal(wrapped(ng.tensor(x)).numpy(), plain(ng.tensor(x)).numpy())
    wrapped.train()
    assert wrapped[1].module.training and wrapped[1].module.drop.training
    assert "Checkpoint(" in repr(wrapped)
    with pytest.raises(TypeError, match="nn.Module"):
        ng.nn.Checkpoint(lambda x: x)


def test_outside_a_tape_it_is_a_plain_call_and_bad_results_are_refused():
    x = ng.param(np.ones(3))
    out = ng.checkpoint(lambda t: t * 2.0, x)
    assert out._node is None
    with ng.grad_tape():
        with pytest.raises(TypeError, match="one Tensor"):
            ng.checkpoint(lambda t: (t, t), x)
        with pytest.raises(TypeError, match="callable"):
            ng.checkpoint(3, x)


def test_compiled_step_with_checkpointed_blocks_matches_eager_unchecked(cache, dev):
    """Five compiled micro-steps (recording, replays, the verifying re-recordings)
    of checkpointed blocks with dropout give the unchecked eager run's bits."""
    cpu = dev.name == "cpu"
    rows, calls = (4, 5) if cpu else (2, 3)     # the simulator is slow
    x = np.random.default_rng(7).standard_normal((rows, 3))
    y = np.random.default_rng(8).standard_normal((rows, 3))
    losses = {}
    for mode in ("eager", "compiled"):
        if cpu:
            blocks = [Block(3, seed=s) for s in range(2)]
        else:
            blocks = [ng.nn.Sequential(ng.nn.Linear(3, 3, dtype=np.float64, device="cuda",
                                                    rng=np.random.default_rng(0)),
                                       ng.nn.Dropout(0.25))]
        # the reference: eager, unchecked
        model = ng.nn.Sequential(*[ng.nn.Checkpoint(b) if mode == "compiled" else b
                                   for b in blocks])
        opt = ng.optim.SGD(model.parameters(), lr=0.1)
        ng.manual_seed(11)

        def loss_of(a, b):
            return ng.mse_loss(model(a), b)

        if mode == "compiled":
            step = ng.compile(loss_of, optimizer=opt, cache_dir=cache)
        else:
            def step(a, b):
                with ng.grad_tape():
                    loss = loss_of(a, b)
                loss.backward()
                opt.step()
                return loss
        losses[mode] = [step(dev.tensor(x), dev.tensor(y)).item() for _ in range(calls)]
        if mode == "compiled":
            assert [s["mode"] for s in step.stats] == ["njit" if cpu else "replay"]
        losses[mode + " params"] = [p.numpy() for p in model.parameters()]
    assert losses["eager"] == losses["compiled"]
    assert len(set(losses["eager"])) == calls
    for a, b in zip(losses["eager params"], losses["compiled params"]):
        assert np.array_equal(a, b)


def test_checkpointing_lowers_the_peak_memory(monkeypatch):
    monkeypatch.setattr(ng.buffers, "IDLE_REFS", None)   # no pool: every array is its own
    model = ng.nn.ModuleList([Block(64, p=0.0, seed=s) for s in range(6)])
    x = ng.param(np.random.default_rng(9).standard_normal((256, 64)))
    peaks = []
    for checked in (False, True, False):
        with ng.grad_tape():       # warm (compiles, caches) outside the measurement
            h = x
            for block in model:
                h = ng.checkpoint(block, h) if checked else block(h)
        tracemalloc.start()
        with ng.grad_tape():
            h = x
            for block in model:
                h = ng.checkpoint(block, h) if checked else block(h)
            loss = (h * h).mean()
        loss.backward()
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 0.5 * min(peaks[0], peaks[2]), peaks


def test_train_gpt_checkpoint_blocks_gives_bit_identical_gradients():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import train_gpt

    argv = ["--n-layer", "2", "--n-head", "2", "--n-embd", "8", "--block-size", "8",
            "--dropout", "0.2", "--no-compile", "--checkpoint", ""]
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 11, (2, 8)), rng.integers(0, 11, (2, 8))
    runs = []
    for extra in ([], ["--checkpoint-blocks"]):
        args = train_gpt.parse(argv + extra)
        ng.manual_seed(5)
        model, _ = train_gpt.build(args, 11)
        with ng.grad_tape():
            loss = model(x, y)[1]
        loss.backward()
        runs.append((loss.item(), model.state_dict(),
                     {n: np.array(p.grad) for n, p in model.named_parameters()}))
    (loss0, state0, grads0), (loss1, state1, grads1) = runs
    assert isinstance(model.transformer.h[0], ng.nn.Checkpoint)
    assert loss0 == loss1 and list(state0) == list(state1) and list(grads0) == list(grads1)
    for name in grads0:
        assert np.array_equal(grads0[name], grads1[name]), name


def test_nested_checkpoints_and_grad_of_a_checkpointed_function():
    rng = np.random.default_rng(10)
    W = ng.param(rng.standard_normal((3, 3)))
    x = ng.param(rng.standard_normal((2, 3)))

    def inner(h):
        return ng.dropout(ng.tanh(ng.matmul(h, W)), 0.3)

    def outer(h):
        return ng.checkpoint(inner, ng.checkpoint(inner, h) * 2.0)

    runs = []
    for f in (lambda h: inner(inner(h) * 2.0), outer, lambda h: ng.checkpoint(outer, h)):
        W.grad = x.grad = None
        ng.manual_seed(2)
        with ng.grad_tape():
            loss = (f(x) ** 2).sum()
        loss.backward()
        runs.append((np.array(W.grad), np.array(x.grad)))
    for run in runs[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(runs[0], run))
    # ng.grad of a function that checkpoints: its gradient, no .grad touched
    W.grad = None
    ng.manual_seed(2)
    g = ng.grad(lambda w: (ng.checkpoint(lambda h: inner(h) @ w, x) ** 2).sum())(W)
    assert W.grad is None
    V = ng.param(W.numpy())     # W inside inner is a constant for ng.grad: V is the arg
    ng.manual_seed(2)
    with ng.grad_tape():
        loss = ((inner(x) @ V) ** 2).sum()
    want = ng.backward(loss)[V.id]
    np.testing.assert_array_equal(g.numpy(), want)
