"""concatenate/cat, stack, split and pad against PyTorch (NumPy for split's
and pad's argument forms) on both devices, launch counts, errors, compile."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import numbagrad as ng
from conftest import cuda_dev
from test_shape_nd import compare_with_torch

JOINS = [   # (id, shapes, numbagrad function, torch function)
    ("cat1", [(2,), (0,), (3,)], lambda *t: ng.concatenate(t), lambda *t: torch.cat(t)),
    ("cat2_axis1", [(2, 3), (2, 1)], lambda *t: ng.cat(t, 1), lambda *t: torch.cat(t, 1)),
    ("cat3_strided", [(2, 3, 4), (3, 2, 4)], lambda a, b: ng.cat([a.permute(1, 0, 2), b], 0),
     lambda a, b: torch.cat([a.permute(1, 0, 2), b], 0)),
    ("cat5_last", [(1, 2, 1, 2, 2), (1, 2, 1, 2, 1)], lambda *t: ng.cat(list(t), -1),
     lambda *t: torch.cat(t, -1)),
    ("cat_size0", [(0, 3), (0, 2)], lambda *t: ng.cat(t, 1), lambda *t: torch.cat(t, 1)),
    ("stack0d", [(), (), ()], lambda *t: ng.stack(t), lambda *t: torch.stack(t)),
    ("stack2_mid", [(2, 3), (2, 3)], lambda *t: ng.stack(t, 1), lambda *t: torch.stack(t, 1)),
    ("stack4_last", [(2, 1, 2, 2)] * 2, lambda *t: ng.stack(t, -1),
     lambda *t: torch.stack(t, -1)),
    ("stack_transposed", [(3, 2), (2, 3)], lambda a, b: ng.stack([a.T, b]),
     lambda a, b: torch.stack([a.T, b])),
    ("pad0", [()], lambda x: ng.pad(x, 2), lambda x: x * 1.0),
    ("pad1", [(3,)], lambda x: ng.pad(x, (2, 1), -1.5), lambda x: F.pad(x, (2, 1), value=-1.5)),
    ("pad_int", [(2, 3)], lambda x: ng.pad(x, 1), lambda x: F.pad(x, (1, 1, 1, 1))),
    ("pad_pairs", [(2, 1, 3)], lambda x: ng.pad(x, ((0, 1), (2, 0), (1, 1)), 0.25),
     lambda x: F.pad(x, (1, 1, 2, 0, 0, 1), value=0.25)),
    ("pad_one_pair", [(2, 3)], lambda x: ng.pad(x, ((1, 0),)), lambda x: F.pad(x, (1, 0, 1, 0))),
    ("pad_size0", [(0, 2)], lambda x: ng.pad(x, 1), lambda x: F.pad(x, (1, 1, 1, 1))),
    ("pad5_permuted", [(2, 1, 2, 1, 2)], lambda x: ng.pad(x.permute(4, 3, 2, 1, 0), (0, 1)),
     lambda x: F.pad(x.permute(4, 3, 2, 1, 0), (0, 1) * 5)),
]


@pytest.mark.parametrize("name, shapes, f, g", JOINS, ids=[j[0] for j in JOINS])
def test_join_matches_torch(dev, name, shapes, f, g):
    compare_with_torch(dev, f, g, shapes)


SPLITS = [((6, 2), 3, 0), ((2, 6), [1, 4], 1), ((2, 6), [-2], -1), ((3, 1, 4), [5, 2], 2),
          ((4,), [0, 0, 4], 0), ((2, 1, 2, 3, 2), 3, 3)]


@pytest.mark.parametrize("shape, parts, axis", SPLITS, ids=[str(s) for s in SPLITS])
def test_split_matches_numpy_and_every_part_gets_its_gradient(dev, shape, parts, axis):
    rng = np.random.default_rng(0)
    a = rng.normal(size=shape)
    x = dev.param(a)
    want = np.split(a, parts, axis)
    with ng.grad_tape():
        got = ng.split(x, parts, axis)
        loss = None
        for k, part in enumerate(got):
            term = ng.sum(ng.reshape(part, (-1,))) * float(k + 1)
            loss = term if loss is None else loss + term
    assert [p.shape for p in got] == [w.shape for w in want]
    for p, w in zip(got, want):
        np.testing.assert_array_equal(p.numpy(), w)
    grads = ng.backward(loss)
    expect = np.zeros(shape)
    along = np.moveaxis(expect, axis, 0)   # a view: parts may overlap ([5, 2] on 4)
    for k, rows in enumerate(np.split(np.arange(shape[axis]), parts)):
        along[rows] += k + 1.0
    np.testing.assert_array_equal(dev.host(grads[x.id]), expect)


def test_concatenate_of_one_param_twice_adds_both_gradients(dev):
    a = np.random.default_rng(0).normal(size=(2, 3))
    compare_with_torch(dev, lambda x: ng.stack([x, x * 2.0, x], 0),
                       lambda t: torch.stack([t, t * 2.0, t], 0), [(2, 3)], arrays=[a])


def test_join_gradcheck(dev):
    rng = np.random.default_rng(2)
    a, b = dev.param(rng.normal(size=(2, 3))), dev.param(rng.normal(size=(2, 2)))
    w = dev.tensor(rng.normal(size=4 * 7 * 2))
    directions = None if dev.name == "cpu" else 2
    ng.gradcheck(lambda: ng.sum(ng.reshape(ng.pad(ng.stack([ng.cat([a, b], 1)] * 2, -1),
                                                  ((1, 1), (1, 1), (0, 0)), 3.0), (-1,)) * w),
                 [a, b], directions=directions)


def test_cuda_launches_one_per_eight_inputs_and_per_gradient():
    dev = cuda_dev()
    a, b = dev.param(np.ones((2, 3))), dev.param(np.ones((2, 2)))
    c = dev.param(np.ones((3, 2)))
    for f, forward in [(lambda: ng.cat([a, b], 1), 1), (lambda: ng.stack([a, a]), 1),
                       (lambda: ng.cat([a] * 9, 0), 2),             # eight per concat kernel
                       (lambda: ng.cat([a, c.T, b], 1), 3),         # a strided view: its own
                       (lambda: ng.pad(a, 1), 1)]:
        before = ng.cuda.launch_count()
        with ng.grad_tape():
            out = f()
        assert ng.cuda.launch_count() - before == forward
        ctx = ng.tape._Backward.make(collect=True)
        before = ng.cuda.launch_count()
        out._node.backward(ctx, out._node, ng.kernels.get("cuda").from_host(np.ones(out.shape)))
        assert ng.cuda.launch_count() - before == len(out._node.inputs)


def test_bad_joins_raise_before_anything_runs(dev):
    a, b = dev.param(np.ones((2, 3))), dev.param(np.ones((3, 3)))
    with pytest.raises(ValueError, match=r"concatenate: tensor 1 has shape \(3, 3\) but "
                                         r"tensor 0 has \(2, 3\): all must match except "
                                         r"along axis 1"):
        ng.cat([a, b], 1)
    with pytest.raises(ValueError, match="0-d tensors cannot be concatenated"):
        ng.cat([dev.param(np.ones(())), dev.param(np.ones(()))])
    with pytest.raises(TypeError, match="concatenate: expects a list or tuple of tensors"):
        ng.concatenate(a)
    with pytest.raises(ValueError, match="stack: needs at least one tensor"):
        ng.stack([])
    with pytest.raises(ValueError, match=r"stack: tensor 1 has shape \(3, 3\)"):
        ng.stack([a, b])
    with pytest.raises(IndexError, match="stack: axis 3 is out of range"):
        ng.stack([a, a], 3)
    assert ng.cat([a, dev.param(np.ones((2, 3), np.float32))]).dtype == a.dtype  # promoted
    with pytest.raises(ValueError, match="split: axis 0 of size 2 does not split into 3 "
                                         "equal parts"):
        ng.split(a, 3)
    with pytest.raises(ValueError, match="pad: pad_width cannot be negative"):
        ng.pad(a, ((0, -1), (0, 0)))
    with pytest.raises(ValueError, match=r"pad: pad_width .* does not fit a tensor of 2 dims"):
        ng.pad(a, ((1, 1), (1, 1), (1, 1)))
    with pytest.raises(TypeError, match="pad: pad_width must be integers"):
        ng.pad(a, 1.5)
    with pytest.raises(TypeError, match="pad: value must be a real number"):
        ng.pad(a, 1, "0")
    assert a.grad is None and b.grad is None


def test_compiled_step_is_bit_identical_to_eager(tmp_path):
    rng = np.random.default_rng(0)
    starts = rng.normal(size=(2, 3)), rng.normal(size=(2, 1))

    def make():
        w, v = ng.param(starts[0]), ng.param(starts[1])

        def step(x):
            h = ng.pad(ng.cat([w, v], 1), ((0, 1), (1, 0)), 0.5)   # (3, 5)
            left, right = ng.split(h, [2], 1)
            y = ng.stack([left * x, left], -1)
            return ng.sum(ng.reshape(y, (-1,)) ** 2) + ng.sum(ng.reshape(right, (-1,)))
        return (w, v), step

    eager_params, eager = make()
    comp_params, fn = make()
    step = ng.compile(fn, cache_dir=str(tmp_path))
    for _ in range(4):
        x = ng.tensor(rng.normal(size=(3, 2)))
        with ng.grad_tape():
            want = eager(x)
        want.backward()
        got = step(x)
        assert got.item() == want.item()
        for p, q in zip(comp_params, eager_params):
            np.testing.assert_array_equal(p.grad, q.grad)


def test_many_and_mixed_inputs_join_in_order(dev):
    """Chunks of eight contiguous inputs and strided views between them land
    where NumPy puts them, and every input gets its own gradient."""
    rng = np.random.default_rng(4)
    base = [rng.normal(size=(2, i % 3 + 1, 3)) for i in range(11)]
    flip = [i % 4 == 2 for i in range(11)]          # these enter as reversed (strided) views
    ts = [dev.param(x) for x in base]
    w = rng.normal(size=(2, sum(x.shape[1] for x in base), 3))
    with ng.grad_tape():
        out = ng.concatenate([t[:, ::-1] if f else t for t, f in zip(ts, flip)], axis=1)
        loss = ng.sum(out * dev.tensor(w))
    loss.backward()
    want = np.concatenate([x[:, ::-1] if f else x for x, f in zip(base, flip)], axis=1)
    np.testing.assert_array_equal(out.numpy(), want)
    at = 0
    for x, t, f in zip(base, ts, flip):
        n = x.shape[1]
        g = w[:, at:at + n]
        np.testing.assert_array_equal(dev.host(t.grad), g[:, ::-1] if f else g)
        at += n
