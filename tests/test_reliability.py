"""Reliability: pooled buffers are never reused while anyone can see them,
recording is per thread, and a long run does not leak."""
import os
import subprocess
import sys
import textwrap
import threading
import tracemalloc

import numpy as np
import pytest

import numbagrad as ng
from conftest import run_threads
from numbagrad import buffers, nn


# ------------------------------------------------------------- buffer pool
def test_pool_calibration_is_consistent_here_and_refuses_nonsense():
    if os.environ.get("NUMBAGRAD_NO_POOL") == "1":
        assert buffers.IDLE_REFS is None
    else:
        assert buffers.IDLE_REFS is not None and buffers.IDLE_REFS == buffers._calibrate()
    # A reference count that ignores holders: calibration must give up.
    assert buffers._calibrate(refs=lambda array: 2) is None
    # One that sees nothing idle: likewise.
    assert buffers._calibrate(refs=lambda array: 99) is None


def test_no_pool_switch_makes_every_take_fresh():
    code = textwrap.dedent("""
        import numpy as np
        from numbagrad import buffers, kernels
        cpu = kernels.get("cpu")
        assert buffers.IDLE_REFS is None
        a = buffers.take(cpu, (2, 2), np.dtype(np.float64))
        del a
        b = buffers.take(cpu, (2, 2), np.dtype(np.float64))
        assert buffers._local.free == {}
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, NUMBAGRAD_NO_POOL="1"), timeout=300,
                         stdin=subprocess.DEVNULL)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


HOLDERS = {
    "np.asarray": lambda y: np.asarray(y) if y.device == "cpu" else y.data,
    "data[1:3]": lambda y: y.data[1:3],
    "data.reshape(-1)": lambda y: y.data.reshape(-1),
    "tensor": lambda y: y,
    "tensor.T": lambda y: y.T,
    "tensor.reshape": lambda y: y.reshape(-1),
}


def host(x):
    if isinstance(x, ng.Tensor):
        return x.numpy()
    return x.copy_to_host() if hasattr(x, "copy_to_host") else np.array(x)


@pytest.mark.parametrize("holder", sorted(HOLDERS))
def test_held_results_survive_later_ops_of_the_same_shape(dev, holder):
    rng = np.random.default_rng(0)
    a, b = dev.tensor(rng.normal(size=(4, 3))), dev.tensor(rng.normal(size=(3, 5)))
    y = a @ b
    held = HOLDERS[holder](y)
    want = host(held).copy()
    del y
    for i in range(12):   # more than the pool keeps per shape
        z = dev.tensor(np.full((4, 3), float(i))) @ b
        r = ng.relu(z) + 1.0
        del z, r
    np.testing.assert_array_equal(host(held), want)


def test_held_backward_mapping_survives_later_steps(dev):
    rng = np.random.default_rng(1)
    W = dev.param(rng.normal(size=(3, 4)))
    x, y = dev.tensor(rng.normal(size=(4, 2))), dev.tensor(rng.normal(size=(3, 2)))
    with ng.grad_tape():
        loss = ng.mse_loss(ng.tanh(W @ x), y)
    grads = ng.backward(loss)
    want = host(grads[W.id]).copy()
    for i in range(10):
        with ng.grad_tape():
            loss = ng.mse_loss(ng.tanh(W @ x) * float(i), y)
        ng.backward(loss)
        W.grad = None
    np.testing.assert_array_equal(host(grads[W.id]), want)


def test_backward_never_hands_out_a_gradient_it_is_still_reading(dev):
    # Found in review, CUDA only: a view of a Numba device array does not
    # reference its parent, so a pooled gradient (or the loss's seed of ones)
    # seen only through a view looked idle and came back as a destination.
    x, y = dev.param([1.0, 2.0]), dev.param([3.0, 4.0])
    with ng.grad_tape():
        loss = x.sum() * y.sum()
    loss.backward()
    np.testing.assert_array_equal(host(x.grad), [7.0, 7.0])
    np.testing.assert_array_equal(host(y.grad), [3.0, 3.0])
    rng = np.random.default_rng(2)
    a_np, v_np = rng.normal(size=(5, 9)), rng.normal(size=9)
    A, v = dev.param(a_np), dev.param(v_np)
    with ng.grad_tape():
        loss = (A @ (v * 1.0)).sum()
    loss.backward()
    np.testing.assert_allclose(host(v.grad), a_np.sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(host(A.grad), np.tile(v_np, (5, 1)), rtol=1e-12)


# ----------------------------------------------------------------- threads
def _train(seed, steps=40):
    rng = np.random.default_rng(seed)
    model = nn.Sequential(nn.Linear(5, 16, rng=rng), nn.Tanh(), nn.Linear(16, 3, rng=rng))
    opt = ng.optim.Adam(model.parameters(), lr=1e-2, accumulate_steps=2)
    X = rng.normal(size=(steps, 8, 5))
    Y = rng.integers(0, 3, size=(steps, 8))
    for i in range(steps):
        with ng.grad_tape():
            loss = ng.cross_entropy(model(ng.as_tensor(X[i])), Y[i]) \
                + 1e-3 * (model[0].weight * model[0].weight).sum()
        loss.backward()
        opt.step()
    return [p.numpy() for p in model.parameters()]


def test_four_threads_train_exactly_as_sequential_runs():
    sequential = [_train(seed) for seed in range(4)]
    results = [None] * 4

    def work(i):
        results[i] = _train(i)
    errors = run_threads(work, 4)
    assert not errors, errors
    for got, want in zip(results, sequential):
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_recording_is_per_thread():
    W = ng.param(np.ones((2, 2)))
    inside, seen = threading.Event(), {}

    def other():
        inside.wait(10)
        seen["recorded"] = (W @ W).requires_grad

    t = threading.Thread(target=other)
    t.start()
    with ng.grad_tape():
        inside.set()
        t.join()
        assert (W @ W).requires_grad
    assert seen["recorded"] is False


# ------------------------------------------------------------------ memory
def test_five_thousand_micro_steps_do_not_grow_memory():
    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.Linear(8, 16, rng=rng), nn.ReLU(), nn.Linear(16, 4, rng=rng))
    opt = ng.optim.Adam(model.parameters(), lr=1e-3, accumulate_steps=4)
    x = ng.as_tensor(rng.normal(size=(16, 8)))
    labels = rng.integers(0, 4, 16)

    def micro_step():
        with ng.grad_tape():
            loss = ng.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()

    # Warm-up: CPython keeps up to 2000 freed tuples of each size on a free
    # list, which tracemalloc counts as allocated; 2500 windows fill them.
    for _ in range(10000):
        micro_step()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for _ in range(5000):
            micro_step()
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes more after 5000 micro-steps"


# ------------------------------------------------------- a number ** tensor
@pytest.mark.parametrize("base", [2.0, 0.5, 0.0, -2.0, 1.0])
def test_a_number_raised_to_a_tensor_matches_pytorch(dev, base):
    torch = pytest.importorskip("torch")
    t_host = np.array([[-1.5, 0.0, 0.5], [2.0, 3.0, -np.inf], [np.nan, 1.0, -1.0]])
    if base < 0:   # real results for whole exponents only
        t_host = np.array([[-1.0, 0.0, 2.0], [3.0, -2.0, 1.0]])
    t = ng.param(t_host, device=dev.name)
    with ng.grad_tape():
        y = base ** t                               # Tensor.__rpow__
        loss = ng.sum(y * y.astype(np.float64))     # a gradient that depends on y
    grads = ng.backward(loss)
    tt = torch.tensor(t_host, requires_grad=True)
    ty = base ** tt
    (ty * ty).sum().backward()
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-14)
    np.testing.assert_allclose(host(grads[t.id]), tt.grad.numpy(), rtol=1e-14)
    np.testing.assert_array_equal(ng.pow(base, t).numpy(), y.numpy())


def test_pow_of_two_tensors_runs_and_promotes_mixed_dtypes():
    x = ng.tensor(np.array([0.5, 2.0, 3.0]))
    np.testing.assert_allclose(ng.pow(x, x).numpy(), np.power(x.numpy(), x.numpy()), rtol=1e-15)
    mixed = ng.pow(x, ng.tensor(np.full(3, 2.0, np.float32)))     # float64, as PyTorch's
    assert mixed.dtype == np.float64
    np.testing.assert_array_equal(mixed.numpy(), x.numpy() ** 2)


# ----------------------------------------------- a loss target that needs a gradient
TARGET_LOSSES = {
    "mse_loss": ({}, False), "l1_loss": ({}, False), "smooth_l1_loss": ({"beta": 0.7}, False),
    "huber_loss": ({"delta": 0.7}, False), "binary_cross_entropy": ({}, True),
    "binary_cross_entropy_with_logits": ({}, False),
}


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name", sorted(TARGET_LOSSES))
def test_a_loss_target_that_requires_grad_gets_pytorchs_gradient(dev, name, reduction):
    """mse_loss(W @ x1, W @ x2): W's gradient has both terms, as PyTorch's."""
    torch = pytest.importorskip("torch")
    kwargs, probabilities = TARGET_LOSSES[name]
    rng = np.random.default_rng(3)
    w_host, x1, x2 = rng.normal(size=(2, 3)), rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    weights = rng.normal(size=(2, 4))
    x1[:, 0] = x2[:, 0]   # equal pred and target in one column: the ties' gradient
    W = dev.param(w_host)
    with ng.grad_tape():
        pred, target = W @ dev.tensor(x1), W @ dev.tensor(x2)
        if probabilities:
            pred, target = ng.sigmoid(pred), ng.sigmoid(target)
        loss = getattr(ng, name)(pred, target, reduction=reduction, **kwargs)
        total = (loss * dev.tensor(weights)).sum() if reduction == "none" else loss
    grads = ng.backward(total)
    tw = torch.tensor(w_host, requires_grad=True)
    tp, tt = tw @ torch.tensor(x1), tw @ torch.tensor(x2)
    if probabilities:
        tp, tt = torch.sigmoid(tp), torch.sigmoid(tt)
    tl = getattr(torch.nn.functional, name)(tp, tt, reduction=reduction, **kwargs)
    (tl * torch.tensor(weights) if reduction == "none" else tl).sum().backward()
    np.testing.assert_allclose(host(loss), tl.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(host(grads[W.id]), tw.grad.numpy(), rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("name", ["binary_cross_entropy", "binary_cross_entropy_with_logits"])
def test_a_probability_target_param_gets_pytorchs_gradient_at_the_edges(dev, name):
    torch = pytest.importorskip("torch")
    x_host = np.array([0.3, 0.0, 1.0, 0.7, 1e-50, 0.5])
    t_host = np.array([0.2, 0.5, 0.5, 0.7, 0.1, 1.0])
    x, t = dev.tensor(x_host), dev.param(t_host)
    with ng.grad_tape():
        loss = getattr(ng, name)(x, t, reduction="sum")
    grads = ng.backward(loss)
    tt = torch.tensor(t_host, requires_grad=True)
    getattr(torch.nn.functional, name)(torch.tensor(x_host), tt, reduction="sum").backward()
    np.testing.assert_allclose(host(grads[t.id]), tt.grad.numpy(), rtol=1e-13)
    assert x.id not in grads


def test_a_compiled_step_gives_the_target_its_gradient():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    w_host = rng.normal(size=(2, 3))
    batches = [(rng.normal(size=(3, 4)), rng.normal(size=(3, 4))) for _ in range(3)]
    W = ng.param(w_host)
    opt = ng.optim.SGD([W], lr=0.1)

    def loss_fn(x1, x2):
        return ng.mse_loss(W @ x1, W @ x2)
    step = ng.compile(loss_fn, optimizer=opt)
    tw = torch.tensor(w_host, requires_grad=True)
    topt = torch.optim.SGD([tw], lr=0.1)
    for _ in range(2):
        for x1, x2 in batches:
            step(ng.tensor(x1), ng.tensor(x2))
            topt.zero_grad()
            torch.nn.functional.mse_loss(tw @ torch.tensor(x1), tw @ torch.tensor(x2)).backward()
            topt.step()
    np.testing.assert_allclose(W.numpy(), tw.detach().numpy(), rtol=1e-12)


# ------------------------------------------ cross_entropy with every label ignored
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_an_all_ignored_micro_batch_gives_a_nan_loss_and_keeps_the_window(dev, smoothing):
    """PyTorch: nan loss, zero gradients; the window's other micro-batch is kept."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    w_host, xs = rng.normal(size=(4, 3)), [rng.normal(size=(5, 4)) for _ in range(2)]
    labels = [np.array([0, 2, -100, 1, 2]), np.full(5, -100)]
    W = dev.param(w_host)
    opt = ng.optim.SGD([W], lr=0.5, accumulate_steps=2)
    tw = torch.tensor(w_host, requires_grad=True)
    for x, y in zip(xs, labels):
        with ng.grad_tape():
            loss = ng.cross_entropy(dev.tensor(x) @ W, y, label_smoothing=smoothing)
        ng.backward(loss)
        opt.step()
        tl = torch.nn.functional.cross_entropy(torch.tensor(x) @ tw, torch.tensor(y),
                                               label_smoothing=smoothing)
        (tl / 2).backward()
        np.testing.assert_allclose(host(loss), tl.detach().numpy(), rtol=1e-12)
    assert np.isnan(host(loss)) and opt.t == 1
    with torch.no_grad():
        tw -= 0.5 * tw.grad
    np.testing.assert_allclose(W.numpy(), tw.detach().numpy(), rtol=1e-12)


# ------------------------------------------------------ attention and non-finite input
ATTENTION_POISON = {
    "nan in q": ("q", (0, 1, 2), np.nan, None), "inf in q": ("q", (0, 1, 2), np.inf, None),
    "nan in k": ("k", (0, 3, 0), np.nan, None), "-inf in k": ("k", (0, 2, 1), -np.inf, None),
    "scale=inf": (None, None, None, np.inf),
}


@pytest.mark.filterwarnings("ignore:.*encountered in scalar:RuntimeWarning")  # the simulator
@pytest.mark.parametrize("case", sorted(ATTENTION_POISON))
def test_attention_propagates_nan_and_inf_as_pytorch(dev, case):
    torch = pytest.importorskip("torch")
    which, where, value, scale = ATTENTION_POISON[case]
    rng = np.random.default_rng(9)
    arrays = {"q": rng.normal(size=(1, 3, 4)), "k": rng.normal(size=(1, 5, 4)),
              "v": rng.normal(size=(1, 5, 2))}
    if which is not None:
        arrays[which][where] = value
    g = rng.normal(size=(1, 3, 2))
    ts = {n: dev.param(a) for n, a in arrays.items()}
    with ng.grad_tape():
        out = ng.scaled_dot_product_attention(ts["q"], ts["k"], ts["v"], scale=scale)
        loss = (out * dev.tensor(g)).sum()
    grads = ng.backward(loss)
    tts = {n: torch.tensor(a, requires_grad=True) for n, a in arrays.items()}
    tout = torch.nn.functional.scaled_dot_product_attention(tts["q"], tts["k"], tts["v"],
                                                            scale=scale)
    (tout * torch.tensor(g)).sum().backward()
    assert np.isnan(tout.detach().numpy()).any()   # the case is a non-finite one
    np.testing.assert_allclose(host(out), tout.detach().numpy(), rtol=1e-12)
    for n, t in ts.items():
        np.testing.assert_allclose(host(grads[t.id]), tts[n].grad.numpy(), rtol=1e-10,
                                   atol=1e-14, err_msg=n)


def test_a_nan_attention_score_trips_the_non_finite_guard(dev):
    rng = np.random.default_rng(10)
    q_host = rng.normal(size=(1, 3, 4))
    q_host[0, 0, 0] = np.nan
    w = dev.param(rng.normal(size=(4, 4)))
    before = w.numpy().copy()
    opt = ng.optim.SGD([w], lr=0.1)
    x = dev.tensor(rng.normal(size=(1, 5, 4)))
    with ng.grad_tape():
        out = ng.scaled_dot_product_attention(dev.tensor(q_host), x @ w, x)
        loss = out.sum()
    ng.backward(loss)
    with pytest.raises(FloatingPointError):
        opt.step()
    np.testing.assert_array_equal(w.numpy(), before)


# --------------------------------------------------- clamp, softplus and batch_norm edges
@pytest.mark.parametrize("bounds", [(np.nan, 1.0), (-1.0, np.nan), (np.nan, None),
                                    (None, np.nan), (np.nan, np.nan)])
def test_a_nan_clamp_bound_gives_nan_and_no_gradient_as_pytorch(dev, bounds):
    torch = pytest.importorskip("torch")
    x_host = np.array([-2.0, 0.5, 3.0, np.nan])
    x = dev.param(x_host)
    with ng.grad_tape():
        y = ng.clamp(x, *bounds)
        loss = (y * dev.tensor(np.arange(1.0, 5.0))).sum()
    grads = ng.backward(loss)
    tx = torch.tensor(x_host, requires_grad=True)
    ty = torch.clamp(tx, *bounds)
    (ty * torch.arange(1.0, 5.0, dtype=torch.float64)).sum().backward()
    assert np.isnan(ty.detach().numpy()).all()
    np.testing.assert_array_equal(host(y), ty.detach().numpy())
    np.testing.assert_array_equal(host(grads[x.id]), tx.grad.numpy())


@pytest.mark.filterwarnings("ignore:.*encountered in scalar:RuntimeWarning")  # the simulator
@pytest.mark.parametrize("threshold", [20.0, 10.0])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softplus_of_a_huge_input_with_beta_is_the_input_as_pytorch(dev, dtype, threshold):
    torch = pytest.importorskip("torch")
    big = np.finfo(dtype).max
    x_host = np.array([big, 400.0, -big, 0.25, 4.9, 5.0, 5.1], dtype)
    x = dev.param(x_host)
    with ng.grad_tape():
        y = ng.softplus(x, beta=2.0, threshold=threshold)
        loss = y.sum()
    grads = ng.backward(loss)
    tx = torch.tensor(x_host, requires_grad=True)
    ty = torch.nn.functional.softplus(tx, beta=2.0, threshold=threshold)
    ty.sum().backward()
    np.testing.assert_allclose(host(y), ty.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(host(grads[x.id]), tx.grad.numpy(), rtol=1e-6)


def test_batch_norm_refuses_eps_0_in_training_as_pytorch(dev):
    x = dev.tensor(np.ones((3, 2)))
    with pytest.raises(ValueError, match="batch_norm: eps must be positive during training"):
        ng.batch_norm(x, None, None, training=True, eps=0.0)
    mean, var = dev.tensor(np.zeros(2)), dev.tensor(np.ones(2))
    out = ng.batch_norm(x, mean, var, training=False, eps=0.0)   # evaluation: allowed
    np.testing.assert_array_equal(host(out), np.ones((3, 2)))


# ------------------------------------------------------------ read-only operands
READ_ONLY_OPS = {
    "mul": lambda w, a: w * a, "rmul": lambda w, a: a * w, "sub": lambda w, a: w - a,
    "rsub": lambda w, a: a - w, "div": lambda w, a: w / a, "add": lambda w, a: w + a,
    "maximum": lambda w, a: ng.maximum(w, a), "minimum": lambda w, a: ng.minimum(a, w),
    "where": lambda w, a: ng.where(a > 2, w, a), "matmul": lambda w, a: w @ a.T,
    "mse_loss": lambda w, a: ng.mse_loss(w, a), "l1_loss": lambda w, a: ng.l1_loss(w, a),
    "broadcast": lambda w, a: w * a[:1],
}


@pytest.mark.parametrize("name", sorted(READ_ONLY_OPS))
def test_read_only_operands_work_as_in_pytorch(tmp_path, name):
    """np.load(mmap_mode="r") and writeable=False arrays as operands: both
    passes work, with the gradients of a writable copy."""
    fn = READ_ONLY_OPS[name]
    path = tmp_path / "a.npy"
    np.save(path, np.arange(1.0, 7.0).reshape(2, 3))
    frozen = np.arange(1.0, 7.0).reshape(2, 3)
    frozen.flags.writeable = False
    results = []
    for a in (np.load(path, mmap_mode="r"), frozen, np.arange(1.0, 7.0).reshape(2, 3)):
        W = ng.param(np.linspace(-1.0, 2.0, 6).reshape(2, 3))
        with ng.grad_tape():
            loss = ng.sum(fn(W, a))
        results.append((loss.numpy(), ng.backward(loss)[W.id].copy()))
    for got in results[:2]:
        np.testing.assert_array_equal(got[0], results[2][0])
        np.testing.assert_array_equal(got[1], results[2][1])


def test_read_only_labels_and_indices_work():
    labels, idx = np.array([0, 2]), np.array([1, 0, 1])
    labels.flags.writeable = idx.flags.writeable = False
    W, E = ng.param(np.ones((2, 3))), ng.param(np.ones((4, 3)))
    with ng.grad_tape():
        loss = ng.cross_entropy(W, labels) + ng.sum(ng.embedding(idx, E)) + ng.sum(W[idx[:2]])
    grads = ng.backward(loss)
    np.testing.assert_allclose(grads[E.id].sum(axis=1), [3.0, 6.0, 0.0, 0.0])
    assert np.isfinite(grads[W.id]).all()


def test_as_tensor_refuses_a_read_only_array_by_name():
    a = np.ones((2, 3))
    a.flags.writeable = False
    with pytest.raises(ValueError, match=r"as_tensor: the float64 array of shape \(2, 3\) "
                                         "is read-only"):
        ng.as_tensor(a)
    np.testing.assert_array_equal(ng.tensor(a).numpy(), a)   # the copy is fine


def test_a_compiled_step_takes_read_only_arguments():
    x, y = np.ones((3, 4)), np.arange(8.0).reshape(2, 4)
    x.flags.writeable = y.flags.writeable = False
    params = []
    for compiled in (True, False):
        W = ng.param(np.linspace(0.0, 1.0, 6).reshape(2, 3))
        opt = ng.optim.SGD([W], lr=0.1)

        def loss_fn(x, y):
            return ng.mse_loss(W @ x, y) + ng.sum(ng.maximum(W, y[:, :3] * 0.5))
        step = ng.compile(loss_fn, optimizer=opt) if compiled else None
        for _ in range(4):
            if compiled:
                step(x, y)
            else:
                with ng.grad_tape():
                    loss = loss_fn(x, y)
                ng.backward(loss)
                opt.step()
        params.append(W.numpy().copy())
    np.testing.assert_array_equal(params[0], params[1])


# ---------------------------------------------------- huge and negative shapes
HUGE = {
    "add": (lambda: ng.tensor(np.ones((10**6, 1))) + ng.tensor(np.ones((1, 10**8))),
            MemoryError, r"add: an output of shape \(1000000, 100000000\) \(float64, "
                         r"800,000,000,000,000 bytes\) on cpu cannot be allocated"),
    "matmul": (lambda: ng.tensor(np.ones((10**6, 1))) @ ng.tensor(np.ones((1, 10**8))),
               MemoryError, r"matmul: an output of shape \(1000000, 100000000\)"),
    "pad": (lambda: ng.pad(ng.tensor(np.ones((2, 3))), ((0, 10**12), (0, 0))),
            MemoryError, r"pad: an output of shape \(1000000000002, 3\)"),
    "exp of an expand": (lambda: ng.exp(ng.tensor(np.ones((2, 3))).expand(10**12, 2, 3)),
                         MemoryError, r"exp: an output of shape \(1000000000000, 2, 3\)"),
    "expand past intp": (lambda: ng.tensor(np.ones((2, 3))).expand(10**12, 10**12, 2, 3),
                         ValueError, r"broadcast_to: shape .* more than an array can index"),
    "reshape -2": (lambda: ng.tensor(np.ones((2, 3))).reshape(-2, 3), ValueError,
                   r"reshape: cannot reshape a tensor of shape \(2, 3\).* invalid shape "
                   r"dimension -2"),
    "reshape two -1": (lambda: ng.tensor(np.ones((2, 3))).reshape(-1, -1), ValueError,
                       "reshape: .*only one dimension can be -1"),
    "broadcast_to negative": (lambda: ng.broadcast_to(ng.tensor(np.ones(3)), (-2, 3)),
                              ValueError, "broadcast_to: a shape cannot have negative sizes"),
}


@pytest.mark.parametrize("case", sorted(HUGE))
def test_huge_and_negative_shapes_raise_naming_the_op(case):
    fn, exc, match = HUGE[case]
    with pytest.raises(exc, match=match):
        fn()


def test_an_expanded_tensor_reshapes_without_materialising_its_elements():
    x = ng.tensor(np.arange(6.0).reshape(2, 3)).expand(10**6, 2, 3)
    tracemalloc.start()
    try:
        shape = ng.ops.shape._new_shape(x, (-1, 6), "reshape")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert shape == (10**6, 6) and peak < 1 << 20


# ------------------------------------------ ng.compile and a changed model
class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 6, dtype=np.float64, rng=np.random.default_rng(0))
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(6, 3, dtype=np.float64, rng=np.random.default_rng(1))

    def forward(self, x):
        return self.fc2(self.drop(ng.relu(self.fc1(x))))


def _replace_head(model):
    model.fc2 = nn.Linear(6, 3, dtype=np.float64, rng=np.random.default_rng(2))


CHANGES = {"eval": lambda m: m.eval(), "replace a layer": _replace_head,
           "dropout p": lambda m: setattr(m.drop, "p", 0.0)}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_compiled_step_records_again_after_the_model_changes(change):
    """The step's loss and gradients after model.eval(), a layer replaced or a
    setting changed are eager mode's (verify=False: no eager check call)."""
    rng = np.random.default_rng(11)
    xs = [rng.normal(size=(8, 4)) for _ in range(6)]
    labels = rng.integers(0, 3, 8)
    out = []
    for compiled in (False, True):
        ng.random.manual_seed(5)
        model = _Net()

        def loss_fn(x):
            return ng.cross_entropy(model(x), labels)
        step = ng.compile(loss_fn, verify=False) if compiled else None
        results = []
        for i, x in enumerate(xs):
            if i == 3:
                CHANGES[change](model)
            for p in model.parameters():
                p.grad = None
            if compiled:
                loss = step(ng.tensor(x))
            else:
                with ng.grad_tape():
                    loss = loss_fn(ng.tensor(x))
                loss.backward()
            results.append([loss.numpy()] + [p.grad.copy() for p in model.parameters()])
        out.append(results)
    for i, (a, b) in enumerate(zip(*out)):
        for u, v in zip(a, b):
            np.testing.assert_array_equal(u, v, err_msg=f"call {i}")


@pytest.mark.parametrize("make, match", [
    (lambda: nn.Linear(10**8, 10**8), r"Linear: its parameter of shape \(100000000, 100000000\)"),
    (lambda: nn.Linear(10**10, 10**10), r"Linear: its parameter of shape .* array is too big"),
    (lambda: nn.Embedding(10**9, 10**6), r"Embedding: its parameter of shape \(1000000000, "),
    (lambda: nn.Conv2d(10**5, 10**5, 100), r"Conv2d: its parameter of shape \(100000, 100000, "
                                           r"100, 100\)"),
    (lambda: nn.MultiheadAttention(10**7, 1), r"MultiheadAttention: its parameter of shape"),
])
def test_a_layer_too_big_to_allocate_names_itself(make, match):
    with pytest.raises(MemoryError, match=match):
        make()


def test_training_and_evaluation_steps_compiled_apart_record_once_each():
    """The patterns that must not record on every call: a mode switched and
    switched back between calls, fn setting the mode itself, another model's
    mode changing."""
    rng = np.random.default_rng(12)
    x, labels = ng.tensor(rng.normal(size=(8, 4))), rng.integers(0, 3, 8)
    model, other = _Net(), _Net()
    opt = ng.optim.SGD(model.parameters(), lr=0.1)

    def loss_of():
        return ng.cross_entropy(model(x), labels)

    def train_step():
        model.train()
        return loss_of()

    def eval_step():
        model.eval()
        return loss_of()
    plain = ng.compile(loss_of, optimizer=opt, verify=False)
    ts = ng.compile(train_step, optimizer=opt, verify=False)
    es = ng.compile(eval_step, verify=False)
    for _ in range(5):
        model.train()
        plain()
        model.eval()
        model(x)                  # an evaluation outside the compiled step
        other.eval()
        other.train()
        ts()
        es()
    assert (len(plain.stats), len(ts.stats), len(es.stats)) == (1, 1, 1)
