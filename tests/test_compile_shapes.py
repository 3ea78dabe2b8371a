"""ng.compile: one compile per graph for every batch size (shapes, offsets and
shape-dependent floats are data of the generated code, not literals), and
compiled inference (fn returning any tensors, no optimizer, no backward).
Every compiled result is compared bit for bit with eager mode."""
import re
import warnings

import numpy as np
import pytest

import numbagrad as ng

BATCHES = (8, 5, 3, 8, 3, 5)      # a ragged last batch among them, sizes seen again


@pytest.fixture
def cache(tmp_path):
    return str(tmp_path)          # a fresh cache: the first recording compiles


def host(a):
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


def same(a, b):
    a, b = host(a), host(b)
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.all(a == b))


def check_params(pa, pb):
    for a, b in zip(pa, pb):
        assert same(a.data, b.data)
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            assert same(a.grad, b.grad)


def mlp(seed=0):
    rng = np.random.default_rng(seed)
    model = ng.nn.Sequential(
        ng.nn.Linear(6, 7, dtype=np.float32, rng=rng), ng.nn.ReLU(),
        ng.nn.Linear(7, 4, dtype=np.float32, rng=rng))
    opt = ng.optim.Adam(model.parameters(), lr=1e-2, accumulate_steps=2)
    return model, opt, lambda x, labels: ng.cross_entropy(model(x), labels)


def mlp_batch(rng, b):
    return (ng.tensor(rng.normal(size=(b, 6)).astype(np.float32)),
            rng.integers(0, 4, b))


def mlp_with_views(seed=0):
    # views of an argument at offsets that move with the batch size (its last
    # row, its second half)
    model, opt, _ = mlp(seed)

    def loss_fn(x, labels):
        b = x.shape[0]
        tail = ng.mean(model(x[b // 2:]) * 0.5) + ng.sum(x[-1:] * x[-1:])
        return ng.cross_entropy(model(x), labels) + tail
    return model, opt, loss_fn


def attention(seed=0):
    rng = np.random.default_rng(seed)
    emb = ng.nn.Embedding(11, 8, dtype=np.float32, rng=rng)
    attn = ng.nn.MultiheadAttention(8, 2, dtype=np.float32, rng=rng)
    norm = ng.nn.LayerNorm(8, dtype=np.float32)
    head = ng.nn.Linear(8, 11, dtype=np.float32, rng=rng)
    model = ng.nn.ModuleList([emb, attn, norm, head])
    opt = ng.optim.AdamW(model.parameters(), lr=1e-2, accumulate_steps=2)

    def loss_fn(tokens, targets):
        h = emb(tokens)
        a, _ = attn(h, h, h, is_causal=True)
        logits = head(norm(h + a))
        n, t = tokens.shape
        return ng.cross_entropy(logits.reshape((n * t, 11)), targets)
    return model, opt, loss_fn


def attention_batch(rng, b, t=4):
    return rng.integers(0, 11, (b, t)), rng.integers(0, 11, b * t)


def twins_over_batches(make, batch, cache):
    """Eager and compiled twins over BATCHES, compared after every call."""
    ma, oa, fa = make()
    mb, ob, fb = make()
    step = ng.compile(fb, optimizer=ob, cache_dir=cache)
    rng = np.random.default_rng(1)
    for b in BATCHES:
        for _ in range(3):          # the second call of a signature is a verifying one
            args = batch(rng, b)
            with ng.grad_tape():
                la = fa(*args)
            la.backward()
            oa.step()
            lb = step(*args)
            assert same(la.data, lb.data), f"loss differs at batch size {b}"
            check_params(ma.parameters(), mb.parameters())
    return step


@pytest.mark.parametrize("make, batch", [(mlp, mlp_batch), (mlp_with_views, mlp_batch),
                                         (attention, attention_batch)],
                         ids=["mlp", "argument-views", "attention"])
def test_one_compile_for_every_batch_size(cache, make, batch):
    step = twins_over_batches(make, batch, cache)
    sizes = len(set(BATCHES))
    assert len(step.stats) == sizes and all(s["mode"] == "njit" for s in step.stats)
    # one generated module, compiled once: later batch sizes only record
    assert len({s["module"] for s in step.stats}) == 1
    assert [s["cache"] for s in step.stats] == ["miss"] + ["loaded"] * (sizes - 1)


def test_float_arguments_are_data_not_source(cache):
    # a mean's 1/N and the optimizer's constants: none of them in the source
    model, opt, fn = mlp()
    step = ng.compile(fn, optimizer=opt, cache_dir=cache)
    rng = np.random.default_rng(2)
    sources = []
    for b in (8, 5):
        step(*mlp_batch(rng, b))
        with open(step.stats[-1]["module"]) as f:
            sources.append(f.read())
    assert sources[0] == sources[1]
    calls = [line.split("#")[0] for line in sources[0].splitlines() if "_call(" in line]
    assert calls and not any(re.search(r"\d\.\d", c) for c in calls)   # no float literal
    entries = list(step._entries.values())
    assert 1.0 / 8 in entries[0].fmeta and 1.0 / 5 in entries[1].fmeta


# ------------------------------------------------------------ inference
def inference_model(seed=0, device="cpu"):
    rng = np.random.default_rng(seed)
    return ng.nn.Sequential(
        ng.nn.Linear(5, 6, dtype=np.float32, device=device, rng=rng), ng.nn.Tanh(),
        ng.nn.Linear(6, 3, dtype=np.float32, device=device, rng=rng))


@pytest.mark.parametrize("shape", ["tensor", "tuple", "dict", "list"])
def test_inference_returns_fns_outputs_bit_identical(cache, shape):
    model = inference_model()

    def fn(x):
        logits = model(x)
        if shape == "tensor":
            return logits
        probs = ng.softmax(logits, axis=-1)
        if shape == "tuple":
            return logits, probs
        if shape == "list":
            return [logits, (probs, ng.sum(probs))]
        return {"logits": logits, "probs": probs, "mean": ng.mean(logits)}

    def leaves(out):
        if isinstance(out, ng.Tensor):
            return [out]
        if isinstance(out, dict):
            return [t for v in out.values() for t in leaves(v)]
        return [t for v in out for t in leaves(v)]

    step = ng.compile(fn, cache_dir=cache)
    rng = np.random.default_rng(3)
    kept = []
    for b in BATCHES:
        for _ in range(2):
            x = ng.tensor(rng.normal(size=(b, 5)).astype(np.float32))
            want = fn(x)
            got = step(x)
            assert type(got) is type(want)
            if isinstance(want, dict):
                assert list(got) == list(want)
            pairs = list(zip(leaves(want), leaves(got)))
            assert len(pairs) == len(leaves(want)) == len(leaves(got))
            for w, g in pairs:
                assert same(w.data, g.data)
            kept.append((pairs, [host(g.data).copy() for _, g in pairs]))
    for pairs, values in kept:          # outputs are new arrays: later calls leave them be
        assert all(same(g.data, v) for (_, g), v in zip(pairs, values))
    assert all(p.grad is None for p in model.parameters())    # no backward ran
    assert [s["backward"] for s in step.stats] == [False] * len(set(BATCHES))
    assert [s["mode"] for s in step.stats] == ["njit"] * len(set(BATCHES))
    assert [s["cache"] for s in step.stats][1:] == ["loaded"] * (len(set(BATCHES)) - 1)


def test_backward_false_compiles_an_evaluation_loss(cache):
    model = inference_model()
    fn = lambda x, y: ng.cross_entropy(model(x), y)   # noqa: E731
    step = ng.compile(fn, cache_dir=cache, backward=False)
    rng = np.random.default_rng(4)
    for b in (4, 3, 4, 3):
        x, y = ng.tensor(rng.normal(size=(b, 5)).astype(np.float32)), rng.integers(0, 3, b)
        assert same(fn(x, y).data, step(x, y).data)
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match="cross_entropy: target"):   # eager mode's error
        step(x, np.array([0, 5, 1]))
    # the default, a 0-d loss without optimizer, still trains (gradients into .grad)
    train = ng.compile(fn, cache_dir=cache)
    train(x, y)
    assert all(p.grad is not None for p in model.parameters())


def test_inference_rules_and_errors(cache):
    model = inference_model()
    opt = ng.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="backward=False.*no optimizer.*SGD"):
        ng.compile(model, opt, backward=False)
    with pytest.raises(TypeError, match="backward must be"):
        ng.compile(model, backward="no")
    step = ng.compile(model, cache_dir=cache, backward=False)
    with pytest.raises(ValueError, match="no optimizer"):
        step.optimizer = opt
    x = ng.tensor(np.ones((2, 5), np.float32))
    # with an optimizer the scalar-loss rule stays: eager's backward error
    with pytest.raises(ValueError, match="one-element"):
        ng.compile(model, opt, cache_dir=cache)(x)
    with pytest.raises(TypeError, match=r"\[1\] is a int"):
        ng.compile(lambda x: (model(x), 3), cache_dir=cache)(x)
    with pytest.raises(TypeError, match="returned no tensor"):
        ng.compile(lambda x: (), cache_dir=cache)(x)
    with pytest.raises(TypeError, match="must return the loss Tensor"):
        ng.compile(lambda x: 1.0, cache_dir=cache)(x)
    # a one-element output that is not 0-d is inference, with a warning
    one = ng.compile(lambda x: ng.sum(model(x), axis=0, keepdims=True)[:, :1], cache_dir=cache)
    with pytest.warns(RuntimeWarning, match="one-element tensor"):
        one(x)
    assert all(p.grad is None for p in model.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ng.compile(lambda x: ng.sum(model(x), axis=0, keepdims=True)[:, :1], cache_dir=cache,
                   backward=False)(x)


@pytest.mark.skipif(not ng.cuda_available(), reason="CUDA unusable here")
def test_cuda_inference_is_replayed(cache):
    model = inference_model(device="cuda")
    fn = lambda x: (model(x), ng.mean(model(x)))   # noqa: E731
    step = ng.compile(fn, cache_dir=cache)
    rng = np.random.default_rng(5)
    for b in (2, 2, 2):
        x = ng.tensor(rng.normal(size=(b, 5)).astype(np.float32), device="cuda")
        want, got = fn(x), step(x)
        assert all(same(w.data, g.data) for w, g in zip(want, got))
    assert [s["mode"] for s in step.stats] == ["replay"]
    assert all(p.grad is None for p in model.parameters())
