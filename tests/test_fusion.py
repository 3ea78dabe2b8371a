"""ng.compile's elementwise fusion (compile/fusion.py): chains of elementwise
kernels run as one generated loop, bit-identical to the unfused step and to
eager mode, and a temporary is left unstored only when nothing else reads it."""
import numpy as np
import pytest

import numbagrad as ng
from conftest import compiled_matches_eager
from numbagrad.compile import fusion


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("ngcache"))


@pytest.fixture(autouse=True)
def small_chains_fuse(monkeypatch):
    """The tests' tiny shapes fuse (a chain needs MIN_ELEMENTS elements)."""
    monkeypatch.setattr(fusion, "MIN_ELEMENTS", 1)


def batches(dtype, n=3, rows=6, d_in=5, d_out=7, seed=1):
    rng = np.random.default_rng(seed)
    return [(ng.tensor(rng.normal(size=(rows, d_in)).astype(dtype)),
             ng.tensor(rng.normal(size=(rows, d_out)).astype(dtype))) for _ in range(n)]


def mlp(dtype, accumulate=1):
    """bias + activation, a scaled tanh, a residual add, a product plus a bias
    (a multiply-add a fastmath loop would contract into an FMA)."""
    def make():
        rng = np.random.default_rng(0)
        W1 = ng.param(rng.normal(size=(5, 7)).astype(dtype))
        b1 = ng.param(rng.normal(size=7).astype(dtype))
        W2 = ng.param(rng.normal(size=(7, 7)).astype(dtype))
        b2 = ng.param(rng.normal(size=7).astype(dtype))
        g = ng.param(rng.normal(size=(1, 7)).astype(dtype))
        params = [W1, b1, W2, b2, g]

        def loss_fn(x, y):
            h = ng.relu(x @ W1 + b1)
            r = h + ng.tanh(h @ W2 + b2) * 0.5
            return ng.mse_loss(ng.sigmoid(r) * g + b1, y)
        return params, loss_fn, ng.optim.SGD(params, lr=0.1, momentum=0.9,
                                             accumulate_steps=accumulate)
    return make


def source_of(step):
    with open(step.stats[-1]["module"]) as fh:
        return fh.read()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_chains_are_fused_and_match_eager_bit_for_bit(cache, dtype):
    step = compiled_matches_eager(mlp(dtype), batches(dtype, n=3), cache)
    fused = step.stats[-1]["fused"]
    # forward: bias + relu, bias + tanh + scale + residual, sigmoid * g + bias;
    # backward: their gradients (a bias's summed half stays a kernel call)
    assert ("binary", "unary") in fused
    assert any(c[:4] == ("binary", "unary", "unary", "binary") for c in fused)
    assert any(c[0] == "unary_backward" for c in fused)
    source = source_of(step)
    assert source.count("_fused") >= 2 * len(fused)    # each defined and called
    if dtype == np.float64:
        return
    plain = ng.compile(mlp(dtype)()[1], cache_dir=cache, fuse_elementwise=False)
    plain(*batches(dtype, n=1)[0])
    assert plain.stats[-1]["fused"] == []
    assert source.count("_call(") < source_of(plain).count("_call(")


def test_fused_step_equals_unfused_step_and_accumulates_exactly(cache):
    """Two compiled twins, fused and not, over accumulated micro-steps: the same
    bits in every loss, param and gradient (the optimizer steps every 2nd call)."""
    data = batches(np.float32, n=4)
    (pa, fa, oa), (pb, fb, ob) = mlp(np.float32, 2)(), mlp(np.float32, 2)()
    a = ng.compile(fa, optimizer=oa, cache_dir=cache)
    b = ng.compile(fb, optimizer=ob, cache_dir=cache, fuse_elementwise=False)
    for args in data:
        assert a(*args).numpy().tobytes() == b(*args).numpy().tobytes()
        for p, q in zip(pa, pb):
            assert p.numpy().tobytes() == q.numpy().tobytes()
            assert (p.grad is None) == (q.grad is None)
            if p.grad is not None:
                assert np.asarray(p.grad).tobytes() == np.asarray(q.grad).tobytes()
    assert a.stats[-1]["fused"] and not b.stats[-1]["fused"]


def test_residual_block_with_layer_norm(cache):
    """Layer norm, a bias + GELU (float32's fast form), residual adds, a column
    broadcast along the rows: eager's bits."""
    def make():
        rng = np.random.default_rng(3)
        ln = ng.nn.LayerNorm(8, dtype=np.float32)
        W = ng.param((rng.normal(size=(8, 8)) * 0.3).astype(np.float32))
        b = ng.param(rng.normal(size=8).astype(np.float32))
        c = ng.param(rng.normal(size=(4, 1)).astype(np.float32))   # a column, broadcast
        params = [*ln.parameters(), W, b, c]

        def loss_fn(x, y):
            h = x + ng.gelu(ln(x) @ W + b)
            h = h + ng.relu(h * 2.0 - c)
            return ng.mse_loss(h, y)
        return params, loss_fn, ng.optim.Adam(params, lr=1e-2)
    rng = np.random.default_rng(4)
    data = [(ng.tensor(rng.normal(size=(4, 8)).astype(np.float32)),
             ng.tensor(rng.normal(size=(4, 8)).astype(np.float32))) for _ in range(3)]
    step = compiled_matches_eager(make, data, cache)
    assert any(len(c) >= 3 for c in step.stats[-1]["fused"])


def test_kept_intermediates_are_stored_and_unread_ones_are_not(cache):
    """Inference: a chain's intermediate that fn returns is stored (and right);
    one only the chain reads gets no buffer. Training: activations the
    backward reads stay stored."""
    rng = np.random.default_rng(5)
    W = ng.param(rng.normal(size=(5, 7)).astype(np.float32))
    b = ng.param(rng.normal(size=7).astype(np.float32))

    def both(x):
        h = x @ W + b
        return h, ng.tanh(ng.relu(h) * 3.0)

    def last(x):
        return ng.tanh(ng.relu(x @ W + b) * 3.0)
    x = ng.tensor(rng.normal(size=(4, 5)).astype(np.float32))
    for fn, kept in ((both, True), (last, False)):
        step = ng.compile(fn, cache_dir=cache)
        for _ in range(2):
            got = step(x)
            with ng.grad_tape():
                want = fn(x)
            got, want = (got, want) if kept else ((got,), (want,))
            for g, w in zip(got, want):
                assert g.numpy().tobytes() == w.numpy().tobytes()
        plan = step._last.plan
        assert [len(c.links) for c in plan.chains] == [4]
        prog = step._last.prog
        h_temp = prog.calls[1][2][3].index     # the bias add's output
        assert (h_temp in plan.dropped) is not kept
        assert len(plan.dropped) == (2 if kept else 3)
    # training: every temp the chain writes is read by the backward
    params, loss_fn, opt = mlp(np.float32)()
    step = ng.compile(loss_fn, optimizer=opt, cache_dir=cache)
    step(*batches(np.float32, n=1)[0])
    plan, prog = step._last.plan, step._last.prog
    forward = [c for c in plan.chains if c.links[0].kind == "binary"]
    assert forward and not any(c.unstored for c in forward)
    for t in plan.dropped:       # only backward temps that nothing but their chain reads
        users = [k for k, (_, _, rargs, _) in enumerate(prog.calls)
                 if any(getattr(a, "kind", None) == "tmp" and a.index == t for a in rargs)]
        chain = [c for c in plan.chains if {link.call for link in c.links} >= set(users)]
        assert len(chain) == 1


def test_a_call_touching_the_chain_is_not_moved_across_it(cache):
    """A kernel between two links that reads the first link's output (a sum)
    stops the chain there: the sum sees the value the eager step stored."""
    rng = np.random.default_rng(6)
    W = ng.param(rng.normal(size=(5, 7)).astype(np.float32))

    def fn(x):
        h = ng.relu(x @ W)
        s = h.sum()
        return ng.exp(h) * s
    x = ng.tensor(rng.normal(size=(3, 5)).astype(np.float32))
    step = ng.compile(fn, cache_dir=cache)
    for _ in range(2):
        with ng.grad_tape():
            want = fn(x)
        assert step(x).numpy().tobytes() == want.numpy().tobytes()
    names = [prog_call[1] for prog_call in step._last.prog.calls]
    steps = step._last.plan.steps
    order = [names[s[1]] if s[0] == "call" else "chain" for s in steps]
    assert order == ["gemm", "unary", "sum_to", "chain"]   # relu stays alone: the sum reads h


def test_a_threaded_chain_gets_a_threaded_twin(cache, monkeypatch):
    """Links recorded as threaded kernels (here from 16 elements on) make a
    threaded loop too; it and the serial one (the governor's other choice)
    give eager's bits."""
    from numbagrad.kernels import cpu
    from numbagrad.kernels.cpu import _threads
    monkeypatch.setattr(cpu, "MT_MIN", 16)
    monkeypatch.setattr(cpu, "MT_MIN_MEMORY", 16)
    rng = np.random.default_rng(7)
    W = ng.param(rng.normal(size=(5, 9)).astype(np.float32))
    b = ng.param(rng.normal(size=9).astype(np.float32))

    def fn(x):
        return ng.tanh(x @ W + b)
    x = ng.tensor(rng.normal(size=(6, 5)).astype(np.float32))
    step = ng.compile(fn, cache_dir=cache)
    with ng.grad_tape():
        want = fn(x).numpy().tobytes()
    step(x)
    assert step.stats[-1]["fused"] == [("binary_mt", "unary_mt")]
    assert "_fused0_mt(" in source_of(step)
    running = _threads.governor is not None
    _threads.stop_governor()             # the switch is this test's to set
    try:
        for allowed in (1, 0):
            _threads.ALLOWED[0] = allowed
            assert step(x).numpy().tobytes() == want
    finally:
        _threads.ALLOWED[0] = 1
        if running:
            _threads.start_governor()


def test_an_unrelated_call_between_two_links_runs_ahead_of_the_chain(cache):
    rng = np.random.default_rng(8)
    W = ng.param(rng.normal(size=(5, 7)).astype(np.float32))
    b = ng.param(rng.normal(size=7).astype(np.float32))
    V = ng.param(rng.normal(size=(5, 3)).astype(np.float32))

    def fn(x):
        h = x @ W + b
        u = x @ V             # touches nothing of the chain
        return ng.relu(h), u
    x = ng.tensor(rng.normal(size=(4, 5)).astype(np.float32))
    step = ng.compile(fn, cache_dir=cache)
    for _ in range(2):
        with ng.grad_tape():
            want = fn(x)
        for g, w in zip(step(x), want):
            assert g.numpy().tobytes() == w.numpy().tobytes()
    names = [c[1] for c in step._last.prog.calls]
    assert names == ["gemm", "binary", "gemm", "unary"]
    steps = step._last.plan.steps
    assert [s[1] if s[0] == "call" else "chain" for s in steps] == [0, 2, "chain"]


def test_a_chain_below_min_elements_stays_kernel_calls(cache, monkeypatch):
    monkeypatch.setattr(fusion, "MIN_ELEMENTS", 4 * 7 + 1)
    rng = np.random.default_rng(9)
    W = ng.param(rng.normal(size=(5, 7)).astype(np.float32))

    def fn(x):
        return ng.tanh(ng.relu(x @ W) * 2.0)
    step = ng.compile(fn, cache_dir=cache)
    step(ng.tensor(rng.normal(size=(4, 5)).astype(np.float32)))
    assert step.stats[-1]["fused"] == [] and "_fused" not in source_of(step)
