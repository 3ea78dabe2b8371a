"""The eager fast paths of matmul and mse_loss (two C-contiguous float operands)
refuse what the checked paths refuse, kernels.typed is call_typed in two steps,
and their hot tables (kernels.hot_table) serve them only when nothing observes."""
import importlib

import numpy as np
import pytest

import numbagrad as ng
from numbagrad import kernels
from numbagrad.kernels import _typed_calls

from conftest import KernelNames


def test_boolean_operands_take_the_checked_path_and_its_error():
    x = ng.tensor(np.array([[1.0, -1.0], [2.0, 0.5]]))
    mask = x > 0.0                      # a C-contiguous boolean tensor
    with pytest.raises(TypeError, match="boolean tensor"):
        ng.matmul(mask, mask)
    with pytest.raises(TypeError, match="boolean tensor"):
        ng.mse_loss(mask, mask)


def test_typed_matches_call_typed(typed_unchecked):
    cpu = kernels.get("cpu")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    outs = [np.empty((3, 2)) for _ in range(3)]
    kernels.call_typed(cpu, "gemm", 0, "test-two-steps", a, b, outs[0], 0, 0, 1.0, 0.0)
    fn = kernels.typed(cpu, "gemm", 0, "test-two-steps")
    assert fn is _typed_calls._typed[(cpu, "gemm", "test-two-steps")]   # the specialisation
    fn(a, b, outs[1], 0, 0, 1.0, 0.0)
    kernels.typed(cpu, "gemm", cpu.MT_MIN, "test-two-steps")(a, b, outs[2], 0, 0, 1.0, 0.0)
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])
    np.testing.assert_allclose(outs[0], a @ b, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_hot_tables_fill_serve_the_tiny_step_and_empty_under_an_observer(typed_unchecked, dtype):
    # the modules, not the ops ng.ops.matmul and ng.ops.mse_loss
    hot_gemm = importlib.import_module("numbagrad.ops.matmul")._HOT_GEMM
    hot_mse = importlib.import_module("numbagrad.ops.losses")._HOT_MSE
    cpu, dt = kernels.get("cpu"), np.dtype(dtype)
    rng = np.random.default_rng(5)
    w0, x0, y0 = (rng.standard_normal(s).astype(dtype) for s in ((2, 3), (3, 1), (2, 1)))
    w, x, y = ng.param(w0), ng.tensor(x0), ng.tensor(y0)
    losses = []
    for _ in range(3):   # the first call fills the tables, the others read them
        with ng.grad_tape():
            loss = ng.mse_loss(w @ x, y)
        loss.backward()
        losses.append(loss.item())
    assert hot_gemm[dt] is _typed_calls._typed[(cpu, "gemm", dt)]
    assert hot_mse[(dt, 2)] is _typed_calls._typed[(cpu, "mse", (dt, 2))]
    resid = w0.astype(np.float64) @ x0 - y0
    tol = 1e-5 if dtype is np.float32 else 1e-12
    np.testing.assert_allclose(losses, [np.mean(resid ** 2)] * 3, rtol=tol)
    np.testing.assert_allclose(w.grad, 3 * (resid @ x0.T), rtol=tol)   # 2/2 * r x^T, 3 times
    seen = KernelNames()
    with kernels.observe(seen):   # emptied: the observer is told of every call
        assert not hot_gemm and not hot_mse
        with ng.grad_tape():
            loss = ng.mse_loss(w @ x, y)
        loss.backward()
        assert not hot_gemm and not hot_mse
    assert sorted(seen.names) == ["gemm", "gemm", "mse"]
    np.testing.assert_allclose(w.grad, 4 * (resid @ x0.T), rtol=tol)
    # a CUDA operand never takes the CPU's table (Numba's simulator in the suite)
    wc, xc = ng.tensor(w0, device="cuda"), ng.tensor(x0, device="cuda")
    with ng.grad_tape():
        loss = ng.mse_loss(ng.matmul(w, x), y)   # refill the tables
    loss.backward()
    assert hot_gemm
    np.testing.assert_allclose((wc @ xc).numpy(), w0.astype(np.float64) @ x0, rtol=tol)


def test_the_op_output_builder_makes_what_the_constructor_makes():
    from numbagrad.tape import output
    from numbagrad.tensor import Tensor
    cpu, data = kernels.get("cpu"), np.ones((2, 2))
    for recorded in (False, True):
        built = output(data, cpu, data, *((print, (data,), (data, 0)) if recorded else ()))
        node = built._node
        made = Tensor(data, cpu, recorded, node, data)
        assert type(built) is Tensor and made.id > built.id   # ids from one counter
        for name in Tensor.__slots__:
            if name in ("_stamp", "_base"):   # set only on the tensors that have one
                assert not hasattr(built, name) and not hasattr(made, name), name
            elif name not in ("id", "__weakref__"):
                assert getattr(built, name) is getattr(made, name), name
    assert (node.backward, node.inputs, node.saved, node.done) == (print, (data,), (data, 0), False)
    from numbagrad.tensor import _writes
    assert node.stamp == _writes[0]


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int16, np.uint8])
def test_linear_of_integer_tensors_takes_the_checked_path(dtype):
    """Integer operands of linear become the default float, as matmul's do,
    at sizes where the fast path would hand them to the float BLAS (which
    read them as floats: zeros, garbage or a heap overrun)."""
    rng = np.random.default_rng(0)
    for n in (4, 64):
        a, w = rng.integers(0, 5, (n, n)), rng.integers(0, 5, (n, n))
        x, weight = ng.tensor(a.astype(dtype)), ng.tensor(w.astype(dtype))
        out = ng.linear(x, weight)
        assert out.dtype == ng.matmul(x, weight.T).dtype
        assert np.array_equal(out.numpy(), (a @ w.T).astype(np.float64))
        bias = ng.tensor(np.arange(n).astype(dtype))
        assert np.array_equal(ng.linear(x, weight, bias).numpy(), a @ w.T + np.arange(n))


def test_linear_of_boolean_tensors_is_refused():
    mask = ng.tensor(np.ones((64, 64), bool))
    with pytest.raises(TypeError, match="linear: a boolean tensor"):
        ng.linear(mask, mask)


@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_with_a_weight_of_no_rows(with_bias):
    """An empty output, as PyTorch's; the input's gradient is zeros."""
    import torch
    x0 = np.random.default_rng(1).standard_normal((2, 3))
    x, W = ng.param(x0), ng.param(np.ones((0, 3)))
    b = ng.param(np.ones(0)) if with_bias else None
    with ng.grad_tape():
        out = ng.linear(x, W, b)
        loss = ng.sum(out)
    loss.backward()
    tx = torch.tensor(x0, requires_grad=True)
    tout = torch.nn.functional.linear(tx, torch.ones((0, 3), dtype=torch.float64),
                                      torch.ones(0, dtype=torch.float64) if with_bias else None)
    tout.sum().backward()
    assert out.shape == tuple(tout.shape) == (2, 0)
    assert np.array_equal(x.grad, tx.grad.numpy()) and W.grad.shape == (0, 3)


def test_numpy_subclasses_are_wrapped_as_plain_arrays():
    """An np.matrix would keep every reshape 2-D; a masked array would lose its mask."""
    m = np.matrix(np.arange(6.0).reshape(2, 3))
    t = ng.as_tensor(m)
    assert type(t.data) is np.ndarray and np.shares_memory(t.data, m)
    assert ng.reshape(t, (6,)).shape == (6,)
    np.testing.assert_array_equal(ng.matmul(ng.tensor(np.ones((1, 2))), m).numpy(),
                                  [[3.0, 5.0, 7.0]])
    masked = np.ma.array(np.ones(3), mask=[0, 1, 0])
    with pytest.raises(TypeError, match="as_tensor: a masked array"):
        ng.as_tensor(masked)
    with pytest.raises(TypeError, match="masked array"):
        ng.add(ng.tensor(np.ones(3)), masked)
