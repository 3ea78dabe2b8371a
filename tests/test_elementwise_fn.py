"""@ng.elementwise: a scalar Python function as one fused elementwise op whose
derivatives come from forward-mode differentiation of its source. Each
function is checked against the same expression written with numbagrad ops
(4 ulp, values and gradients), finite differences and PyTorch."""
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import numbagrad as ng
from conftest import compiled_matches_eager
from numbagrad.elementwise_fn import ElementwiseError, _threaded

torch = pytest.importorskip("torch")

SCALE = 3.0


@ng.elementwise
def poly(x, y):
    return 2.0 * x ** 3 + SCALE * x * y + y * y + 1


def poly_ops(x, y):
    return 2.0 * x ** 3 + SCALE * x * y + y * y + 1


@ng.elementwise
def softplus_if(x):
    if x > 2.0:
        return x
    return math.log1p(math.exp(x))


def softplus_ops(x):
    return ng.where(x > 2.0, x, ng.log1p(ng.exp(x)))


@ng.elementwise
def transcendental(x, y):
    a = math.exp(x) * math.tanh(y)
    a += math.log(y) * math.erf(x)
    return a


def transcendental_ops(x, y):
    return ng.exp(x) * ng.tanh(y) + ng.log(y) * ng.erf(x)


@ng.elementwise
def three(x, y, z):
    return x * y * y + z * x + math.sqrt(z)


def three_ops(x, y, z):
    return x * y * y + z * x + ng.sqrt(z)


# name -> (fused, ops twin, input shapes, input ranges): ranges keep every
# partial a sum of same-signed terms, so that 4 ulp is a fair bound for two
# different orders of rounding
CASES = {
    "poly": (poly, poly_ops, [(3, 4), (3, 4)], [(0.5, 2.0), (0.5, 2.0)]),
    "softplus_if": (softplus_if, softplus_ops, [(4, 5)], [(-3.0, 4.0)]),
    "transcendental": (transcendental, transcendental_ops, [(3, 4), (4,)],
                       [(0.1, 1.5), (1.2, 3.0)]),
    "three_broadcast": (three, three_ops, [(2, 1, 3), (4, 1), (3,)],
                        [(0.5, 2.0), (0.5, 2.0), (0.5, 2.0)]),
}


def inputs(case, dtype, seed=0, device="cpu"):
    _, _, shapes, ranges = CASES[case]
    rng = np.random.default_rng(seed)
    return [ng.param(rng.uniform(lo, hi, s).astype(dtype), device=device)
            for s, (lo, hi) in zip(shapes, ranges)]


def run(fn, params, weight):
    """fn's value and every param's gradient of sum(weight * fn(*params))."""
    for p in params:
        p.grad = None
    with ng.grad_tape():
        out = fn(*params)
        (out * weight).sum().backward()
    return out.numpy(), [np.array(p.grad, copy=True) for p in params]   # (.grad is reused)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_the_ops_expression_to_4_ulp(case, dtype):
    fused, ops, _, _ = CASES[case]
    params = inputs(case, dtype)
    shape = np.broadcast_shapes(*(p.shape for p in params))
    weight = ng.tensor(np.random.default_rng(1).uniform(0.5, 1.5, shape).astype(dtype))
    value, grads = run(fused, params, weight)
    ref_value, ref_grads = run(ops, params, weight)
    assert value.dtype == dtype and value.shape == shape
    np.testing.assert_array_max_ulp(value, ref_value, maxulp=4)
    for g, r, p in zip(grads, ref_grads, params):
        assert g.dtype == dtype and g.shape == p.shape
        np.testing.assert_array_max_ulp(g, r, maxulp=4)


@pytest.mark.parametrize("case", ["softplus_if", "three_broadcast"])
def test_gradients_match_finite_differences(case):
    fused = CASES[case][0]
    params = inputs(case, np.float64, seed=2)
    ng.gradcheck(lambda: (fused(*params) ** 2).sum(), params)


def test_values_and_gradients_match_pytorch():
    rng = np.random.default_rng(3)
    xs, ys = rng.uniform(0.1, 1.5, (3, 4)), rng.uniform(1.2, 3.0, (4,))
    x, y = ng.param(xs), ng.param(ys)
    with ng.grad_tape():
        out = transcendental(x, y)
        out.sum().backward()
    tx, ty = (torch.tensor(a, requires_grad=True) for a in (xs, ys))
    tout = torch.exp(tx) * torch.tanh(ty) + torch.log(ty) * torch.erf(tx)
    tout.sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-13)
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-13)
    np.testing.assert_allclose(y.grad, ty.grad.numpy(), rtol=1e-13)
    # the if: torch's softplus with threshold 2 takes the same branch
    vs = np.array([-3.0, -0.5, 0.0, 1.5, 2.5, 9.0])
    v = ng.param(vs)
    with ng.grad_tape():
        s = softplus_if(v)
        s.sum().backward()
    tv = torch.tensor(vs, requires_grad=True)
    ts = torch.nn.functional.softplus(tv, threshold=2.0)
    ts.sum().backward()
    np.testing.assert_allclose(s.numpy(), ts.detach().numpy(), rtol=1e-13)
    np.testing.assert_allclose(v.grad, tv.grad.numpy(), rtol=1e-13)


@ng.elementwise
def extremes(x, y):
    return max(x, y) * abs(x) + min(x, 0.5) + (x if x < y else -y) + (x > 0.0) * 2.0


def test_min_max_abs_and_comparisons_follow_pytorch_at_ties():
    xs = np.array([-1.0, 0.0, 0.5, 0.7, 2.0])
    ys = np.array([-1.0, 1.0, 0.5, 0.1, 3.0])
    x, y = ng.param(xs), ng.param(ys)
    with ng.grad_tape():
        out = extremes(x, y)
        out.sum().backward()
    tx, ty = (torch.tensor(a, requires_grad=True) for a in (xs, ys))
    half = torch.tensor(0.5, dtype=torch.float64)
    tout = (torch.maximum(tx, ty) * torch.abs(tx) + torch.minimum(tx, half)
            + torch.where(tx < ty, tx, -ty) + (tx > 0) * 2.0)
    tout.sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-15)
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-15)
    np.testing.assert_allclose(y.grad, ty.grad.numpy(), rtol=1e-15)


@ng.elementwise
def powers(x, y):
    return x ** y + math.atan2(y, x) - math.hypot(x, 2.0) / math.cosh(y)


def test_tensor_exponents_and_two_argument_math_match_pytorch():
    rng = np.random.default_rng(5)
    xs, ys = rng.uniform(0.2, 2.0, (3, 1)), rng.uniform(-1.5, 1.5, (4,))
    x, y = ng.param(xs), ng.param(ys)
    with ng.grad_tape():
        out = powers(x, y)
        out.sum().backward()
    tx, ty = (torch.tensor(a, requires_grad=True) for a in (xs, ys))
    tout = tx ** ty + torch.atan2(ty, tx) - torch.hypot(tx, torch.tensor(2.0,
                                                                        dtype=torch.float64)) \
        / torch.cosh(ty)
    tout.sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-13)
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-13)
    np.testing.assert_allclose(y.grad, ty.grad.numpy(), rtol=1e-13)


def test_cuda_matches_cpu():
    if not ng.cuda_available():
        pytest.skip(ng.cuda_unavailable_reason())
    results = {}
    for device in ("cpu", "cuda"):
        params = inputs("three_broadcast", np.float32, device=device)
        with ng.grad_tape():
            out = three(*params)
            (out * 1.5).sum().backward()
        results[device] = [out.numpy()] + [np.array(p.grad) if device == "cpu"
                                           else p.grad.copy_to_host() for p in params]
    for a, b in zip(results["cpu"], results["cuda"]):
        np.testing.assert_array_max_ulp(a, b, maxulp=4)


def test_cuda_compiled_step_replays_eager(tmp_path):
    if not ng.cuda_available():
        pytest.skip(ng.cuda_unavailable_reason())
    rng = np.random.default_rng(6)
    w0 = rng.uniform(0.5, 1.0, (2, 3)).astype(np.float32)
    pa, pb = ng.param(w0, device="cuda"), ng.param(w0.copy(), device="cuda")
    step = ng.compile(lambda x: three(x, pb, 0.75).sum(), cache_dir=str(tmp_path))
    for _ in range(3):
        x = ng.tensor(rng.uniform(0.5, 1.0, (3,)).astype(np.float32), device="cuda")
        with ng.grad_tape():
            la = three(x, pa, 0.75).sum()
        la.backward()
        lb = step(x)
        assert la.numpy().tobytes() == lb.numpy().tobytes()
        assert pa.grad.copy_to_host().tobytes() == pb.grad.copy_to_host().tobytes()
    assert [s["mode"] for s in step.stats] == ["replay"]


def test_threaded_twins_give_the_serial_bits():
    from numbagrad import kernels
    from numbagrad.kernels.cpu import _threads
    cpu = kernels.get("cpu")
    if cpu.MT_MIN > 2 * 40000:
        pytest.skip("threads are off (NUMBAGRAD_PARALLEL_MIN or one Numba thread)")
    rng = np.random.default_rng(4)
    xs = rng.uniform(-3.0, 4.0, (2, 40000))
    gs = rng.normal(size=(2, 40000))
    x = ng.param(xs)
    running = _threads.governor is not None
    _threads.stop_governor()             # threads on, whatever the load makes of them
    try:
        assert _threaded(cpu, (1, 80000))
        with ng.grad_tape():
            y = softplus_if(x)
            (y * ng.tensor(gs)).sum().backward()
    finally:
        if running:
            _threads.start_governor()
    forward, backward = softplus_if.kernels(cpu, np.dtype(np.float64), 2)[:2]
    out, dest = np.empty_like(xs), np.empty_like(xs)
    forward(xs, out)
    backward(xs, gs, dest, 0.0, True)
    assert y.numpy().tobytes() == out.tobytes()
    assert np.asarray(x.grad).tobytes() == dest.tobytes()


PTX_SCRIPT = textwrap.dedent("""
    import math
    import numpy as np
    from numba import cuda, float32, float64, types
    import numba.cuda.dispatcher as dispatcher
    from numbagrad.elementwise_fn import ElementwiseFunction

    class Target:     # no driver here: device functions ask it for the architecture
        compute_capability = (9, 0)
    dispatcher.get_current_device = lambda: Target

    def every_construct(x, b):
        z = x * b
        if z > 20.0 or not x < 30.0:
            return x
        z -= math.floor(x) + (x < b)
        return (math.log1p(math.exp(z)) / b + max(x, b) * abs(x) + math.erf(x) ** b
                + math.atan2(x, b) - (z if z > 0 else -z))

    op = ElementwiseFunction(every_construct)
    for nb, dt in ((float32, np.dtype(np.float32)), (float64, np.dtype(np.float64))):
        a = types.Array(nb, 3, "A")
        forward, backward, _, _ = op._compile("cuda", dt, 3)
        for kernel, sig in ((forward, (a,) * 3), (backward, (a,) * 3 + (a, nb, types.boolean) * 2)):
            ptx, _ = cuda.compile_ptx(kernel.kernel.py_func, sig, cc=(9, 0))
            assert ".entry" in ptx
    print("ok")
""")


def test_cuda_kernels_compile_to_ptx(tmp_path):
    # the simulator runs the kernels as Python: this types them as a GPU would
    script = tmp_path / "ptx.py"          # a file: the function's source is read
    script.write_text(PTX_SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # this checkout
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                         text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]


# ------------------------------------------------------------------ edge cases
def test_size0_dims_and_0d_tensors():
    x = ng.param(np.zeros((0, 3)))
    y = ng.param(np.ones(3))
    with ng.grad_tape():
        out = poly(x, y)
        out.sum().backward()
    assert out.shape == (0, 3)
    assert x.grad.shape == (0, 3) and np.array_equal(y.grad, np.zeros(3))
    a, b = ng.param(np.array(1.5)), ng.param(np.array(0.5))
    with ng.grad_tape():
        out = poly(a, b)
        out.backward()
    assert out.shape == () and a.grad.shape == ()
    assert out.item() == 2 * 1.5 ** 3 + 3 * 1.5 * 0.5 + 0.25 + 1
    assert a.grad == 6 * 1.5 ** 2 + 3 * 0.5 and b.grad == 3 * 1.5 + 2 * 0.5


def test_dtypes_promote_as_the_ops_do():
    x32 = ng.param(np.array([0.5, 1.5], np.float32))
    y64 = ng.param(np.array([1.0, 2.0]))
    with ng.grad_tape():
        out = poly(x32, y64)
        out.sum().backward()
    assert out.dtype == ng.result_type(x32, y64) == np.float64
    assert x32.grad.dtype == np.float32 and y64.grad.dtype == np.float64
    ints = ng.tensor(np.array([1, 2]))
    assert poly(ints, ints).dtype == ng.get_default_dtype()
    assert poly(x32, 2).dtype == np.float32          # a number never widens a tensor
    assert poly(np.array([1.0]), 2.0).dtype == np.float64


def test_numbers_get_no_gradient_and_params_accumulate():
    x = ng.param(np.array([0.5, 1.0, 3.0]))
    for _ in range(2):
        with ng.grad_tape():
            softplus_if(x).sum().backward()
    once = np.where(x.numpy() > 2, 1.0, 1 / (1 + np.exp(-x.numpy())))
    np.testing.assert_allclose(x.grad, 2 * once, rtol=1e-15)
    y = ng.param(np.array([2.0, 3.0]))
    with ng.grad_tape():
        poly(1.5, y).sum().backward()
    np.testing.assert_allclose(y.grad, 3 * 1.5 + 2 * y.numpy())
    x.grad = None
    with ng.grad_tape():         # one tensor passed twice: both partials reach it
        poly(x, x).sum().backward()
    v = x.numpy()
    np.testing.assert_allclose(x.grad, 6 * v ** 2 + 6 * v + 2 * v, rtol=1e-15)


def test_lambda_and_closure_constants():
    k = 0.25
    f = ng.elementwise(lambda x: k * x * x)
    g = ng.elementwise(
        lambda x: x * x * x)             # a lambda whose line does not parse alone
    x = ng.param(np.array([1.0, -2.0]))
    with ng.grad_tape():
        (f(x) + g(x)).sum().backward()
    np.testing.assert_allclose(x.grad, 2 * k * x.numpy() + 3 * x.numpy() ** 2)


# ---------------------------------------------------------------------- errors
def loop(x):
    for _ in range(3):
        x = x * 2
    return x


def unknown_call(x):
    return np.exp(x)


TABLE = [1.0]


def non_constant(x):
    return x * TABLE


def no_return(x):
    if x > 0:
        return x


@pytest.mark.parametrize("fn, message", [
    (loop, "a for loop is not supported (straight-line code with if/else only) (line"),
    (unknown_call, "a call to 'np.exp' is not supported"),
    (non_constant, "the name 'TABLE' is a list, not a number"),
    (no_return, "not every path ends in a return"),
])
def test_unsupported_constructs_are_named_at_decoration(fn, message):
    with pytest.raises(ElementwiseError, match=f"^ng.elementwise: {fn.__name__}: ") as info:
        ng.elementwise(fn)
    assert message in str(info.value)
    line = fn.__code__.co_firstlineno
    if fn is loop:
        assert f"(line {line + 1})" in str(info.value)


def test_unreadable_lambda_and_bad_calls():
    with pytest.raises(ElementwiseError, match="cannot be read"):
        ng.elementwise(eval("lambda x: x"))     # noqa: S307 (no source file)
    with pytest.raises(TypeError, match=r"poly: takes 2 arguments \(x, y\), got 1"):
        poly(ng.tensor([1.0]))
    with pytest.raises(ValueError, match=r"poly: shapes x \(2,\), y \(3,\) cannot be broadcast"):
        poly(ng.tensor([1.0, 2.0]), ng.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(TypeError, match="at least one argument must be a tensor"):
        poly(1.0, 2.0)


def test_cpu_kernels_are_cached_on_disk_by_their_source():
    import hashlib
    from numbagrad import kernels
    # two lambdas on one line: each is told apart by its code
    twice, thrice = ng.elementwise(lambda x: x * 2.0), ng.elementwise(lambda x: x * 3.0)
    files = []
    for f in (twice, thrice):
        forward = f.kernels(kernels.get("cpu"), np.dtype(np.float64), 2)[0]
        path = forward.py_func.__code__.co_filename
        with open(path, "rb") as source:
            digest = hashlib.sha256(source.read()).hexdigest()[:20]
        assert path.endswith(f"ngelem_{digest}.py")      # the name is the source's hash
        files.append(path)
    assert files[0] != files[1]
    assert twice(np.array([1.5])).item() == 3.0 and thrice(np.array([1.5])).item() == 4.5


# ------------------------------------------------------------------ ng.compile
def test_compiled_step_runs_njit_and_equals_eager(tmp_path):
    def make():
        rng = np.random.default_rng(0)
        w = ng.param(rng.normal(size=(3, 4)).astype(np.float32))
        b = ng.param(rng.normal(size=(4,)).astype(np.float32))
        opt = ng.optim.SGD([w, b], lr=0.1, accumulate_steps=2)

        def loss_fn(x):
            return softplus_if(three(x @ w, b * b + 0.5, 1.5)).mean()
        return [w, b], loss_fn, opt
    rng = np.random.default_rng(1)
    batches = [(ng.tensor(rng.uniform(0.5, 1.0, (5, 3)).astype(np.float32)),) for _ in range(5)]
    step = compiled_matches_eager(make, batches, tmp_path)
    assert [s["mode"] for s in step.stats] == ["njit"]
