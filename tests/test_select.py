"""Comparisons, where and astype against PyTorch (float64, 1e-9: values and
every input's gradient), finite differences, both devices, ranks 0 to 5 with
size-0 and size-1 dims, ng.compile, launch counts and bad input."""
import numpy as np
import pytest
import torch

import numbagrad as ng
from conftest import assert_grads_like_torch, inputs
from numbagrad.tensor import _wrappers

TOL = dict(rtol=1e-9, atol=1e-12)
COMPARE = [("<", lambda a, b: a < b), ("<=", lambda a, b: a <= b), (">", lambda a, b: a > b),
           (">=", lambda a, b: a >= b), ("==", lambda a, b: a == b),
           ("!=", lambda a, b: a != b)]
# pairs of broadcast shapes, ranks 0 to 5, size-0 and size-1 dims
SHAPES = [((), ()), ((3,), ()), ((), (2, 3)), ((2, 3), (3,)), ((2, 1, 3), (4, 1)),
          ((1, 2, 1, 3), (2, 1, 1)), ((2, 1, 2, 1, 2), (1, 2, 1, 2, 1)), ((0, 3), (1, 3)),
          ((2, 0, 1), (1, 4)), ((1,), (1, 1, 1, 1, 1))]
FEW = [SHAPES[1], SHAPES[4], SHAPES[6], SHAPES[7]]    # for the slow CUDA simulator


def shapes_for(dev):
    return SHAPES if dev.name == "cpu" else FEW


def loss_of(out, weights):
    """A loss that gives each output element its own upstream gradient."""
    return (ng.reshape(out, (1, -1)) * weights.reshape(1, -1)).sum()


def grid(*shapes, seed=0):
    """Rounded inputs, so that == and != see equal elements too."""
    return [np.round(a * 2) / 2 for a in inputs(shapes, seed)]


# ---------------------------------------------------------------- comparisons
@pytest.mark.parametrize("name, f", COMPARE, ids=[c[0] for c in COMPARE])
def test_comparisons_match_torch(dev, name, f):
    for sa, sb in shapes_for(dev):
        a, b = grid(sa, sb)
        want = f(torch.tensor(a), torch.tensor(b)).numpy()
        x, y = dev.param(a), dev.param(b)
        with ng.grad_tape():
            got = [f(x, y), f(x, 0.5), f(0.5, x)]
        for out, ref in zip(got, [want, f(torch.tensor(a), 0.5).numpy(),
                                  f(0.5, torch.tensor(a)).numpy()]):
            assert out.dtype == np.bool_ and out.device == dev.name
            assert not out.requires_grad and out._node is None
            np.testing.assert_array_equal(out.numpy(), ref, err_msg=f"{name} {sa} {sb}")


def test_comparisons_with_arrays_nan_and_the_functions():
    a = np.array([[np.nan, 1.0, -2.0], [0.5, np.inf, 0.0]])
    b = np.array([1.0, np.nan, 0.0])
    x = ng.tensor(a)
    for fn, op in [(ng.lt, np.less), (ng.le, np.less_equal), (ng.gt, np.greater),
                   (ng.ge, np.greater_equal), (ng.eq, np.equal), (ng.ne, np.not_equal)]:
        for got in (fn(x, b), op(x, b), fn(a, ng.tensor(b))):
            np.testing.assert_array_equal(got.numpy(), op(a, b))
        np.testing.assert_array_equal(op(a, ng.tensor(b)).numpy(), op(a, b))   # ndarray first
    assert isinstance(a < ng.tensor(b), ng.Tensor) and isinstance(b == x, ng.Tensor)
    f32 = ng.tensor(np.array([0.1], np.float32))
    assert (f32 == 0.1).numpy().all()     # a scalar compares in the tensor's dtype (as torch)


def test_bool_tensors_truth_and_identity():
    x = ng.tensor(np.array([1.0, -1.0]))
    assert bool(ng.tensor(2.0) > 1.0) and not bool(ng.tensor([0.0]) > 1.0)
    with pytest.raises(ValueError, match="ambiguous"):
        bool(x > 0)
    assert len({x, x}) == 1 and x in {x: 1} and x in [x]    # hash and `in` by identity
    p = ng.param(np.zeros(()))    # wrappers of a .grad are kept by identity, not ==
    with ng.grad_tape():
        loss = p * 1.0
    loss.backward()
    w = ng.as_tensor(p.grad)
    assert w in _wrappers and ng.as_tensor(np.zeros(())) not in _wrappers


# ---------------------------------------------------------------------- where
def _where_case(dev, sc, sa, sb, scalar=None, seed=0):
    c, a, b = inputs([sc, sa, sb], seed)
    cond = c > 0
    ta = torch.tensor(a, requires_grad=True)
    tb = torch.tensor(b, requires_grad=True)
    ps = [dev.param(a), dev.param(b)]
    args_ng = [dev.tensor(c) > 0, ps[0], ps[1]]
    args_t = [torch.tensor(cond), ta, tb]
    if scalar is not None:        # that value is a Python float
        args_ng[scalar], args_t[scalar] = 1.5, 1.5
    want = torch.where(*args_t)
    weights = np.random.default_rng(seed + 1).normal(size=tuple(want.shape))
    with ng.grad_tape():
        out = ng.where(*args_ng)
        loss = loss_of(out, dev.tensor(weights))
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), **TOL)
    grads = ng.backward(loss)
    (want * torch.tensor(weights)).sum().backward()
    keep = [i for i in (0, 1) if scalar != i + 1]
    assert_grads_like_torch(f"where {sc} {sa} {sb}", [ps[i] for i in keep],
                            [[ta, tb][i] for i in keep], grads, **TOL)


@pytest.mark.parametrize("scalar", [None, 1, 2], ids=["tensors", "scalar-a", "scalar-b"])
def test_where_matches_torch(dev, scalar):
    for k, (sa, sb) in enumerate(shapes_for(dev)):
        sc = [(), (1,), (2, 1, 1)][k % 3] if k % 2 else sa
        _where_case(dev, sc, sa, sb, scalar, seed=k)


def test_where_scalars_and_one_input_twice(dev):
    c = dev.tensor(np.array([[1.0, -1.0, 2.0]])) > 0
    out = ng.where(c, 1.0, -1.0)
    assert out.dtype == np.float64 and out.device == dev.name
    np.testing.assert_array_equal(out.numpy(), [[1.0, -1.0, 1.0]])
    x = dev.param(np.array([[0.5, 2.0, -3.0]]))
    with ng.grad_tape():
        loss = loss_of(ng.where(c, x, x), dev.tensor(np.array([1.0, 2.0, 3.0])))
    np.testing.assert_array_equal(dev.host(ng.backward(loss)[x.id]), [[1.0, 2.0, 3.0]])


def test_where_takes_a_host_mask_and_gradchecks(dev):
    rng = np.random.default_rng(1)
    a, b = dev.param(rng.normal(size=(2, 3, 2))), dev.param(rng.normal(size=(3, 1)))
    weights = dev.tensor(rng.normal(size=(2, 3, 2)))
    mask = rng.normal(size=(3, 2)) > 0
    cond = mask if dev.name == "cpu" else dev.tensor(mask.astype(float)) > 0.5

    def loss():
        return loss_of(ng.where(cond, a, b), weights)
    ng.gradcheck(loss, [a, b], directions=None if dev.name == "cpu" else 2)


# --------------------------------------------------------------------- astype
def test_astype_casts_both_ways_with_gradients(dev):
    for shape in [(), (0, 2), (2, 1, 3), (1, 2, 1, 2, 2)][: None if dev.name == "cpu" else 3]:
        a = inputs([shape], 3)[0]
        x = dev.param(a)
        ta = torch.tensor(a, requires_grad=True)
        weights = np.random.default_rng(4).normal(size=shape).astype(np.float32)
        with ng.grad_tape():
            y = x.astype(np.float32)
            loss = loss_of(y, dev.tensor(weights))
        assert y.dtype == np.float32
        ty = ta.to(torch.float32)
        np.testing.assert_array_equal(y.numpy(), ty.detach().numpy())
        grads = ng.backward(loss)
        (ty * torch.tensor(weights)).sum().backward()
        assert_grads_like_torch(f"astype {shape}", [x], [ta], grads, **TOL)
        back = ng.astype(y, "float64")
        assert back.dtype == np.float64 and x.astype(np.float64) is x


def test_a_comparison_becomes_a_float_mask(dev):
    a = np.array([[1.0, -2.0], [0.0, 3.0]])
    mask = (dev.tensor(a) > 0).astype(np.float32)
    assert mask.dtype == np.float32 and not mask.requires_grad
    np.testing.assert_array_equal(mask.numpy(), (a > 0).astype(np.float32))
    x = dev.param(a)
    with ng.grad_tape():
        loss = (x * (x > 0).astype(np.float64)).sum()
    np.testing.assert_array_equal(dev.host(ng.backward(loss)[x.id]), a > 0)


def test_gradcheck_through_astype_and_where(dev):
    rng = np.random.default_rng(2)
    x = dev.param(rng.normal(size=(3, 4)), dtype=np.float32)   # float32 gradcheck tolerances

    def loss():
        y = x.astype(np.float64)
        return ng.sum(ng.where(y > 0, y * y, -y)).astype(np.float32)
    ng.gradcheck(loss, [x], directions=None if dev.name == "cpu" else 2)


# --------------------------------------------------------- launches, compile
def test_cuda_launches_one_per_forward_and_one_per_gradient():
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    x = ng.param(np.ones((2, 3)), device="cuda")
    y = ng.param(np.ones((3,)), device="cuda")
    with ng.grad_tape():
        for fn, n in [(lambda: x > y, 1), (lambda: x > 0.0, 1), (lambda: x.astype("f4"), 1)]:
            start = ng.cuda.launch_count()
            fn()
            assert ng.cuda.launch_count() - start == n
        a, b = ng.param(np.ones((1, 1, 1)), device="cuda"), ng.param(2.0, device="cuda")
        c = ng.tensor(np.ones(1), device="cuda") > 0.0
        start = ng.cuda.launch_count()
        out = ng.where(c, a, b)     # one element: a loss
        assert ng.cuda.launch_count() - start == 1
    out.backward()        # (makes the params' accumulators)
    with ng.grad_tape():
        out = ng.where(c, a, b)
    start = ng.cuda.launch_count()
    out.backward()        # the seed (a fill) and one launch per gradient
    assert ng.cuda.launch_count() - start == 1 + 2


def test_compile_is_bit_identical_to_eager(tmp_path):
    from numbagrad.compile import compile as ng_compile
    rng = np.random.default_rng(0)

    def make():
        W = ng.param(rng.normal(size=(2, 3)).astype(np.float32))
        b = ng.param(np.full((2, 1), 0.1, np.float32))

        def loss_fn(x, y):
            h = W @ x
            mask = (h > 0).astype(np.float32)
            z = ng.where(h > b, h, 0.1 * h) + mask * b
            return ng.mse_loss(z.astype(np.float64), y)
        return [W, b], loss_fn
    batches = [(ng.tensor(rng.normal(size=(3, 4)).astype(np.float32)), rng.normal(size=(2, 4)))
               for _ in range(3)]
    rng = np.random.default_rng(0)
    pa, fa = make()
    rng = np.random.default_rng(0)
    pb, fb = make()
    step = ng_compile(fb, cache_dir=str(tmp_path))
    for i in range(6):
        x, y = batches[i % 3]
        with ng.grad_tape():
            la = fa(x, y)
        la.backward()
        lb = step(x, y)
        assert np.array_equal(la.numpy(), lb.numpy())
        for p, q in zip(pa, pb):
            assert np.array_equal(p.grad, q.grad) and p.grad.dtype == q.grad.dtype
    assert [s["mode"] for s in step.stats] == ["njit"]


# ------------------------------------------------------------------ bad input
def test_bool_tensors_in_arithmetic_follow_torch(dev):
    """A mask promotes in arithmetic and ``where`` (PyTorch's rules); the ops
    PyTorch refuses a bool tensor (matmul, relu, ``-``) refuse it by name,
    the float-only ones naming astype."""
    x = dev.param(np.array([[1.0, -1.0]]))
    m = x > 0
    for fn in [lambda: ng.exp(m), lambda: m @ x.T, lambda: ng.relu(m),
               lambda: ng.mse_loss(m, m)]:
        with ng.grad_tape():
            with pytest.raises(TypeError, match=r"boolean tensor \(shape \(1, 2\), bool, on "
                                                rf"{dev.name}\).*astype"):
                fn()
    for fn, match in [(lambda: x - m, "sub: subtracting a bool tensor"),
                      (lambda: -m, "neg: not defined for a bool tensor")]:
        with pytest.raises(TypeError, match=match):
            fn()
    assert x.grad is None
    with ng.grad_tape():
        y = ng.sum(m * x + 2.0 * m + ng.where(m, m, x))   # 1 + 2 + (1 - 1)
    ng.backward(y)
    assert y.dtype == np.float64 and float(y) == 3.0
    np.testing.assert_array_equal(dev.host(x.grad), [[1.0, 1.0]])
    assert m.sum().dtype == np.int64 and int(m.sum()) == 1
    assert m.reshape(2, 1).dtype == np.bool_ and (m < 1.0).dtype == np.bool_


def test_bad_input_is_a_clear_error_and_changes_nothing(dev):
    x = dev.param(np.ones((2, 3)))
    y = dev.param(np.ones((4,)))
    f32 = dev.tensor(np.ones(3), dtype=np.float32)
    cond = x > 0
    start = ng.cuda.launch_count() if dev.name == "cuda" else 0
    cases = [
        (lambda: x < y, ValueError, r"lt: shapes \(2, 3\) and \(4,\) cannot be broadcast"),
        (lambda: ng.where(cond, x, y), ValueError, r"where: shapes .* cannot be broadcast"),
        (lambda: ng.where(x, x, x), TypeError,
         r"where: the condition must be boolean, got a tensor of shape \(2, 3\), float64"),
        (lambda: ng.where(1.0, x, x), TypeError, "where: the condition must be a boolean"),
        (lambda: x.astype("nope"), TypeError, "astype: 'nope' is not a dtype"),
        (lambda: x.astype(None), TypeError, "astype: None is not a dtype"),
        (lambda: cond.astype(np.complex64), TypeError, "astype: tensors hold .* not complex64"),
    ]
    if dev.name == "cuda":
        cases += [(lambda: x < np.ones(3), ValueError, "host but the op runs on cuda"),
                  (lambda: ng.where(np.ones((2, 3), bool), x, x), ValueError,
                   "where: the condition is a host array"),
                  (lambda: ng.where(ng.tensor(np.ones(3)) > 0, x, x), ValueError,
                   "where: the condition is on cpu .* the values are on cuda")]
    for fn, exc, match in cases:
        with ng.grad_tape():
            with pytest.raises(exc, match=match):
                fn()
    assert x.grad is None and y.grad is None
    if dev.name == "cuda":
        assert ng.cuda.launch_count() == start


def test_every_masks_function_has_a_row_and_the_operators_run_it():
    import inspect

    from numbagrad.ops import masks
    from numbagrad.ops.table import OPS
    rowed = {op.fn for op in OPS}
    public = [f for n, f in vars(masks).items() if inspect.isfunction(f)
              and f.__module__ == masks.__name__ and not n.startswith("_")]
    assert len(public) == 8 and all(f in rowed for f in public)
    for dunder, fn in [("__lt__", ng.lt), ("__le__", ng.le), ("__gt__", ng.gt),
                       ("__ge__", ng.ge), ("__eq__", ng.eq), ("__ne__", ng.ne)]:
        assert getattr(ng.Tensor, dunder).__doc__ == fn.__doc__
    assert ng.Tensor.astype.__doc__ == ng.astype.__doc__


def test_strided_inputs_are_read_as_their_values(dev):
    a, b = inputs([(3, 2), (2, 3)], 6)
    x, y = dev.param(a), dev.param(b)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    weights = np.random.default_rng(7).normal(size=(2, 3))
    with ng.grad_tape():
        out = ng.where(x.T > y, x.T.astype(np.float32).astype(np.float64), y)
        loss = loss_of(out, dev.tensor(weights))
    want = torch.where(ta.T > tb, ta.T.float().double(), tb)
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), **TOL)
    (want * torch.tensor(weights)).sum().backward()
    assert_grads_like_torch("strided", [x, y], [ta, tb], ng.backward(loss), **TOL)


def test_a_rank_above_six_compares_too():
    a = inputs([(1, 2, 1, 2, 1, 2, 2)], 8)[0]
    np.testing.assert_array_equal((ng.tensor(a) > np.zeros((2, 1))).numpy(), a > 0)
