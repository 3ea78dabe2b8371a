"""ng.custom_op: the user's own @njit / @cuda.jit kernels as a differentiable op,
against PyTorch, the same computation in built-in ops and finite differences,
on the tape, under ng.compile (the generated @njit step, the CUDA replay, a
kernel in __main__, a kernel edited between two processes) and bad input."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import cuda_dev, matches_torch
from numba import cuda, njit

import numbagrad as ng

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------ the kernels
# scaled_square(x, s) = s * x**2, any rank (CPU), 1-D (CUDA: one thread an element)
@njit
def sq_forward(out, x, s):
    for i in range(x.size):
        out.flat[i] = s * x.flat[i] * x.flat[i]


@njit
def sq_backward(gout, out, x, s, gx):
    for i in range(x.size):
        gx.flat[i] += gout.flat[i] * 2.0 * s * x.flat[i]


@cuda.jit
def sq_forward_cuda(out, x, s):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = s * x[i] * x[i]


@cuda.jit
def sq_backward_cuda(gout, out, x, s, gx):
    i = cuda.grid(1)
    if i < out.size:
        gx[i] += gout[i] * 2.0 * s * x[i]


sq = ng.custom_op("scaled_square", sq_forward, sq_backward, cuda_forward=sq_forward_cuda,
                  cuda_backward=sq_backward_cuda)


# rowdot(x, w) = x @ w for x (n, k), w (k,): two inputs, its own output shape
@njit
def rowdot_forward(out, x, w):
    for i in range(x.shape[0]):
        acc = 0.0
        for j in range(x.shape[1]):
            acc += x[i, j] * w[j]
        out[i] = acc


@njit
def rowdot_backward(gout, out, x, w, gx, gw):
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            gx[i, j] += gout[i] * w[j]
            gw[j] += gout[i] * x[i, j]


@cuda.jit
def rowdot_forward_cuda(out, x, w):
    i = cuda.grid(1)
    if i < out.size:
        acc = 0.0
        for j in range(x.shape[1]):
            acc += x[i, j] * w[j]
        out[i] = acc


@cuda.jit
def rowdot_backward_cuda(gout, out, x, w, gx, gw):
    j = cuda.grid(1)          # one thread a column: no two threads add into one gw[j]
    if j < w.size:
        for i in range(x.shape[0]):
            gx[i, j] += gout[i] * w[j]
            gw[j] += gout[i] * x[i, j]


def _columns(out_shape, x_shape, w_shape):
    return 1, w_shape[0]


rowdot = ng.custom_op("rowdot", rowdot_forward, rowdot_backward,
                      out_shape=lambda xs, ws: xs[:-1],
                      cuda_forward=rowdot_forward_cuda,
                      cuda_backward=(rowdot_backward_cuda, _columns))


def _shape(dev, shape):
    """CUDA kernels here are 1-D (sq), and the simulator wants tiny arrays."""
    return (7,) if dev.name == "cuda" else shape


# ------------------------------------------------------------ values and gradients
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scaled_square_matches_torch_and_builtins(dev, dtype):
    rng = np.random.default_rng(0)
    a = rng.normal(size=_shape(dev, (2, 3, 4))).astype(dtype)
    tight = dtype == np.float64
    matches_torch(lambda x: sq(x, 0.5), lambda t: 0.5 * t * t, [a], dev, "scaled_square",
                  rtol=1e-12 if tight else 1e-6, atol=0 if tight else 1e-6)
    x = dev.param(a)
    with ng.grad_tape():
        y = sq(x, 0.5)
        y.sum().backward()
    assert y.dtype == dtype and x.grad.dtype == dtype and y.shape == a.shape
    twin = dev.param(a)
    with ng.grad_tape():
        z = 0.5 * twin * twin
        z.sum().backward()
    np.testing.assert_allclose(y.numpy(), z.numpy(), rtol=1e-6)
    np.testing.assert_allclose(dev.host(x.grad), dev.host(twin.grad), rtol=1e-6)


def test_any_rank_and_non_contiguous_inputs():
    rng = np.random.default_rng(1)
    for shape in [(), (5,), (2, 3, 2, 2)]:
        a = rng.normal(size=shape)
        matches_torch(lambda x: sq(x, 2), lambda t: 2 * t * t, [a], name=f"rank {len(shape)}")
    a = rng.normal(size=(3, 4))
    x = ng.param(a)
    with ng.grad_tape():
        y = sq(ng.transpose(x), 1.5)     # a strided view: passed as a C-contiguous copy
        (y * ng.tensor(np.arange(12.0).reshape(4, 3))).sum().backward()
    np.testing.assert_array_equal(y.numpy(), 1.5 * a.T * a.T)
    np.testing.assert_allclose(x.grad, (np.arange(12.0).reshape(4, 3) * 3.0 * a.T).T)


def test_two_inputs_with_their_own_output_shape(dev):
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(3, 4)), rng.normal(size=(4,))
    matches_torch(rowdot, lambda x, w: x @ w, [a, b], dev, "rowdot")
    # an input that needs no gradient gets a scratch buffer and no gradient
    x, w = dev.param(a), dev.tensor(b)
    with ng.grad_tape():
        y = rowdot(x, w)
        builtin = ng.matmul(dev.tensor(a), w)
        grads = ng.backward(y.sum())
    np.testing.assert_allclose(y.numpy(), builtin.numpy(), rtol=1e-12)
    assert set(grads) == {x.id}
    np.testing.assert_allclose(dev.host(grads[x.id]), np.broadcast_to(b, (3, 4)), rtol=1e-12)


def test_gradcheck(dev):
    rng = np.random.default_rng(3)
    x = dev.param(rng.normal(size=_shape(dev, (2, 3))))
    a, b = dev.param(rng.normal(size=(3, 2))), dev.param(rng.normal(size=(2,)))
    weights = dev.tensor(rng.normal(size=(3,)))
    directions = None if dev.name == "cpu" else 2
    ng.gradcheck(lambda: (sq(x, 0.75) * 1.5).sum(), [x], directions=directions)
    ng.gradcheck(lambda: (rowdot(ng.tanh(a), b) * weights).sum(), [a, b],
                 directions=directions)


def test_gradients_accumulate_exactly():
    """The backward adds into the accumulator itself: two passes give exactly
    twice one pass, and a second use in one graph adds to the first."""
    rng = np.random.default_rng(4)
    x = ng.param(rng.normal(size=(4, 5)))
    with ng.grad_tape():
        sq(x, 0.5).sum().backward()
    once = x.grad.copy()
    with ng.grad_tape():
        sq(x, 0.5).sum().backward()
    np.testing.assert_array_equal(x.grad, 2 * once)
    x.grad = None
    with ng.grad_tape():
        (sq(x, 0.5) + sq(x, 0.5)).sum().backward()
    np.testing.assert_array_equal(x.grad, 2 * once)


def test_numbers_are_scalars_and_empty_tensors_run_nothing():
    rng = np.random.default_rng(5)
    a = rng.normal(size=(3,)).astype(np.float32)
    for s in (2, 0.5, np.float32(0.25), True):
        np.testing.assert_allclose(sq(a, s).numpy(), float(s) * a * a, rtol=1e-6)
    x = ng.param(np.zeros((0, 3)))
    with ng.grad_tape():
        y = sq(x, 1.0)
        y.sum().backward()
    assert y.shape == (0, 3) and x.grad.shape == (0, 3)


@njit
def take_forward(out, x, idx):
    for i in range(idx.size):
        out[i] = x[idx[i]]


@njit
def take_backward(gout, out, x, idx, gx, gidx):
    for i in range(idx.size):
        gx[idx[i]] += gout[i]        # repeated indices add up; gidx (integers) is scratch


take = ng.custom_op("take", take_forward, take_backward, out_shape=lambda xs, ids: ids)


def test_integer_inputs_and_the_output_dtype():
    rng = np.random.default_rng(8)
    a, idx = rng.normal(size=(5,)), np.array([4, 0, 4, 2])
    matches_torch(lambda x: take(x, idx), lambda t: t[idx], [a], name="take")
    x = ng.param(a)
    with ng.grad_tape():
        assert take(x, ng.tensor(idx)).dtype == np.float64
    single = ng.custom_op("take32", take_forward, out_shape=lambda xs, ids: ids,
                          out_dtype=np.float32)
    y = single(a, idx)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y.numpy(), a[idx].astype(np.float32))
    widest = ng.custom_op("widest", sq_forward, out_dtype=lambda dt: np.promote_types(dt, "f8"))
    assert widest(a.astype(np.float32), 1.0).dtype == np.float64


def test_forward_only_op_runs_without_a_gradient():
    op = ng.custom_op("scale_only", sq_forward)
    x = ng.param(np.arange(3.0))
    np.testing.assert_array_equal(op(x, 2.0).numpy(), 2.0 * np.arange(3.0) ** 2)
    with ng.grad_tape(), ng.no_grad():
        assert not op(x, 2.0).requires_grad
    with ng.grad_tape():
        assert not op(ng.tensor(np.arange(3.0)), 2.0).requires_grad


# ------------------------------------------------------------ under ng.compile
def _sgd_case(seed=0):
    rng = np.random.default_rng(seed)
    W = ng.param(rng.normal(size=(4, 3)))
    v = ng.param(rng.normal(size=(3,)))
    return W, v, ng.optim.SGD([W, v], lr=0.05, momentum=0.9)


def _loss(W, v):
    return lambda x, y: ng.mse_loss(rowdot(sq(ng.matmul(x, W), 0.5), v), y)


def test_compiled_step_is_njit_and_bit_identical_to_eager():
    W, v, opt = _sgd_case()
    We, ve, opte = _sgd_case()
    step = ng.compile(_loss(W, v), optimizer=opt)
    eager = _loss(We, ve)
    rng = np.random.default_rng(6)
    for _ in range(5):
        x, y = ng.tensor(rng.normal(size=(5, 4))), ng.tensor(rng.normal(size=(5,)))
        loss = step(x, y)
        with ng.grad_tape():
            want = eager(x, y)
        want.backward()
        opte.step()
        assert loss.item() == want.item()
        for a, b in ((W, We), (v, ve)):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert [s["mode"] for s in step.stats] == ["njit"]


def test_compiled_step_on_cuda_replays_the_launches():
    dev = cuda_dev()
    rng = np.random.default_rng(7)
    a, b = rng.normal(size=(3, 2)), rng.normal(size=(2,))
    p, q = dev.param(a), dev.param(b)
    pe, qe = dev.param(a), dev.param(b)
    x = dev.tensor(rng.normal(size=(3, 2)))
    step = ng.compile(lambda x: rowdot(p * x, q).sum())
    for _ in range(2):
        loss = step(x)
        with ng.grad_tape():
            want = rowdot(pe * x, qe).sum()
        want.backward()
        assert loss.item() == want.item()
        np.testing.assert_array_equal(dev.host(p.grad), dev.host(pe.grad))
        np.testing.assert_array_equal(dev.host(q.grad), dev.host(qe.grad))
    assert step.stats[0]["mode"] == "replay"


SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    import numbagrad as ng
    from numba import njit

    @njit(cache=True)
    def forward(out, x):
        for i in range(x.size):
            out.flat[i] = 2.0 * x.flat[i]

    @njit(cache=True)
    def backward(gout, out, x, gx):
        for i in range(x.size):
            gx.flat[i] += 2.0 * gout.flat[i]

    op = ng.custom_op("twice", forward, backward)
    w = ng.param(np.arange(6.0).reshape(2, 3))
    step = ng.compile(lambda x: op(w * x).sum())
    x = ng.tensor(np.ones((2, 3)))
    losses = [step(x).item() for _ in range(3)]
    print(json.dumps(dict(step.stats[0], losses=losses, grad=w.grad.tolist())))
""")


def test_a_kernel_in_main_and_edited_between_processes(tmp_path):
    """A script's own kernels under ng.compile; then the same script with
    another kernel body, in a new process with the same cache folder: the
    generated step comes from the cache, and calls the new kernel."""
    script = tmp_path / "train.py"
    env = dict(os.environ, NUMBAGRAD_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=ROOT)
    env.pop("NUMBA_CACHE_DIR", None)
    runs = []
    for factor in ("2.0", "3.25"):
        script.write_text(SCRIPT.replace("2.0", factor))
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                              text=True, timeout=240, check=False, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    w = np.arange(6.0).reshape(2, 3)
    for run, factor in zip(runs, (2.0, 3.25)):
        assert run["mode"] == "njit"
        assert run["losses"] == [factor * w.sum()] * 3
        assert run["grad"] == np.full((2, 3), 3 * factor).tolist()
    assert (runs[0]["cache"], runs[1]["cache"]) == ("miss", "hit")
    assert runs[0]["module"] == runs[1]["module"]


# ------------------------------------------------------------ bad input
@njit
def _typo(out, x):
    out[0] = x.no_such_attribute


def test_bad_kernels_fail_at_definition():
    def plain(out, x):
        out[:] = x

    with pytest.raises(TypeError, match="forward must be an @njit function.*numba.njit"):
        ng.custom_op("bad", plain, None)
    with pytest.raises(TypeError, match="cuda_forward="):
        ng.custom_op("bad", sq_forward_cuda, None)
    with pytest.raises(TypeError, match="backward must be an @njit"):
        ng.custom_op("bad", sq_forward, sq_backward_cuda)
    with pytest.raises(TypeError, match="cuda_forward must be a @cuda.jit kernel"):
        ng.custom_op("bad", sq_forward, sq_backward, cuda_forward=sq_forward)
    with pytest.raises(TypeError, match="forward must take \\(out, \\*inputs\\).*takes 1"):
        ng.custom_op("bad", njit(lambda out: None), None)
    with pytest.raises(TypeError, match="backward must take.*\\(5 to 6 arguments\\); it takes 7"):
        ng.custom_op("bad", sq_forward, njit(lambda g, o, x, s, a, b, c: None))
    with pytest.raises(TypeError, match="forward takes 3 arguments and cuda_forward 5"):
        ng.custom_op("bad", sq_forward, cuda_forward=sq_backward_cuda)
    with pytest.raises(TypeError, match="a forward kernel is needed"):
        ng.custom_op("bad", None, sq_backward)
    with pytest.raises(TypeError, match="out_shape must be a function"):
        ng.custom_op("bad", sq_forward, out_shape=(3,))
    with pytest.raises(TypeError, match="out_dtype must be a dtype or a function"):
        ng.custom_op("bad", sq_forward, out_dtype=object())


def test_bad_calls_fail_before_anything_runs():
    x = ng.param(np.arange(3.0))
    with pytest.raises(TypeError, match="'scaled_square' takes 2 input"):
        sq(x)
    with pytest.raises(TypeError, match="backward takes 1 grad buffer.*2 tensor input"):
        sq(x, x)
    with pytest.raises(TypeError, match="at least one tensor input"):
        sq(1.0, 2.0)
    forward_only = ng.custom_op("forward_only", sq_forward)
    with ng.grad_tape():
        with pytest.raises(TypeError, match="'forward_only' has no cpu backward .*requires "
                                            "a gradient"):
            forward_only(x, 2.0)
    assert x.grad is None
    cpu_only = ng.custom_op("cpu_only", sq_forward, sq_backward)
    if ng.cuda_available():
        with pytest.raises(TypeError, match="'cpu_only' has no cuda kernel.*cuda_forward="):
            cpu_only(ng.tensor(np.ones(2), device="cuda"), 1.0)
        with pytest.raises(ValueError, match="inputs on different devices"):
            rowdot(ng.tensor(np.ones((2, 2))), ng.tensor(np.ones(2), device="cuda"))
    cuda_only = ng.custom_op("cuda_only", None, cuda_forward=sq_forward_cuda)
    with pytest.raises(TypeError, match="'cuda_only' has no cpu kernel.*forward="):
        cuda_only(x, 1.0)
    with pytest.raises(TypeError, match="'typo': Numba could not compile forward for "
                                        "\\(float64\\[3\\], float64\\[3\\]\\)"):
        ng.custom_op("typo", _typo)(x)
    returns = ng.custom_op("returns", njit(lambda out, x: 1.0))
    with pytest.raises(TypeError, match="forward returned a value"):
        returns(x)
    with pytest.raises(ValueError, match="out_shape returned"):
        ng.custom_op("neg_shape", sq_forward, out_shape=lambda s: (-1,))(x, 1.0)


def test_the_overhead_benchmark_runs(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "scripts"))
    import bench_custom_op
    rows = bench_custom_op.main(["--shape", "4", "3", "--repeats", "2", "--min-time", "0.001"])
    assert [(r["op"], r["mode"]) for r in rows] == [
        (op, mode) for op in ("relu", "scale") for mode in bench_custom_op.MODES]
    assert all(r["q1"] <= r["ratio"] <= r["q3"] and r["custom_us"] > 0 for r in rows)
