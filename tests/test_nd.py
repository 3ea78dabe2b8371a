"""N-d tensors through the elementwise ops, reductions, softmax and losses:
values and every input's gradient against PyTorch (float64, 1e-9) on both
devices, at ranks 0 to 5 with size-0 and size-1 dims, plus finite
differences, ng.compile and CUDA launch counts on N-d graphs."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import numbagrad as ng
from conftest import inputs, matches_torch, weighted_sum

# (shape of a, shape of b): broadcasts that collapse to 2 dims and ones that do not
BROADCASTS = [((2, 3, 4), (4,)), ((2, 3, 4), (2, 3, 1)), ((2, 3, 4, 5), (3, 1, 5)),
              ((2, 1, 4), (1, 3, 1)), ((2, 3, 4), (2, 3, 4)), ((), (2, 3, 4)),
              ((2, 0, 3), (1, 3)), ((1, 2, 1, 3, 1), (2, 1, 3, 2)), ((2, 3, 1, 2, 1), (1,)),
              ((3, 1, 2), (3, 4, 1))]
BINARY = {"add": (ng.add, torch.add), "sub": (ng.sub, torch.sub), "mul": (ng.mul, torch.mul),
          "div": (lambda a, b: a / (b * b + 1.0), lambda a, b: a / (b * b + 1.0))}
SHAPES = [(), (1,), (4,), (2, 0), (2, 3, 4), (1, 2, 1, 3), (2, 1, 3, 1, 2)]
REDUCE_SHAPES = [(2, 3, 4), (2, 3, 4, 5), (1, 2, 0, 3), (3, 1, 2, 1, 2)]


def run(dev, f, g, shapes):
    """f on numbagrad params of ``shapes`` against g on torch tensors."""
    matches_torch(f, g, inputs(shapes), dev, name=str(shapes))


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("sa, sb", BROADCASTS, ids=str)
def test_binary_broadcasts_like_torch(dev, name, sa, sb):
    f, g = BINARY[name]
    run(dev, f, g, [sa, sb])
    run(dev, lambda a, b: f(b, a), lambda a, b: g(b, a), [sa, sb])


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_unary_and_scalar_ops_any_rank(dev, shape):
    run(dev, lambda x: ng.tanh(x) * 2.0 - ng.exp(-x) + 1.5 / (x * x + 1.0),
        lambda x: torch.tanh(x) * 2.0 - torch.exp(-x) + 1.5 / (x * x + 1.0), [shape])
    run(dev, lambda x: ng.sqrt(x * x + 0.5) ** 3, lambda x: torch.sqrt(x * x + 0.5) ** 3,
        [shape])


@pytest.mark.parametrize("shape", REDUCE_SHAPES, ids=str)
@pytest.mark.parametrize("axis", [None, 0, -1, 1, (0, 2), (1, -1), "all"], ids=str)
@pytest.mark.parametrize("keepdims", [False, True])
def test_sum_and_mean_over_any_axes(dev, shape, axis, keepdims):
    axis = tuple(range(len(shape))) if axis == "all" else axis
    dims = tuple(range(len(shape))) if axis is None else axis
    run(dev, lambda x: ng.sum(x, axis, keepdims), lambda x: x.sum(dim=dims, keepdim=keepdims),
        [shape])
    got = ng.mean(dev.tensor(np.ones(shape)), axis, keepdims).numpy()
    want = torch.ones(shape, dtype=torch.float64).mean(dim=dims, keepdim=keepdims).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-15)     # nan over a size-0 axis, as torch


@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 1, 3, 2), (3, 2, 2, 1, 2)], ids=str)
def test_softmax_family_over_every_axis(dev, shape):
    for axis in range(-len(shape), len(shape)):
        run(dev, lambda x: ng.softmax(x, axis), lambda x: torch.softmax(x, axis), [shape])
        run(dev, lambda x: ng.log_softmax(x, axis), lambda x: torch.log_softmax(x, axis),
            [shape])


@pytest.mark.parametrize("shape", [(2, 3, 4), (1, 2, 3, 1, 2)], ids=str)
def test_pointwise_losses_on_any_matching_shapes(dev, shape):
    target = np.random.default_rng(5).uniform(size=shape)
    for red in ("mean", "sum"):
        run(dev, lambda x: ng.mse_loss(x, dev.tensor(target), red),
            lambda x: F.mse_loss(x, torch.tensor(target), reduction=red), [shape])
        run(dev, lambda x: ng.binary_cross_entropy_with_logits(x, dev.tensor(target), red),
            lambda x: F.binary_cross_entropy_with_logits(x, torch.tensor(target), reduction=red),
            [shape])


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 4), (2, 3, 2, 2), (3, 2, 1, 2)], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_with_positions(dev, shape, reduction):
    labels = np.random.default_rng(2).integers(0, shape[1], size=(shape[0],) + shape[2:])
    run(dev, lambda x: ng.cross_entropy(x, labels, reduction),
        lambda x: F.cross_entropy(x, torch.tensor(labels), reduction=reduction), [shape])


def test_nd_gradcheck(dev):
    a, b = [dev.param(v) for v in inputs([(2, 1, 3), (1, 4, 1)], seed=3)]
    labels = np.array([[0, 2, 1], [1, 1, 0]])
    w = dev.tensor(np.random.default_rng(4).normal(size=(2, 4, 3)))

    def loss():
        h = ng.tanh(a * b + a)
        return weighted_sum(ng.log_softmax(h, axis=1), w) + ng.cross_entropy(h, labels) \
            + ng.sum(h * h, axis=(0, 2)).mean()
    ng.gradcheck(loss, [a, b], directions=None if dev.name == "cpu" else 2)


def test_nd_step_compiles_bit_identical_to_eager():
    rng = np.random.default_rng(0)
    x0, w0 = rng.normal(size=(2, 3, 4)), rng.normal(size=(3, 1))
    labels = np.array([[0, 1, 2, 2], [2, 2, 1, 0]])

    def make():
        w = ng.param(w0)
        opt = ng.optim.Adam([w], lr=0.01, accumulate_steps=2)

        def step(x):
            h = ng.tanh(x * w)
            return ng.cross_entropy(h, labels) + ng.softmax(h, axis=1).sum(axis=(0, 2)).mean()
        return w, opt, step

    w_e, opt_e, step_e = make()
    w_c, opt_c, step_c = make()
    compiled = ng.compile(step_c, optimizer=opt_c)
    for i in range(4):
        x = ng.tensor(x0 + i)
        with ng.grad_tape():
            loss = step_e(x)
        loss.backward()
        opt_e.step()
        got = compiled(x)
        assert got.item() == loss.item()
    np.testing.assert_array_equal(w_c.numpy(), w_e.numpy())


def test_cuda_nd_graph_launches_one_kernel_per_op_and_gradient():
    if not ng.cuda_available():
        pytest.skip(ng.kernels.cuda_unavailable_reason())
    rng = np.random.default_rng(0)
    x = ng.tensor(rng.normal(size=(2, 3, 4)), device="cuda")
    b = ng.param(rng.normal(size=(4,)), device="cuda")
    s = ng.param(rng.normal(size=(2, 3, 1)), device="cuda")
    for _ in range(2):    # the first backward also creates (fills) the accumulators
        before = ng.cuda.launch_count()
        with ng.grad_tape():
            h = ng.tanh(x * s + b)                 # 3 ops, each collapsing to 2 dims
            loss = ng.sum(h, axis=(0, 1)).mean()   # 2 reductions
        assert ng.cuda.launch_count() - before == 5
        before = ng.cuda.launch_count()
        loss.backward()
    # the seed's fill, then one kernel per op: add's writes both of its gradients
    assert ng.cuda.launch_count() - before == 1 + 5


def test_shape_index_and_select_ops_compile_bit_identical_to_eager():
    """An embedding lookup, a batched matmul, where, concatenate, a negative
    step, permute, pad, gather, split, stack and astype under ng.compile."""
    rng = np.random.default_rng(0)
    idx = np.array([[0, 2], [1, 1]])
    e0, w0 = rng.normal(size=(4, 3)), rng.normal(size=(2, 3, 5))

    def make():
        E, W = ng.param(e0), ng.param(w0)
        opt = ng.optim.SGD([E, W], lr=0.1, momentum=0.9, accumulate_steps=2)

        def step(x):
            z = E[idx] @ W
            z = ng.where(z > 0, z, z * 0.1)
            z = ng.concatenate([z, z[:, ::-1]], axis=1).permute(0, 2, 1)
            z = ng.pad(z, ((0, 0), (1, 0), (0, 0)))
            g = ng.gather(z, 1, np.zeros((2, 1, 4), np.int64))
            parts = ng.stack(ng.split(z, 2, axis=2)).astype(np.float32).astype(np.float64)
            return (ng.softmax(z, axis=1) * x).sum() + g.mean() + parts.sum()
        return E, W, opt, step

    E_e, W_e, opt_e, step_e = make()
    E_c, W_c, opt_c, step_c = make()
    compiled = ng.compile(step_c, optimizer=opt_c)
    for _ in range(4):
        x = ng.tensor(rng.normal(size=(2, 6, 4)))
        with ng.grad_tape():
            loss = step_e(x)
        loss.backward()
        opt_e.step()
        assert compiled(x).item() == loss.item()
    np.testing.assert_array_equal(E_c.numpy(), E_e.numpy())
    np.testing.assert_array_equal(W_c.numpy(), W_e.numpy())


def test_views_and_broadcasts_beyond_the_cuda_kernels_rank_collapse_first(dev):
    # rank 7 (CUDA's N-d kernels take 6 dims): merged dims fit, on both devices
    run(dev, lambda x: ng.permute(x, (6, 5, 4, 3, 2, 1, 0)) * 2.0,
        lambda x: x.permute(6, 5, 4, 3, 2, 1, 0) * 2.0, [(2, 1, 3, 1, 2, 1, 2)])
    run(dev, lambda x: ng.broadcast_to(x, (2, 1, 2, 1, 2, 1, 3)) * 1.0,
        lambda x: torch.broadcast_to(x, (2, 1, 2, 1, 2, 1, 3)) * 1.0, [(3,)])
    run(dev, lambda x: ng.broadcast_to(x, ()) * 3.0, lambda x: torch.broadcast_to(x, ()) * 3.0,
        [()])


def test_numpy_take_along_axis_broadcasts_its_indices_as_numpy_does():
    a = np.arange(12.0).reshape(3, 4)
    idx = np.array([[0, 2]])
    p = ng.param(a)
    with ng.grad_tape():
        out = np.take_along_axis(p, idx, 1)
        loss = out.sum()
    np.testing.assert_array_equal(out.numpy(), np.take_along_axis(a, idx, 1))
    grads = ng.backward(loss)
    np.testing.assert_array_equal(grads[p.id], np.tile([1.0, 0.0, 1.0, 0.0], (3, 1)))
    with pytest.raises(ValueError, match="do not broadcast"):
        np.take_along_axis(p, np.zeros((2, 1), int), 1)
