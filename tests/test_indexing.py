"""x[key] (basic indexing and one integer array) and gather: values against
NumPy/PyTorch, gradients against PyTorch or NumPy's ``np.add.at`` (PyTorch
has no negative steps), both devices, ranks 0 to 5, errors, ``ng.compile``."""
import numpy as np
import pytest
import torch

import numbagrad as ng
from conftest import cuda_dev, cuda_launches
from test_shape_nd import compare_with_torch, flat_loss

IDX = np.array([[2, 0], [2, -1]])   # repeated and negative indices
KEYS = [   # (id, shape, key); the key as NumPy reads it
    ("int0", (3,), 1),
    ("int_all", (2, 3), (1, -1)),
    ("slice", (4, 5), (slice(1, None), slice(None, None, 2))),
    ("negative_step", (4, 5), (slice(None, None, -1), slice(4, 0, -3))),
    ("empty_slice", (4, 5), (slice(3, 1),)),
    ("none_ellipsis", (2, 3, 4), (None, Ellipsis, 1, None)),
    ("ellipsis_only", (), Ellipsis),
    ("none0", (), None),
    ("rank5", (2, 1, 3, 2, 2), (Ellipsis, slice(None, None, -1), 0)),
    ("size0_dim", (2, 0, 3), (1, slice(None), slice(None, None, -2))),
    ("array_first", (5, 3), IDX),
    ("array_list", (5, 3), [4, 4, 0]),
    ("array_middle", (2, 5, 3), (slice(None), IDX)),
    ("array_last_strided", (4, 5, 3), (slice(None, None, -2), Ellipsis, [2, 2])),
    ("array_with_int_adjacent", (2, 5, 3), (slice(None), 1, IDX)),
    ("array_with_int_apart", (2, 5, 3), (1, slice(None), np.array([0, 2, 2]))),
    ("array0d", (5, 3), np.array(3)),
    ("array_empty", (5, 3), np.zeros((0, 2), np.int64)),
    ("array_int32", (2, 1, 3, 2, 5), (Ellipsis, np.array([4, 0, 4], np.int32))),
    ("array_empty_list", (3, 2), (slice(None), [])),
]


@pytest.mark.parametrize("name, shape, key", KEYS, ids=[k[0] for k in KEYS])
def test_getitem_matches_numpy_and_scatter_adds(dev, name, shape, key):
    rng = np.random.default_rng(0)
    a = rng.normal(size=shape)
    x = dev.param(a)
    want = a[key]
    weights = rng.normal(size=np.shape(want))
    with ng.grad_tape():
        out = x[key]
        loss = flat_loss(out, dev.tensor(weights.reshape(-1)))
    assert out.shape == np.shape(want)
    np.testing.assert_array_equal(out.numpy(), want)
    grads = ng.backward(loss)
    expect = np.zeros(shape)
    np.add.at(expect, key, weights)   # every selected element gets its weights, added up
    np.testing.assert_allclose(dev.host(grads[x.id]), expect, rtol=1e-12, atol=1e-12)


TORCH_KEYS = [   # (id, shape, numbagrad function, torch function)
    ("slice", (4, 5), lambda x: x[1:, ::2], lambda t: t[1:, ::2]),
    ("ellipsis", (2, 3, 4), lambda x: x[..., None, 1:3], lambda t: t[..., None, 1:3]),
    ("array", (2, 5, 3), lambda x: x[:, [4, 0, 0]], lambda t: t[:, torch.tensor([4, 0, 0])]),
    ("array_2d", (5, 3), lambda x: x[IDX], lambda t: t[torch.tensor(IDX)]),
    ("negative_step", (4, 5), lambda x: x[::-2], lambda t: t.flip(0)[::2])]


@pytest.mark.parametrize("name, shape, f, g", TORCH_KEYS, ids=[k[0] for k in TORCH_KEYS])
def test_getitem_matches_torch(dev, name, shape, f, g):
    compare_with_torch(dev, f, g, [shape])


def test_embedding_gradient_equals_torch_nn_embedding(dev):
    rng = np.random.default_rng(0)
    table = rng.normal(size=(6, 3))
    idx = np.array([[1, 4, 1], [1, 0, 5]])
    E = dev.param(table)
    emb = torch.nn.Embedding(6, 3, _weight=torch.tensor(table))
    weights = rng.normal(size=(2, 3, 3))
    with ng.grad_tape():
        loss = flat_loss(E[idx], dev.tensor(weights.reshape(-1)))
    loss.backward()
    (emb(torch.tensor(idx)) * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(dev.host(E.grad), emb.weight.grad.numpy(), rtol=1e-9,
                               atol=1e-12)


def test_device_array_indices_on_cuda():
    dev = cuda_dev()
    from numba import cuda
    idx = np.array([3, 0, 3])
    E = dev.param(np.arange(12.0).reshape(4, 3))
    with ng.grad_tape():
        loss = flat_loss(E[cuda.to_device(idx)], dev.tensor(np.ones(9)))
    loss.backward()
    np.testing.assert_array_equal(dev.host(E.grad), np.bincount(idx, minlength=4)[:, None]
                                  * np.ones((4, 3)))
    Q = ng.gather(dev.tensor(np.arange(6.0).reshape(2, 3)), 1, cuda.to_device(np.array(
        [[2], [0]])))
    np.testing.assert_array_equal(Q.numpy(), [[2.0], [3.0]])


GATHERS = [("rl_q", (4, 3), 1, np.array([[2], [0], [0], [1]])),
           ("axis0_repeats", (3, 2), 0, np.array([[2, 2], [0, 2], [2, 1], [2, 2]])),
           ("smaller_index", (3, 4, 2), 1, np.array([[[3, 0], [3, 3]], [[1, 2], [0, 0]]])),
           ("rank1", (5,), 0, np.array([4, 4, 1])),
           ("rank5", (2, 1, 3, 1, 2), -1, np.zeros((2, 1, 3, 1, 3), np.int64) + [1, 0, 1]),
           ("empty", (2, 3), 1, np.zeros((2, 0), np.int64))]


@pytest.mark.parametrize("name, shape, axis, index", GATHERS, ids=[g[0] for g in GATHERS])
def test_gather_matches_torch(dev, name, shape, axis, index):
    compare_with_torch(dev, lambda x: x.gather(axis, index),
                       lambda t: torch.gather(t, axis, torch.tensor(index)), [shape])


def test_gather_and_getitem_gradcheck(dev):
    rng = np.random.default_rng(2)
    x = dev.param(rng.normal(size=(3, 4)))
    w = dev.tensor(rng.normal(size=9))
    directions = None if dev.name == "cpu" else 2
    ng.gradcheck(lambda: flat_loss(ng.gather(x, 1, np.array([[1, 1, 0], [0, 3, 3], [3, 2, 2]]))
                                   [::-1], w), [x], directions=directions)
    ng.gradcheck(lambda: flat_loss(x[[2, 0, 2], 1:], w), [x], directions=directions)


def test_float32_results_agree_bit_for_bit_between_devices():
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    rng = np.random.default_rng(5)
    table = rng.normal(size=(5, 4)).astype(np.float32)
    weights = rng.normal(size=(4, 2, 2, 4)).astype(np.float32)
    results = []
    for device in ("cpu", "cuda"):
        E = ng.param(table, device=device)
        w = ng.tensor(weights.reshape(-1), device=device)
        with ng.grad_tape():
            rows = E[np.array([[1, 1], [4, 1]])][::-1]                 # (2, 2, 4)
            q = ng.gather(ng.pad(E, ((0, 1), (0, 0))), 0, np.array([[5, 0, 0, 1]] * 2))
            out = ng.stack([rows, ng.broadcast_to(q, (2, 2, 4)), rows * 2.0, ng.transpose(rows, 0, 1)], 0)
            loss = ng.sum(ng.reshape(out, (-1,)) * w)
        grads = ng.backward(loss)
        results.append((out.numpy(), ng.kernels.get(device).to_host(grads[E.id])))
    for got, want in zip(*results):
        np.testing.assert_array_equal(got, want)


def test_bad_indices_raise_before_anything_runs(dev):
    x = dev.param(np.ones((3, 4)))
    launches = ng.cuda.launch_count() if dev.name == "cuda" else None
    with pytest.raises(IndexError, match=r"index 3 is out of range for axis 0 of size 3"):
        x[3]
    with pytest.raises(IndexError, match=r"index -5 is out of range for axis 1 of size 4"):
        x[:, np.array([0, -5])]
    with pytest.raises(IndexError, match=r"index 7 is out of range for axis 1 of size 4 "
                                         r"\(at position \(1, 0\)\)"):
        x[..., np.array([[0], [7]])]
    with pytest.raises(IndexError, match="too many indices"):
        x[0, 0, 0]
    with pytest.raises(IndexError, match="cannot be broadcast together"):
        x[[0, 1], [1, 2, 0]]
    with pytest.raises(TypeError, match="bool keys are not supported"):
        x[True]
    with pytest.raises(TypeError, match="indices must be integers, got dtype float64"):
        x[np.array([0.0])]
    with pytest.raises(TypeError, match="Tensor keys are not supported"):
        x[ng.tensor(np.array([0.0]), device=dev.name)]
    with pytest.raises(IndexError, match=r"gather: index -1 is out of range for axis 1 of "
                                         r"size 4"):
        ng.gather(x, 1, np.array([[0], [-1], [0]]))
    with pytest.raises(ValueError, match=r"gather: index of shape \(3,\) does not fit"):
        ng.gather(x, 1, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match=r"gather: index of shape \(4, 1\) does not fit"):
        ng.gather(x, 1, np.zeros((4, 1), np.int64))
    with pytest.raises(IndexError, match="gather: axis 2 is out of range"):
        ng.gather(x, 2, np.zeros((3, 1), np.int64))
    if launches is not None:
        assert ng.cuda.launch_count() == launches
    assert x.grad is None


def test_cuda_launch_counts():
    dev = cuda_dev()
    E = dev.param(np.ones((5, 3)))
    for f, forward in [(lambda t: t[np.array([1, 1, 4])], 1), (lambda t: t[1:, ::2], 1),
                       (lambda t: t[2], 0), (lambda t: ng.gather(t, 0, np.zeros((2, 3), int)), 1)]:
        assert cuda_launches(f, E) == (forward, 1)


def test_compiled_embedding_step_is_bit_identical_to_eager(tmp_path):
    rng = np.random.default_rng(0)
    start = rng.normal(size=(6, 4))

    def make():
        E = ng.param(start)

        def step(idx, target):
            rows = E[idx][:, ::-1]
            q = ng.gather(rows, 1, np.array([[0], [3], [3]]))
            return ng.mse_loss(ng.reshape(q, (3,)), target)
        return E, step

    E_eager, eager = make()
    E_comp, fn = make()
    step = ng.compile(fn, cache_dir=str(tmp_path))
    for _ in range(4):
        idx, target = rng.integers(0, 6, size=3), ng.tensor(rng.normal(size=3))
        with ng.grad_tape():
            want = eager(idx, target)
        want.backward()
        got = step(idx, target)
        assert got.item() == want.item()
        np.testing.assert_array_equal(E_comp.grad, E_eager.grad)
