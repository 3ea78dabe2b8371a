"""Shape ops at ranks 0 to 5 (reshape, view, permute, transpose, .T, .mT,
squeeze, unsqueeze, flatten, broadcast_to, expand) against PyTorch on both
devices, their views, launch counts, errors and ``ng.compile``."""
import numpy as np
import pytest
import torch

import numbagrad as ng
from conftest import cuda_dev, cuda_launches


def flat_loss(out, weights):
    """sum(out * weights) over every element, at any rank."""
    return ng.sum(ng.reshape(out, (-1,)) * weights)


def compare_with_torch(dev, f, g, shapes, seed=0, arrays=None):
    """``f`` on ``dev`` params against ``g`` on torch tensors: the values and
    every input's gradient (float64, rtol 1e-9). Returns the output."""
    rng = np.random.default_rng(seed)
    arrays = arrays if arrays is not None else [rng.normal(size=s) for s in shapes]
    ps = [dev.param(a) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    want = g(*ts)
    weights = rng.normal(size=tuple(want.shape))
    with ng.grad_tape():
        out = f(*ps)
        loss = flat_loss(out, dev.tensor(weights.reshape(-1)))
    assert out.shape == tuple(want.shape)
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12)
    grads = ng.backward(loss)
    (want * torch.tensor(weights)).sum().backward()
    for i, (p, t) in enumerate(zip(ps, ts)):
        got = dev.host(grads[p.id]) if p.id in grads else np.zeros(p.shape)
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=f"gradient of input {i}")
    return out


R5 = (2, 1, 3, 0, 2)
CASES = [   # (id, shape, ng function, torch function)
    ("reshape0", (), lambda x: x.reshape(1, 1), lambda x: x.reshape(1, 1)),
    ("reshape-1", (2, 3, 4), lambda x: x.reshape(4, -1), lambda x: x.reshape(4, -1)),
    ("reshape5", (2, 3, 2), lambda x: ng.reshape(x, (1, 2, 1, 3, 2)),
     lambda x: x.reshape(1, 2, 1, 3, 2)),
    ("reshape_size0", R5, lambda x: x.reshape(3, 0), lambda x: x.reshape(3, 0)),
    ("reshape_of_permute", (2, 3, 4), lambda x: x.permute(2, 0, 1).reshape(-1),
     lambda x: x.permute(2, 0, 1).reshape(-1)),
    ("view", (2, 3, 4), lambda x: x.view(6, 4), lambda x: x.view(6, 4)),
    ("permute0", (), lambda x: x.permute(), lambda x: x.permute(())),
    ("permute1", (3,), lambda x: ng.permute(x, (0,)), lambda x: x.permute(0)),
    ("permute3", (2, 3, 4), lambda x: x.permute(1, 2, 0), lambda x: x.permute(1, 2, 0)),
    ("permute5", (2, 1, 3, 2, 2), lambda x: ng.permute(x, (4, 0, 3, 1, 2)),
     lambda x: x.permute(4, 0, 3, 1, 2)),
    ("permute_size0", R5, lambda x: x.permute(3, 2, 1, 0, 4),
     lambda x: x.permute(3, 2, 1, 0, 4)),
    ("transpose2", (3, 4), ng.transpose, lambda x: x.transpose(0, 1)),
    ("transpose4", (2, 3, 1, 2), lambda x: x.transpose(0, -1), lambda x: x.transpose(0, -1)),
    ("transpose_default", (2, 3, 4), ng.transpose, lambda x: x.transpose(-2, -1)),
    ("transpose_of_transpose", (2, 3, 4), lambda x: x.transpose(0, 1).transpose(1, 2),
     lambda x: x.transpose(0, 1).transpose(1, 2)),
    ("T0", (), lambda x: x.T * 1.0, lambda x: x * 1.0),
    ("T1", (4,), lambda x: x.T * 1.0, lambda x: x * 1.0),
    ("T3", (2, 3, 4), lambda x: x.T, lambda x: x.permute(2, 1, 0)),
    ("mT3", (2, 3, 4), lambda x: x.mT, lambda x: x.mT),
    ("squeeze_all", (1, 3, 1, 2), ng.squeeze, torch.squeeze),
    ("squeeze_axis", (1, 3, 1, 2), lambda x: x.squeeze(-2), lambda x: x.squeeze(-2)),
    ("squeeze_axes", (1, 3, 1, 2), lambda x: ng.squeeze(x, (0, 2)),
     lambda x: x.squeeze((0, 2))),
    ("squeeze0", (), ng.squeeze, torch.squeeze),
    ("squeeze_strided", (3, 1, 4), lambda x: ng.squeeze(x.T), lambda x: x.permute(2, 1, 0)
     .squeeze()),
    ("unsqueeze0", (), lambda x: ng.unsqueeze(x, 0), lambda x: x.unsqueeze(0)),
    ("unsqueeze4", (2, 1, 3, 2), lambda x: x.unsqueeze(-1), lambda x: x.unsqueeze(-1)),
    ("unsqueeze_permuted", (2, 3), lambda x: ng.unsqueeze(x.T, 1),
     lambda x: x.T.unsqueeze(1)),
    ("flatten0", (), ng.flatten, torch.flatten),
    ("flatten", (2, 3, 4), ng.flatten, torch.flatten),
    ("flatten_mid", (2, 3, 1, 4, 2), lambda x: x.flatten(1, 3), lambda x: x.flatten(1, 3)),
    ("flatten_permuted", (2, 3, 4), lambda x: x.permute(2, 0, 1).flatten(-2),
     lambda x: x.permute(2, 0, 1).flatten(-2)),
    ("broadcast0", (), lambda x: ng.broadcast_to(x, (2, 3)),
     lambda x: torch.broadcast_to(x, (2, 3))),
    ("broadcast_lead", (3, 1), lambda x: x.broadcast_to((2, 1, 3, 4)),
     lambda x: x.broadcast_to((2, 1, 3, 4))),
    ("broadcast5", (1, 2, 1), lambda x: ng.broadcast_to(x, (2, 1, 3, 2, 2)),
     lambda x: torch.broadcast_to(x, (2, 1, 3, 2, 2))),
    ("broadcast_size0", (1, 3), lambda x: ng.broadcast_to(x, (0, 3)),
     lambda x: torch.broadcast_to(x, (0, 3))),
    ("broadcast_permuted", (2, 3), lambda x: ng.broadcast_to(x.T, (2, 3, 2)),
     lambda x: x.T.broadcast_to((2, 3, 2))),
    ("expand", (3, 1), lambda x: x.expand(2, -1, 4), lambda x: x.expand(2, -1, 4)),
]


@pytest.mark.parametrize("name, shape, f, g", CASES, ids=[c[0] for c in CASES])
def test_shape_op_matches_torch(dev, name, shape, f, g):
    compare_with_torch(dev, f, g, [shape])


@pytest.mark.parametrize("name", ["permute3", "broadcast_lead", "flatten_mid", "T3"])
def test_shape_op_gradcheck(dev, name):
    _, shape, f, _ = next(c for c in CASES if c[0] == name)
    x = dev.param(np.random.default_rng(2).normal(size=shape))
    w = dev.tensor(np.random.default_rng(3).normal(size=f(x).size))
    ng.gradcheck(lambda: flat_loss(f(x), w), [x], directions=None if dev.name == "cpu" else 2)


def test_cpu_views_share_the_data():
    x = ng.param(np.arange(24.0).reshape(2, 3, 4))
    for out in (x.permute(2, 0, 1), x.T, x.mT, ng.transpose(x, 0, 1), x.reshape(6, 4),
                ng.squeeze(x[0:1]), ng.unsqueeze(x, 1), ng.flatten(x), x.view(4, 6),
                ng.broadcast_to(x, (2, 2, 3, 4))):
        assert np.shares_memory(out.data, x.data)


def test_views_of_a_param_accumulate_its_gradient(dev):
    # two views of one param in one loss: both gradients land in its .grad, twice over
    a = np.random.default_rng(0).normal(size=(2, 3, 4))
    x = dev.param(a)
    t = torch.tensor(a, requires_grad=True)
    for _ in range(2):
        with ng.grad_tape():
            loss = ng.sum(ng.reshape(x.permute(2, 0, 1) * 1.0, (-1,)) * ng.reshape(
                ng.broadcast_to(x[0:1], (2, 3, 4)).permute(2, 0, 1), (-1,)))
        loss.backward()
        (t.permute(2, 0, 1) * t[0:1].expand(2, 3, 4).permute(2, 0, 1)).sum().backward()
    np.testing.assert_allclose(dev.host(x.grad), t.grad.numpy(), rtol=1e-9)


def test_cuda_launches_one_per_forward_and_per_gradient():
    dev = cuda_dev()
    x = dev.param(np.ones((2, 3, 4)))
    for f, forward in [(lambda t: t.permute(2, 0, 1), 1), (lambda t: t.reshape(4, 6), 0),
                       (lambda t: ng.broadcast_to(t, (2, 2, 3, 4)), 1), (lambda t: t.T, 1),
                       (lambda t: ng.unsqueeze(t, 0), 0)]:
        assert cuda_launches(f, x) == (forward, 1)


def test_bad_shapes_raise_before_anything_runs(dev):
    x = dev.param(np.ones((2, 3, 4)))
    before = x.numpy()
    with pytest.raises(ValueError, match=r"permute: dims \(0, 1\) are not a permutation"):
        x.permute(0, 1)
    with pytest.raises(ValueError, match="permute: dims"):
        x.permute(0, 0, 1)
    with pytest.raises(IndexError, match=r"transpose: dim1 3 is out of range .*3 dims"):
        ng.transpose(x, 0, 3)
    with pytest.raises(IndexError, match="transpose: dim0 -2 is out of range for a tensor of 1"):
        ng.transpose(dev.param(np.ones(3)))
    with pytest.raises(ValueError, match="mT: needs a tensor of at least 2 dims"):
        dev.param(np.ones(3)).mT
    with pytest.raises(ValueError, match=r"squeeze: axis 1 has size 3, not 1"):
        ng.squeeze(x, 1)
    with pytest.raises(IndexError, match="unsqueeze: axis 4 is out of range"):
        ng.unsqueeze(x, 4)
    with pytest.raises(ValueError, match=r"broadcast_to: a tensor of shape \(2, 3, 4\).* "
                                         r"cannot be broadcast to shape \(3, 4\)"):
        ng.broadcast_to(x, (3, 4))
    with pytest.raises(ValueError, match="expand: shape"):
        x.expand(-1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"reshape: cannot reshape a tensor of shape \(2, 3, 4\)"):
        x.reshape(5, -1)
    if dev.name == "cpu":   # (on CUDA a permute is a C-contiguous copy)
        with pytest.raises(ValueError, match="view: the data of a tensor .* is not C-contiguous"):
            x.permute(2, 0, 1).view(-1)
    with pytest.raises(ValueError, match="flatten: start_dim 2 comes after end_dim 1"):
        ng.flatten(x, 2, 1)
    np.testing.assert_array_equal(x.numpy(), before)
    assert x.grad is None


def test_compiled_step_is_bit_identical_to_eager(tmp_path):
    rng = np.random.default_rng(0)
    start = rng.normal(size=(3, 1, 4))

    def make():
        w = ng.param(start)

        def step(x):
            y = ng.broadcast_to(w, (2, 3, 2, 4)).permute(0, 2, 3, 1) * x
            return ng.sum(ng.reshape(ng.transpose(y, 1, 2), (-1,)) ** 2)
        return w, step

    w_eager, eager = make()
    w_comp, fn = make()
    step = ng.compile(fn, cache_dir=str(tmp_path))
    for _ in range(4):
        x = ng.tensor(rng.normal(size=(2, 2, 4, 3)))
        with ng.grad_tape():
            want = eager(x)
        want.backward()
        got = step(x)
        assert got.item() == want.item()
        np.testing.assert_array_equal(w_comp.grad, w_eager.grad)


def test_every_public_function_of_the_new_op_modules_has_a_row():
    import inspect

    from numbagrad.ops import indexing, join, shape
    rowed = {op.fn for op in ng.ops.table.OPS}
    for module in (indexing, join, shape):
        for name, fn in vars(module).items():
            if inspect.isfunction(fn) and fn.__module__ == module.__name__ \
                    and not name.startswith("_"):
                assert fn in rowed, f"{module.__name__}.{name} has no row in ops/table.py"
    assert ng.Tensor.__getitem__.__doc__ == indexing.getitem.__doc__
    for name in ("view", "permute", "transpose", "flatten", "squeeze", "unsqueeze",
                 "broadcast_to", "expand", "gather", "reshape"):
        assert getattr(ng.Tensor, name).__doc__ == getattr(ng, name).__doc__
