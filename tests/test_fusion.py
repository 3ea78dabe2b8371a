"""ng.compile's elementwise fusion (compile/fusion.py): chains of elementwise
kernels run as one generated loop, bit-identical to the unfused step and to
eager mode, and a temporary is left unstored only when nothing else reads it."""
import re

import numba
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


def batches(dtype, n=3, rows=6, d_in=5, d_out=7, seed=1, device="cpu"):
    rng = np.random.default_rng(seed)
    return [(ng.tensor(rng.normal(size=(rows, d_in)).astype(dtype), device=device),
             ng.tensor(rng.normal(size=(rows, d_out)).astype(dtype), device=device))
            for _ in range(n)]


def mlp(dtype, accumulate=1, device="cpu"):
    """bias + activation, a scaled tanh, a residual add, a product plus a bias
    (a multiply-add a fastmath loop would contract into an FMA)."""
    def make():
        rng = np.random.default_rng(0)

        def param(*shape):
            return ng.param(rng.normal(size=shape).astype(dtype), device=device)
        W1, b1, W2, b2, g = param(5, 7), param(7), param(7, 7), param(7), param(1, 7)
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


def reused(dtype, second, device="cpu"):
    """``a = x @ W`` read twice: its gradient's second part adds into the
    first (a link with beta = 1), through ``second(a)``'s derivative."""
    def make():
        rng = np.random.default_rng(2)
        W = ng.param((rng.normal(size=(5, 7)) * 0.5).astype(dtype), device=device)

        def loss_fn(x, y):
            a = x @ W
            return ng.mse_loss(second(a), y)
        return [W], loss_fn, ng.optim.SGD([W], lr=0.1)
    return make


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("second", [lambda a: ng.relu(a) + a * 0.1, lambda a: a + ng.gelu(a),
                                    lambda a: a * 0.7 + a, lambda a: a + ng.exp(a),
                                    lambda a: ng.tanh(a) * a],
                         ids=["relu", "gelu", "scaled", "exp", "product"])
def test_a_gradient_added_into_another_keeps_eager_bits(cache, dtype, second):
    """Eager's kernels add a scalar function's value to the destination in
    float64 (their dispatch's type) and round once: a fused link must too."""
    step = compiled_matches_eager(reused(dtype, second), batches(dtype, n=6), cache)
    assert any(len(c) > 1 and c[-1] in ("unary_backward", "binary_backward")
               for c in step.stats[-1]["fused"]), step.stats[-1]["fused"]


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


def residual_block(device="cpu"):
    """Layer norm, a bias + GELU (float32's fast form on the CPU), residual
    adds, a column broadcast along the rows."""
    def make():
        rng = np.random.default_rng(3)
        ln = ng.nn.LayerNorm(8, dtype=np.float32, device=device)

        def param(a):
            return ng.param(a.astype(np.float32), device=device)
        W, b = param(rng.normal(size=(8, 8)) * 0.3), param(rng.normal(size=8))
        c = param(rng.normal(size=(4, 1)))          # a column, broadcast
        params = [*ln.parameters(), W, b, c]

        def loss_fn(x, y):
            h = x + ng.gelu(ln(x) @ W + b)
            h = h + ng.relu(h * 2.0 - c)
            return ng.mse_loss(h, y)
        return params, loss_fn, ng.optim.Adam(params, lr=1e-2)
    return make


def test_residual_block_with_layer_norm(cache):
    rng = np.random.default_rng(4)
    data = [(ng.tensor(rng.normal(size=(4, 8)).astype(np.float32)),
             ng.tensor(rng.normal(size=(4, 8)).astype(np.float32))) for _ in range(3)]
    step = compiled_matches_eager(residual_block(), data, cache)
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
    monkeypatch.setattr(fusion, "FOLD", False)     # (the GEMM is threaded too)
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


# ------------------------------------------------------------ CUDA (simulator)
cuda = pytest.mark.skipif(not ng.cuda_available(), reason="CUDA unusable here")


@cuda
def test_cuda_chain_adding_a_gradient_into_another_keeps_eager_bits(cache):
    """``test_a_gradient_added_into_another_keeps_eager_bits`` on CUDA."""
    step = compiled_matches_eager(reused(np.float32, lambda a: a + ng.gelu(a), "cuda"),
                                  batches(np.float32, n=4, device="cuda"), cache)
    assert ("binary_backward", "unary_backward") in step.stats[-1]["fused"]


@cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cuda_chains_run_as_one_kernel_each_with_eager_bits(cache, dtype):
    """The CPU's chains, found in the CUDA recording, run as generated kernels:
    fewer launches than eager, the same bits as eager and as the unfused replay."""
    from numbagrad.kernels.cuda._core import launch_count
    data = batches(dtype, n=3, device="cuda")
    step = compiled_matches_eager(mlp(dtype, device="cuda"), data, cache)
    stat = step.stats[-1]
    assert stat["mode"] == "replay"
    assert ("binary", "unary") in stat["fused"]
    assert any(c[0] == "unary_backward" for c in stat["fused"])
    (pa, fa, oa), (pb, fb, ob) = mlp(dtype, 2, "cuda")(), mlp(dtype, 2, "cuda")()
    fused = ng.compile(fa, optimizer=oa, cache_dir=cache)
    plain = ng.compile(fb, optimizer=ob, cache_dir=cache, fuse_elementwise=False)
    launches = []
    for i in range(6):
        args = data[i % 3]
        counts = []
        for twin in (fused, plain):
            before = launch_count()
            loss = twin(*args)
            counts.append(launch_count() - before)
            counts.append(loss.numpy().tobytes())
        assert counts[1] == counts[3], i
        launches.append((counts[0], counts[2]))
        for p, q in zip(pa, pb):
            assert p.numpy().tobytes() == q.numpy().tobytes()
    assert plain.stats[-1]["fused"] == []
    # each chain is one launch (a bias gradient's summed half stays its own call)
    saved = len(fused._last.prog.calls) - len(fused._last.plan)
    assert saved >= len(fused.stats[-1]["fused"])
    # calls 0, 1 and 3 record (the first, then verifying ones): eager launches there
    replays = [launches[i] for i in (2, 4, 5)]
    assert [f for f, p in replays] == [p - saved for f, p in replays], launches
    assert [f for f, p in launches[:2]] == [p for f, p in launches[:2]]


@cuda
def test_cuda_residual_block_fuses_with_eager_bits(cache):
    rng = np.random.default_rng(4)
    data = [(ng.tensor(rng.normal(size=(4, 8)).astype(np.float32), device="cuda"),
             ng.tensor(rng.normal(size=(4, 8)).astype(np.float32), device="cuda"))
            for _ in range(3)]
    step = compiled_matches_eager(residual_block("cuda"), data, cache)
    assert any(len(c) >= 3 for c in step.stats[-1]["fused"])


def chain_kernels(step):
    from numbagrad.compile import cuda_chains
    return [fn for fn, *_ in step._last.plan if isinstance(fn, cuda_chains.Launcher)]


@cuda
def test_cuda_chain_stores_only_what_is_read_later(cache):
    """Inference on CUDA: an intermediate fn returns is stored, one only the
    chain reads is not (its kernel writes one array)."""
    rng = np.random.default_rng(5)
    W = ng.param(rng.normal(size=(5, 7)).astype(np.float32), device="cuda")
    b = ng.param(rng.normal(size=7).astype(np.float32), device="cuda")

    def both(x):
        h = x @ W + b
        return h, ng.tanh(ng.relu(h) * 3.0)

    def last(x):
        return ng.tanh(ng.relu(x @ W + b) * 3.0)
    x = ng.tensor(rng.normal(size=(4, 5)).astype(np.float32), device="cuda")
    for fn, stores in ((both, 2), (last, 1)):
        step = ng.compile(fn, cache_dir=cache)
        for _ in range(3):
            got = step(x)
            with ng.grad_tape():
                want = fn(x)
            got, want = (got, want) if stores == 2 else ((got,), (want,))
            for g, w in zip(got, want):
                assert g.numpy().tobytes() == w.numpy().tobytes()
        [kernel] = chain_kernels(step)
        assert step.stats[-1]["fused"] == [("binary", "unary", "unary", "unary")]
        assert sum("[t] = w" in line for line in kernel.text.splitlines()) == stores


PTX_SCRIPT = """
import json, sys
from numba import cuda
import numba.cuda.dispatcher as dispatcher
from numbagrad.compile import cuda_chains

class Target:     # no driver here: device functions ask it for the architecture
    compute_capability = (9, 0)
dispatcher.get_current_device = lambda: Target
for text, sig in json.load(open(sys.argv[1])):
    fn = cuda_chains.python_function(text)
    for cc in ((8, 0), (9, 0)):
        Target.compute_capability = cc
        ptx, _ = cuda.compile_ptx(fn, sig, cc=cc)
        assert ".entry" in ptx and f"sm_{cc[0]}{cc[1]}" in ptx
print("ok")
"""


@cuda
def test_cuda_chain_kernels_compile_to_ptx(cache, tmp_path):
    """The generated kernels of the tests' CUDA steps (both float dtypes,
    broadcast operands, forward and backward links), typed and compiled for
    sm_80 and sm_90 as on a GPU."""
    import json
    import os
    import subprocess
    import sys
    kernels = []
    for make, data in ((mlp(np.float64, device="cuda"), batches(np.float64, n=1, device="cuda")),
                       (residual_block("cuda"), batches(np.float32, 1, 4, 8, 8, device="cuda"))):
        _, loss_fn, opt = make()
        step = ng.compile(loss_fn, optimizer=opt, cache_dir=cache)
        step(*data[0])
        kernels += [(k.text, k.signature) for k in chain_kernels(step)]
    assert len(kernels) >= 6 and any("i = t // cols" in t for t, _ in kernels)
    (tmp_path / "kernels.json").write_text(json.dumps(kernels))
    (tmp_path / "ptx.py").write_text(PTX_SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, str(tmp_path / "ptx.py"),
                          str(tmp_path / "kernels.json")], env=env, capture_output=True,
                         text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                    reason="products are threaded (gemm_mt) only with two or more threads")
def test_a_chain_after_a_threaded_product_runs_in_its_blocks(cache):
    """A chain reading a threaded GEMM's output runs inside the GEMM's blocks
    (row blocks for the first product, column blocks for the second; 2^22
    multiply-adds each, where gemm_mt splits): eager's bits, on the threads and
    on the governor's serial path."""
    from numbagrad.kernels.cpu import _threads

    def make():
        rng = np.random.default_rng(10)

        def param(*shape):
            return ng.param((rng.normal(size=shape) / 8).astype(np.float32))
        W, b, A, c = param(64, 256), param(256), param(64, 256), param(64, 1)

        def loss_fn(x, y):
            h = ng.tanh(x @ W + b) * 0.5          # (256, 256): blocks of rows
            return ng.mse_loss(ng.relu(A @ h - c), y)   # (64, 256): blocks of columns
        return [W, b, A, c], loss_fn, ng.optim.SGD([W, b, A, c], lr=0.1)
    rng = np.random.default_rng(11)
    data = [(ng.tensor(rng.normal(size=(256, 64)).astype(np.float32)),
             ng.tensor(rng.normal(size=(64, 256)).astype(np.float32))) for _ in range(2)]
    step = compiled_matches_eager(make, data, cache)
    fused = [c for c in step.stats[-1]["fused"] if c[0] == "gemm_mt"]
    plain = [tuple(name.removesuffix("_mt") for name in c[1:]) for c in fused]
    assert ("binary", "unary", "unary") in plain and ("binary", "unary") in plain
    source = source_of(step)
    assert source.count("_fold_mt(") >= 2 * 2
    (pa, fa, oa), (pb, fb, ob) = make(), make()
    twin = ng.compile(fb, optimizer=ob, cache_dir=cache, fuse_elementwise=False)
    step = ng.compile(fa, optimizer=oa, cache_dir=cache)
    running = _threads.governor is not None
    _threads.stop_governor()             # the switch is this test's to set
    try:
        for allowed in (1, 0, 1):
            _threads.ALLOWED[0] = allowed
            assert step(*data[0]).numpy().tobytes() == twin(*data[0]).numpy().tobytes()
            for p, q in zip(pa, pb):
                assert p.numpy().tobytes() == q.numpy().tobytes()
    finally:
        _threads.ALLOWED[0] = 1
        if running:
            _threads.start_governor()


def test_a_loop_that_recurs_is_generated_once(cache):
    """Layers whose chains are the same code (bias + tanh + scale here, and
    their gradients) call one generated loop each, of every shape: eager's
    bits, and fewer functions to compile than loops run."""
    def make():
        rng = np.random.default_rng(12)

        def param(*shape):
            return ng.param((rng.normal(size=shape) / 8).astype(np.float32))
        W1, b1, W2, b2, W3 = param(5, 7), param(7), param(7, 9), param(9), param(9, 3)
        params = [W1, b1, W2, b2, W3]

        def loss_fn(x, y):
            h = ng.tanh(x @ W1 + b1) * 0.5
            h = ng.tanh(h @ W2 + b2) * 0.5
            return ng.mse_loss(h @ W3, y)
        return params, loss_fn, ng.optim.SGD(params, lr=0.1)
    data = batches(np.float32, n=2, d_out=3)
    step = compiled_matches_eager(make, data, cache)
    fused = step.stats[-1]["fused"]
    assert fused.count(("binary", "unary", "unary")) == 2
    source = source_of(step)
    defined = re.findall(r"^def (_fused\d+)\(", source, re.M)
    called = re.findall(r"^    (_fused\d+)\(", source, re.M)
    assert len(called) == len(fused) > len(defined) == len(set(called))
