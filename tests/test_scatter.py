"""scatter, scatter_add, scatter_reduce, masked_select, unfold and several
index arrays in one key (issue 30) against PyTorch and NumPy in float64
(values and both inputs' gradients, repeated indices, ties, zeros), finite
differences, both devices (CUDA: tiny shapes), ng.compile, and errors."""
import numpy as np
import pytest
import torch

import numbagrad as ng
from conftest import Dev, compiled_matches_eager, matches_torch
from numbagrad.ops._common import IndexDtypeError

IDX = np.array([[1, 1, 0], [2, 0, 2]])        # repeats along dim 1 of a (2, 4) input
X = np.array([[1.0, 5.0, 2.0, 0.5], [3.0, 0.0, 2.0, -1.0]])
SRC = np.array([[5.0, 5.0, 1.0], [2.0, 3.0, 0.0]])
T_IDX = torch.tensor(IDX)


def _reduce_cases():
    out = []
    for red in ("sum", "prod", "mean", "amax", "amin"):
        for inc in (True, False):
            out.append((f"scatter_reduce_{red}_{inc}",
                        lambda x, s, r=red, i=inc: ng.scatter_reduce(x, 1, IDX, s, r,
                                                                     include_self=i),
                        lambda x, s, r=red, i=inc: x.scatter_reduce(1, T_IDX, s, r,
                                                                    include_self=i)))
    return out


CASES = [("scatter_add", lambda x, s: ng.scatter_add(x, 1, IDX, s),
          lambda x, s: x.scatter_add(1, T_IDX, s)),
         ("scatter", lambda x, s: x.scatter(1, IDX[:, :1] + np.array([[0], [1]]), s[:, :1]),
          lambda x, s: x.scatter(1, T_IDX[:, :1] + torch.tensor([[0], [1]]), s[:, :1])),
         ("scatter_repeats_grad", lambda x, s: ng.scatter(x, 1, IDX, s) * 0.0 + x,
          lambda x, s: x.scatter(1, T_IDX, s) * 0.0 + x)] + _reduce_cases()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_torch(case):
    name, f, g = case
    matches_torch(f, g, [X, SRC], name=name)


def test_dim0_and_3d():
    x, s = np.random.default_rng(1).normal(size=(2, 3, 2)), np.random.default_rng(2).normal(
        size=(3, 2, 2))
    idx = np.array([[[0, 1], [1, 1]], [[1, 0], [0, 0]], [[1, 1], [0, 1]]])
    matches_torch(lambda a, b: ng.scatter_reduce(a, 0, idx, b, "amax"),
                  lambda a, b: a.scatter_reduce(0, torch.tensor(idx), b, "amax"), [x, s])
    matches_torch(lambda a, b: ng.scatter_add(a, 0, idx, b),
                  lambda a, b: a.scatter_add(0, torch.tensor(idx), b), [x, s])


def test_prod_zeros():
    x = np.array([[2.0, 0.0, 3.0], [0.0, 1.5, 2.0]])
    s = np.array([[0.0, 4.0, 0.0, 2.0], [0.0, 3.0, 5.0, 2.0]])
    idx = np.array([[0, 0, 1, 0], [1, 1, 1, 2]])
    for inc in (True, False):
        matches_torch(lambda a, b: ng.scatter_reduce(a, 1, idx, b, "prod", include_self=inc),
                      lambda a, b: a.scatter_reduce(1, torch.tensor(idx), b, "prod",
                                                    include_self=inc), [x, s], name=str(inc))


def test_wider_src_is_cut(dev):
    # PyTorch reads src's corner of the index's shape (its backward refuses this form)
    wide = np.concatenate([SRC, np.full((2, 2), 9.0)], 1)
    x, s = dev.param(X), dev.param(wide)
    with ng.grad_tape():
        loss = ng.sum(ng.scatter_reduce(x, 1, IDX, s, "amin") * 2.0)
    grads = ng.backward(loss)
    want = torch.tensor(X).scatter_reduce(1, T_IDX, torch.tensor(wide), "amin")
    np.testing.assert_array_equal(ng.scatter_reduce(x, 1, IDX, s, "amin").numpy(), want.numpy())
    g = Dev.host(grads[s.id])
    assert g.shape == wide.shape and not g[:, 3:].any() and g[:, :3].any()


def test_value_and_reduce_forms(dev):
    x = dev.tensor(X)
    got = ng.scatter(x, 1, IDX, value=2.5).numpy()
    np.testing.assert_array_equal(got, torch.tensor(X).scatter(1, T_IDX, 2.5).numpy())
    got = x.scatter(1, IDX, dev.tensor(SRC), reduce="multiply").numpy()
    want = torch.tensor(X).scatter_reduce(1, T_IDX, torch.tensor(SRC), "prod").numpy()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["scatter_add", "scatter_reduce_amax_False",
                                  "scatter_reduce_prod_True", "scatter_reduce_mean_False"])
def test_cuda(name):
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    _, f, g = next(c for c in CASES if c[0] == name)
    matches_torch(f, g, [X, SRC], Dev("cuda"), name=name)


def test_finite_differences(dev):
    x, s = dev.param(X), dev.param(SRC)
    w = dev.tensor(np.random.default_rng(3).normal(size=X.shape))
    few = None if dev.name == "cpu" else 2     # the simulator: two random directions
    for red in ("prod", "mean"):
        ng.testing.gradcheck(lambda: ng.sum(ng.scatter_reduce(x, 1, IDX, s, red) * w), [x, s],
                             directions=few)
    ng.testing.gradcheck(lambda: ng.sum(ng.scatter(x, 1, IDX[:, :1], s) * w), [x, s],
                         directions=few)


def test_device_indices(dev):
    x = dev.tensor(X)
    idx = ng.argmax(dev.tensor(np.array([[0.0, 3.0, 1.0], [0.0, 0.0, 9.0]])), 1, keepdims=True)
    got = ng.scatter_add(x, 1, idx, dev.tensor(SRC)).numpy()
    want = torch.tensor(X).scatter_add(1, torch.tensor(Dev.host(idx)), torch.tensor(SRC))
    np.testing.assert_array_equal(got, want.numpy())


# ------------------------------------------------------------ masked_select / unfold
def test_masked_select_and_unfold(dev):
    a = np.random.default_rng(4).normal(size=(3, 5))
    mask = np.array([True, False, True, True, False])
    matches_torch(lambda x: ng.masked_select(x, mask),
                  lambda x: torch.masked_select(x, torch.tensor(mask)), [a], dev)
    matches_torch(lambda x: x.unfold(1, 3, 2), lambda x: x.unfold(1, 3, 2), [a], dev)
    matches_torch(lambda x: x.unfold(0, 2, 1), lambda x: x.unfold(0, 2, 1), [a], dev)
    matches_torch(lambda x: ng.masked_select(x[:, :1], mask),    # x broadcast to the mask
                  lambda x: torch.masked_select(x[:, :1], torch.tensor(mask)), [a], dev)


def test_unfold_edges():
    a = np.arange(6.0)
    assert ng.unfold(ng.tensor(a), 0, 0, 1).shape == tuple(torch.tensor(a).unfold(0, 0, 1).shape)
    assert ng.unfold(ng.tensor(a), 0, 6, 3).shape == (1, 6)
    with pytest.raises(ValueError, match="size 7"):
        ng.unfold(ng.tensor(a), 0, 7, 1)


# ------------------------------------------------------------ several index arrays
KEYS = [
    (np.array([0, 2, 2]), np.array([1, 3, 1])),
    (slice(None), np.array([[0], [1]]), np.array([2, 0, 2])),
    (np.array([1, 0]), slice(None), np.array([3, 3])),
    (np.array([1, 0]), slice(1, 3), np.array([[3], [0]])),
    (Ellipsis, np.array([0, 1]), np.array([2, 2])),
    (None, np.array([2, 0]), 1, slice(None)),
    (slice(0, 2), np.array([[1, 1]]), np.array([[0], [3]])),
]


@pytest.mark.parametrize("key", KEYS, ids=[str(i) for i in range(len(KEYS))])
def test_several_arrays(key):
    a = np.random.default_rng(5).normal(size=(3, 4, 4))[:, :, :4]
    want = a[key]
    tkey = tuple(torch.tensor(k) if isinstance(k, np.ndarray) else k for k in key)
    matches_torch(lambda x: x[key], lambda x: x[tkey], [a], name=str(key))
    assert want.shape == ng.tensor(a)[key].shape


def test_int_beside_arrays_is_placed_as_numpy():
    # NumPy counts an int as an advanced index (here separated from the array
    # by a slice: the array's dims go first); PyTorch indexes with it first
    a = np.random.default_rng(8).normal(size=(3, 4, 4))
    x = ng.param(a)
    for key in [(1, slice(None), np.array([0, -1])), (np.array([[2], [0]]), 1, np.array([0, 3]))]:
        np.testing.assert_array_equal(x[key].numpy(), a[key])
        w = ng.tensor(np.random.default_rng(9).normal(size=a[key].shape))
        ng.testing.gradcheck(lambda: ng.sum(x[key] * w), [x])


def test_several_arrays_cuda_and_gradcheck(dev):
    a = np.random.default_rng(6).normal(size=(3, 4))
    i = ng.argmax(dev.tensor(a), 0)        # the package's own int64 indices
    x = dev.param(a)
    key = (np.array([2, 0, 2, 2]), i)
    w = dev.tensor(np.random.default_rng(7).normal(size=(4,)))
    ng.testing.gradcheck(lambda: ng.sum(x[key] * w), [x])
    np.testing.assert_array_equal(x[key].numpy(), a[np.array([2, 0, 2, 2]), Dev.host(i)])


def test_compile(tmp_path):
    def make():
        w = ng.param(X.copy())
        s = ng.param(SRC.copy())

        def loss_fn(idx):
            y = ng.scatter_reduce(w, 1, idx, s, "amax") + ng.scatter_add(w, 1, idx, s)
            return ng.sum(y * y) + ng.sum(w[np.array([0, 1]), np.array([3, 0])])
        return [w, s], loss_fn, ng.optim.SGD([w, s], lr=0.01)
    compiled_matches_eager(make, [(IDX,)] * 4, tmp_path)


# ------------------------------------------------------------ errors
def test_errors(dev):
    x, s = dev.tensor(X), dev.tensor(SRC)
    with pytest.raises(np.exceptions.AxisError):
        ng.scatter_add(x, 2, IDX, s)
    with pytest.raises(IndexDtypeError):
        ng.scatter_add(x, 1, IDX.astype(float), s)
    with pytest.raises(IndexError, match="index 4 is out of range for axis 1 of size 4"):
        ng.scatter_reduce(x, 1, np.array([[0, 4]]), s, "sum")
    with pytest.raises(IndexError, match="index -1 is out of range"):
        ng.scatter(x, 1, np.array([[0, -1]]), s)
    with pytest.raises(ValueError, match="does not fit"):
        ng.scatter_add(x, 1, np.zeros((3, 1), np.int64), s)
    with pytest.raises(ValueError, match="reduce must be one of"):
        ng.scatter_reduce(x, 1, IDX, s, "max")
    with pytest.raises(IndexDtypeError):
        x[np.array([0, 1]), np.array([0.0, 1.0])]
    with pytest.raises(IndexDtypeError):
        x[np.array([0, 1]), np.array([True, False])]
    with pytest.raises(IndexError, match="index 5 is out of range for axis 1 of size 4"):
        x[np.array([0, 1]), np.array([1, 5])]
    with pytest.raises(IndexDtypeError):
        ng.masked_select(x, np.array([1, 0, 1, 0]))


def test_setitem_with_several_arrays():
    a = np.zeros((3, 4))
    x = ng.tensor(a.copy())
    key = (np.array([0, 2, 2]), np.array([1, 3, 1]))
    x[key] = 1.5
    a[key] = 1.5
    np.testing.assert_array_equal(x.numpy(), a)
    with pytest.raises(IndexError, match="index 4 is out of bounds for axis 1 with size 4"):
        x[np.array([0, 1]), np.array([1, 4])] = 9.0
    np.testing.assert_array_equal(x.numpy(), a)          # nothing written
    with pytest.raises(IndexDtypeError):
        x[np.array([0, 1]), np.array([1.0, 2.0])] = 9.0


def test_scatter_takes_int64_tensor_indices_and_refuses_integer_inputs():
    """An int64 tensor indexes as its array does (the README's rule; the
    scatter ops refused one). An integer input became float64 silently,
    rounding int64 values past 2**53: it is refused with a clear error."""
    got = ng.scatter_add(ng.zeros(3, dtype=np.float32), 0, ng.tensor([1, 1]),
                         ng.ones(2, dtype=np.float32))
    np.testing.assert_array_equal(got.numpy(), np.array([0, 2, 0], np.float32))
    for x in (ng.tensor([2 ** 53 + 1, 7]), np.array([1, 2], np.int32)):
        with pytest.raises(TypeError, match="scatter_add: the input is an int"):
            ng.scatter_add(x, 0, np.array([1]), np.array([1]))
