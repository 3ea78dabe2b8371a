"""NumPy functions never leave the graph: the ones an op answers to run it
(recorded, the same values as NumPy, the gradients PyTorch gives), every other
one raises a TypeError naming the ng alternative, inside a tape or not."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import numbagrad as ng
from conftest import KernelNames, assert_grads_like_torch, inputs
from numbagrad import kernels
from numbagrad.ops import numpy_api
from numbagrad.ops.table import FUNCTIONS, OPS, UFUNCS

IDX = np.array([2, 0, 2])
ALONG = np.array([[2, 0], [1, 1]])
# (NumPy function, input shapes, the call (on tensors and on arrays alike), torch's)
LISTED = [
    ("concatenate", [(2, 3), (2, 2)], lambda a, b: np.concatenate([a, b], axis=1),
     lambda a, b: torch.cat([a, b], 1)),
    ("stack", [(2, 3), (2, 3)], lambda a, b: np.stack([a, b], axis=1),
     lambda a, b: torch.stack([a, b], 1)),
    ("split", [(2, 3)], lambda a: np.split(a, [1], axis=1)[1], lambda a: a[:, 1:]),
    ("take", [(2, 3)], lambda a: np.take(a, IDX, axis=1),
     lambda a: torch.index_select(a, 1, torch.tensor(IDX))),
    ("take_along_axis", [(2, 3)], lambda a: np.take_along_axis(a, ALONG, axis=1),
     lambda a: torch.gather(a, 1, torch.tensor(ALONG))),
    ("reshape", [(2, 3)], lambda a: np.reshape(a, (3, 2)), lambda a: a.reshape(3, 2)),
    ("transpose", [(2, 3, 2)], lambda a: np.transpose(a, (1, 0, 2)),
     lambda a: a.permute(1, 0, 2)),
    ("squeeze", [(2, 1, 3)], lambda a: np.squeeze(a, axis=1), lambda a: a.squeeze(1)),
    ("expand_dims", [(2, 3)], lambda a: np.expand_dims(a, (0, 2)),
     lambda a: a.unsqueeze(0).unsqueeze(2)),
    ("broadcast_to", [(3,)], lambda a: np.broadcast_to(a, (2, 3)),
     lambda a: torch.broadcast_to(a, (2, 3))),
    ("sum", [(2, 3)], lambda a: np.sum(a, axis=0, keepdims=True),
     lambda a: a.sum(0, keepdim=True)),
    ("mean", [(2, 3)], lambda a: np.mean(a, axis=1), lambda a: a.mean(1)),
    ("matmul", [(2, 3), (3, 2)], lambda a, b: np.matmul(a, b), torch.matmul),
    ("where", [(2, 3), (3,)], lambda a, b: np.where(a > 0, a, b),
     lambda a, b: torch.where(a > 0, a, b)),
    ("pad", [(2, 3)], lambda a: np.pad(a, ((1, 0), (0, 2))),
     lambda a: F.pad(a, (0, 2, 1, 0))),
    ("flip", [(2, 3)], lambda a: np.flip(a), lambda a: torch.flip(a, (0, 1))),
    ("tril", [(3, 3)], lambda a: np.tril(a, -1), lambda a: torch.tril(a, -1)),
    ("triu", [(3, 3)], lambda a: np.triu(a, k=1), lambda a: torch.triu(a, 1)),
    ("roll", [(2, 3)], lambda a: np.roll(a, 2, axis=1), lambda a: torch.roll(a, 2, 1)),
    ("repeat", [(2, 3)], lambda a: np.repeat(a, 2, axis=0),
     lambda a: torch.repeat_interleave(a, 2, 0)),
    ("tile", [(2, 3)], lambda a: np.tile(a, (2, 1)), lambda a: torch.tile(a, (2, 1))),
    ("diagonal", [(3, 4)], lambda a: np.diagonal(a, 1), lambda a: torch.diagonal(a, 1)),
    ("diag", [(3,)], lambda a: np.diag(a, -1), lambda a: torch.diag(a, -1)),
    ("einsum", [(2, 3), (3, 4)], lambda a, b: np.einsum("ij,jk->ki", a, b),
     lambda a, b: torch.einsum("ij,jk->ki", a, b)),
]
# NumPy functions that run an op whose result carries no gradient
NO_GRADIENT = [
    ("isclose", lambda a: np.isclose(a, a + 1e-9)),
    ("zeros_like", lambda a: np.zeros_like(a)), ("ones_like", lambda a: np.ones_like(a)),
    ("empty_like", lambda a: np.empty_like(a).shape),
    ("full_like", lambda a: np.full_like(a, 2.5, dtype=np.float32)),
]
# (NumPy function on tensors, a fragment of the hint its error gives)
OTHERS = [
    (lambda t: np.max(t), r"numpy.max .*ng.amax\(x, axis\)"),
    (lambda t: np.dot(t, t.T), "numpy.dot .*ng.matmul"),
    (lambda t: np.clip(t, 0, 1), "numpy.clip .*ng.clip"),
    (lambda t: np.cumsum(t), "numpy.cumsum .*ng.cumsum"),
    (lambda t: np.linalg.norm(t), r"numpy.linalg.norm .*ng.norm\(x, p, dim\)"),
    (lambda t: np.copy(t), "numpy.copy .*x \\* 1.0"),
    (lambda t: np.ravel(t), r"numpy.ravel .*ng.reshape\(x, -1\)"),
    (lambda t: np.allclose(t, t), r"numpy.allclose .*t.numpy\(\)"),
    (lambda t: np.std(t), "numpy.std .*ng.std"),
    (lambda t: np.argmax(t), "numpy.argmax .*ng.argmax.*no gradient"),
    (lambda t: np.sort(t), "numpy.sort .*no op for it.*no ng alternative"),
    (lambda t: np.unique(t), "numpy.unique .*no ng alternative"),
    (lambda t: np.hstack([t, t]), r"numpy.hstack .*ng.concatenate\(tensors, axis=1\)"),
    (lambda t: np.cumprod(t), r"numpy.cumprod .*ng.cumprod\(x, axis\)"),
    (lambda t: np.signbit(t), "numpy.signbit .*not differentiable"),    # a ufunc
    (lambda t: np.where(t > 0), r"numpy.where\(condition\) with one argument .*np.nonzero"),
]


@pytest.mark.parametrize("name, shapes, f, g", LISTED, ids=[c[0] for c in LISTED])
def test_listed_functions_run_the_op(dev, name, shapes, f, g):
    arrays = inputs(shapes, 1)
    want = f(*arrays)
    ps = [dev.param(a) for a in arrays]
    outside = f(*ps)       # outside a tape: the op runs, nothing is recorded
    assert isinstance(outside, ng.Tensor) and outside._node is None
    np.testing.assert_allclose(outside.numpy(), want, rtol=1e-12, atol=0)
    weights = np.random.default_rng(2).normal(size=want.shape)
    with ng.grad_tape():
        out = f(*ps)
        assert isinstance(out, ng.Tensor) and out._node is not None
        loss = (ng.reshape(out, (1, -1)) * dev.tensor(weights.reshape(1, -1))).sum()
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-12, atol=0)
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    (g(*ts) * torch.tensor(weights)).sum().backward()
    assert_grads_like_torch(f"numpy.{name}", ps, ts, ng.backward(loss), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("taped", [False, True], ids=["outside", "inside-tape"])
def test_other_functions_raise_naming_the_alternative(taped):
    x = ng.param(np.array([[1.0, -2.0], [0.5, 3.0]]))
    for fn, match in OTHERS:
        calls = KernelNames()
        with kernels.observe(calls):
            if taped:
                with ng.grad_tape():
                    with pytest.raises(TypeError, match="(?s)" + match):
                        fn(x)
            else:
                with pytest.raises(TypeError, match="(?s)" + match):
                    fn(x)
        # (the comparison inside np.where(t > 0) is the one kernel that runs)
        assert calls.names in ([], ["compare"]), (match, calls.names)
    assert x.grad is None and "numbagrad Tensor" in str(pytest.raises(TypeError, np.max, x).value)


def test_the_data_and_metadata_still_come_out():
    x = ng.tensor(np.arange(6.0).reshape(2, 3))
    assert np.shares_memory(np.asarray(x), x.data)
    np.testing.assert_array_equal(np.array(x), np.arange(6.0).reshape(2, 3))
    assert np.shape(x) == (2, 3) and np.ndim(x) == 2 and np.size(x) == 6


def test_numpy_arguments_the_op_lacks_are_clear_errors():
    x = ng.param(np.ones((2, 3)))
    cases = [(lambda: np.sum(x, out=np.empty(3)), "numpy.sum on a numbagrad Tensor of float64: "
              "out= is not supported"),
             (lambda: np.sum(x, 0, None, np.empty(3)), "numpy.sum .*out= is not supported"),
             (lambda: np.sum(x, initial=1.0), r"numpy.sum on a numbagrad Tensor takes sum\(a, "
              r"axis=None, dtype=None, out=None, keepdims=False\).*'initial'"),
             (lambda: np.mean(x, dtype=np.float32), "numpy.mean .*float64: dtype=float32"),
             (lambda: np.mean(x, where=np.ones((2, 3), bool)), "numpy.mean .*'where'")]
    for fn, match in cases:
        calls = KernelNames()
        with kernels.observe(calls), ng.grad_tape():
            with pytest.raises(TypeError, match=match):
                fn()
        assert calls.names == []
    assert x.grad is None


def test_the_tables_come_from_the_rows():
    names = {n: op.fn for op in OPS for n in op.numpy}
    assert all(isinstance(getattr(np, u), np.ufunc) for u in UFUNCS)
    assert set(FUNCTIONS) | set(UFUNCS) == set(names)
    assert all(FUNCTIONS[n] is names[n] for n in FUNCTIONS)
    assert not any(isinstance(getattr(np, n, None), np.ufunc) for n in FUNCTIONS)
    assert set(FUNCTIONS) <= set(numpy_api.ADAPTERS)   # every function row has an adapter
    assert {c[0] for c in LISTED} | {c[0] for c in NO_GRADIENT} == set(numpy_api.ADAPTERS)


@pytest.mark.parametrize("name, f", NO_GRADIENT, ids=[c[0] for c in NO_GRADIENT])
def test_functions_without_a_gradient_give_numpys_result(name, f):
    a = np.array([[1.0, -2.0], [0.5, 3.0]])
    got, want = f(ng.tensor(a)), f(a)
    if isinstance(want, tuple):
        assert got == want
        return
    assert isinstance(got, ng.Tensor) and got.dtype == want.dtype
    np.testing.assert_array_equal(got.numpy(), want)
