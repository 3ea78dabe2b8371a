"""ng.grad, ng.value_and_grad, ng.vjp: JAX's functional gradients, against
torch.func and finite differences, on both devices."""
import numpy as np
import pytest
import torch
import torch.func

import numbagrad as ng
from numbagrad.testing import numeric_grad

from conftest import Dev


def f_ng(w, x, b):
    return (ng.tanh(ng.matmul(x, w) + b) ** 2).sum() * 0.5 + (w * w).mean()


def f_torch(w, x, b):
    return (torch.tanh(x @ w + b) ** 2).sum() * 0.5 + (w * w).mean()


def data(dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in ((3, 2), (4, 3), (2,))]


@pytest.mark.parametrize("argnums", [0, 1, (0, 2), (2, 0, 1)])
def test_grad_matches_torch_func_grad(dev, argnums):
    arrays = data()
    tensors = [dev.tensor(a) for a in arrays]
    got = ng.grad(f_ng, argnums=argnums)(*tensors)
    want = torch.func.grad(f_torch, argnums=argnums)(*[torch.tensor(a) for a in arrays])
    if isinstance(argnums, int):
        got, want = (got,), (want,)
    assert len(got) == len(want)
    for g, w, i in zip(got, want, (argnums,) if isinstance(argnums, int) else argnums):
        assert isinstance(g, ng.Tensor) and g.device == dev.name
        assert g.shape == arrays[i].shape and g.dtype == arrays[i].dtype
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-10, atol=1e-12)


def test_grad_matches_finite_differences_float32():
    arrays = data(np.float32, seed=1)
    got = ng.grad(f_ng, argnums=(0, 1, 2))(*arrays)
    for i, g in enumerate(got):
        assert isinstance(g, np.ndarray) and g.dtype == np.float32   # NumPy in, NumPy out
        p = ng.param(arrays[i])
        args = [p if j == i else a for j, a in enumerate(arrays)]
        want = numeric_grad(lambda: f_ng(*args), p, 1e-2)
        np.testing.assert_allclose(g, want, rtol=2e-3, atol=1e-3)


def test_value_and_grad_with_aux_matches_torch(dev):
    arrays = data(seed=2)

    def f(w, x, b):
        loss = f_ng(w, x, b)
        return loss, {"twice": loss * 2, "n": 3}

    (value, aux), grads = ng.value_and_grad(f, argnums=(0, 1), has_aux=True)(
        *[dev.tensor(a) for a in arrays])
    want_grads, want_value = torch.func.grad_and_value(f_torch, argnums=(0, 1))(
        *[torch.tensor(a) for a in arrays])
    assert value.shape == () and value._node is None and not value.requires_grad
    np.testing.assert_allclose(value.item(), want_value.item(), rtol=1e-12)
    assert aux["n"] == 3 and aux["twice"]._node is None
    np.testing.assert_allclose(aux["twice"].item(), 2 * want_value.item(), rtol=1e-12)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-10, atol=1e-12)
    grads2, aux2 = ng.grad(f, argnums=(0, 1), has_aux=True)(*[dev.tensor(a) for a in arrays])
    assert aux2["n"] == 3
    for g, w in zip(grads2, grads):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_params_grads_are_untouched_inside_and_outside_a_tape():
    w, x, b = data(seed=3)
    W, C = ng.param(w), ng.param(b)       # W passed as the argument, C closed over
    C.grad = np.full(b.shape, 7.0)

    def f(w_):
        return f_ng(w_, x, C)

    g = ng.grad(f)(W)
    want = torch.func.grad(lambda t: f_torch(t, torch.tensor(x), torch.tensor(b)))(
        torch.tensor(w))
    np.testing.assert_allclose(g.numpy(), want.numpy(), rtol=1e-10)
    assert W.grad is None and np.array_equal(C.grad, np.full(b.shape, 7.0))
    # inside a tape: the outer recording goes on and backpropagates as before
    C.grad = None
    with ng.grad_tape():
        outer = (C * C).sum()
        g2 = ng.grad(f)(W)
        outer = outer + (C * 3.0).sum()
    assert g2._node is None
    np.testing.assert_array_equal(g2.numpy(), g.numpy())
    outer.backward()
    np.testing.assert_allclose(C.grad, 2 * b + 3.0, rtol=1e-12)
    assert W.grad is None


def test_grad_through_a_closed_over_recorded_tensor_keeps_the_outer_graph():
    w, x, b = data(seed=4)
    V = ng.param(b)
    with ng.grad_tape():
        s = V * 2.0                      # recorded on the outer tape, read by f below
        g = ng.grad(lambda w_: f_ng(w_, x, s))(w)
        loss = (s * s).sum()
    loss.backward()                      # the outer graph was neither run nor freed
    np.testing.assert_allclose(V.grad, 8 * b, rtol=1e-12)
    want = torch.func.grad(lambda t: f_torch(t, torch.tensor(x), torch.tensor(2 * b)))(
        torch.tensor(w))
    np.testing.assert_allclose(g, want.numpy(), rtol=1e-10)


def test_vjp_matches_torch_func_vjp_with_two_outputs(dev):
    rng = np.random.default_rng(5)
    a, c = rng.standard_normal((2, 3)), rng.standard_normal((3,))
    ct = (rng.standard_normal((2, 3)), rng.standard_normal(()))

    def f(x, y):
        return ng.sigmoid(x) * y, (x * x).sum() + y.sum()

    out, vjp_fn = ng.vjp(f, dev.tensor(a), dev.tensor(c))
    tout, tvjp = torch.func.vjp(lambda x, y: (torch.sigmoid(x) * y, (x * x).sum() + y.sum()),
                                torch.tensor(a), torch.tensor(c))
    for o, t in zip(out, tout):
        assert o._node is None
        np.testing.assert_allclose(o.numpy(), t.numpy(), rtol=1e-12)
    got = vjp_fn((dev.tensor(ct[0]), ct[1]))
    want = tvjp(tuple(torch.tensor(v) for v in ct))
    assert isinstance(got, tuple) and len(got) == 2
    for g, w in zip(got, want):
        assert g.device == dev.name
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-10, atol=1e-12)


def test_vjp_fn_called_again_replays_dropout():
    x = np.random.default_rng(6).standard_normal((4, 5))

    def f(t):
        return ng.dropout(t * 3.0, 0.5)

    out, vjp_fn = ng.vjp(f, x)
    ct = np.ones_like(x)
    first, = vjp_fn(ct)
    ng.dropout(ng.tensor(x), 0.5)        # the generator moves on meanwhile
    second, = vjp_fn(ct)
    np.testing.assert_array_equal(first, second)
    kept = out.numpy() != 0
    np.testing.assert_array_equal(first, np.where(kept, 6.0, 0.0))   # 3 / (1 - p) where kept


def test_unused_argument_gets_zeros_and_numpy_floats_work():
    g = ng.grad(lambda x, y: (x * 2.0).sum(), argnums=(0, 1))(np.ones(3), 2.5)
    np.testing.assert_array_equal(g[0], np.full(3, 2.0))
    assert isinstance(g[1], np.ndarray) and g[1].shape == () and g[1] == 0.0


def test_errors():
    x = np.ones(3)
    with pytest.raises(TypeError, match="scalar-output"):
        ng.grad(lambda t: t * 2.0)(x)
    with pytest.raises(TypeError, match="float32 or float64"):
        ng.grad(lambda t: t.sum())(np.ones(3, np.int64))
    with pytest.raises(TypeError, match="argnums"):
        ng.grad(lambda t: t.sum(), argnums=1.0)
    with pytest.raises(ValueError, match="out of range"):
        ng.grad(lambda t: t.sum(), argnums=1)(x)
    with pytest.raises(TypeError, match="pair"):
        ng.value_and_grad(lambda t: t.sum(), has_aux=True)(x)
    with pytest.raises(TypeError, match="must be a float Tensor"):
        ng.grad(lambda t: t.sum())([1.0, 2.0])
    with pytest.raises(NotImplementedError, match="higher-order"):
        ng.grad(lambda t: ng.grad(lambda u: (u ** 3).sum())(t).sum())(x)
    with pytest.raises(NotImplementedError, match="higher-order"):     # inner closes over t
        ng.grad(lambda t: ng.grad(lambda u: (u * t).sum())(np.ones(3)).sum())(x)
    _, vjp_fn = ng.vjp(lambda t: t * 2.0, x)
    with pytest.raises(ValueError, match="shape"):
        vjp_fn(np.ones(4))
    # an inner transform of something the outer one does not differentiate is fine
    g = ng.grad(lambda t: (t * float(ng.grad(lambda u: (u * u).sum())(3.0))).sum())(x)
    np.testing.assert_array_equal(g, np.full(3, 6.0))


def test_cuda_param_argument_keeps_its_grad():
    dev = Dev("cuda")
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    w = dev.param(np.ones((2, 2)))
    g = ng.grad(lambda w_: (w_ * w_).sum())(w)
    assert g.device == "cuda" and w.grad is None
    np.testing.assert_array_equal(g.numpy(), np.full((2, 2), 2.0))


def test_zero_d_arrays_and_numpy_scalars_keep_their_shape_and_argnums_are_unique():
    """A 0-d array or a np.float32 became shape (1,) (np.ascontiguousarray),
    so grad refused the scalar output; repeated argnums gave one of them a
    zero gradient, where torch.func refuses them."""
    cube = ng.grad(lambda x: x * x * x)
    for x in (np.array(3.0), np.float32(3.0), np.float64(3.0), 3.0):
        g = cube(x)
        assert np.shape(g) == () and float(g) == 27.0
    out, pullback = ng.vjp(lambda x: x * 2.0, np.array(3.0))
    assert out.shape == () and float(pullback(np.array(1.0))[0]) == 2.0
    with pytest.raises(ValueError, match="names an argument twice"):
        ng.grad(lambda a, b: ng.sum(a * a * b), argnums=(0, 0))(np.ones(2), np.ones(2))
