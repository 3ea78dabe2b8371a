"""ops/layout.py beyond the op table's rows: the forms with lists, sizes 0,
other arguments, and the errors, against PyTorch."""
from __future__ import annotations

import numpy as np
import pytest

import numbagrad as ng
from conftest import matches_torch

torch = pytest.importorskip("torch")

X = np.random.default_rng(0).normal(size=(5, 4))


@pytest.mark.parametrize("chunks, dim", [(2, 0), (3, 0), (5, 0), (7, 0), (3, 1), (1, -1)])
def test_chunk_cuts_as_torch(chunks, dim):
    got = ng.chunk(ng.tensor(X), chunks, dim)
    want = torch.chunk(torch.tensor(X), chunks, dim)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


@pytest.mark.parametrize("name, f, g", [
    ("roll flat", lambda a: ng.roll(a, 3), lambda a: torch.roll(a, 3)),
    ("roll back", lambda a: ng.roll(a, -6, 0), lambda a: torch.roll(a, -6, 0)),
    ("repeat_interleave counts",
     lambda a: ng.repeat_interleave(a, [2, 0, 1, 3, 1], 0),
     lambda a: torch.repeat_interleave(a, torch.tensor([2, 0, 1, 3, 1]), 0)),
    ("repeat_interleave flat", lambda a: ng.repeat_interleave(a, 2),
     lambda a: torch.repeat_interleave(a, 2)),
    ("diag of a matrix", lambda a: ng.diag(a, 1), lambda a: torch.diag(a, 1)),
    ("diagonal below", lambda a: ng.diagonal(a, -2), lambda a: torch.diagonal(a, -2)),
    ("diagonal past the end", lambda a: ng.diagonal(a, 9), lambda a: torch.diagonal(a, 9)),
    ("triu far", lambda a: ng.triu(a, -7), lambda a: torch.triu(a, -7)),
    ("tile more dims", lambda a: ng.tile(a, (2, 1, 2)), lambda a: torch.tile(a, (2, 1, 2))),
    ("repeat zero", lambda a: ng.repeat(a, 0, 2), lambda a: a.repeat(0, 2)),
    ("flip one", lambda a: ng.flip(a, -1), lambda a: torch.flip(a, (-1,))),
])
def test_other_forms_match_torch(name, f, g):
    matches_torch(f, g, [X], name=name)


def test_masked_fill_takes_a_tensor_mask_on_its_device(dev):
    x = dev.param(X)
    with ng.grad_tape():
        y = ng.masked_fill(x, x > 0, -1.0)
        loss = ng.sum(y * y)
    grads = ng.backward(loss)
    want = torch.tensor(X, requires_grad=True)
    w = want.masked_fill(want > 0, -1.0)
    (w * w).sum().backward()
    host = ng.kernels.get(dev.name).to_host
    np.testing.assert_allclose(host(y._data), w.detach().numpy())
    np.testing.assert_allclose(host(grads[x.id]), want.grad.numpy())


def test_bad_arguments_name_the_op():
    x = ng.tensor(X)
    with pytest.raises(ValueError, match="roll: shifts"):
        ng.roll(x, (1, 2), 0)
    with pytest.raises(ValueError, match="flip: dims"):
        ng.flip(x, (0, 0))
    with pytest.raises(np.exceptions.AxisError):
        ng.flip(x, 2)
    with pytest.raises(ValueError, match="tril: needs a tensor of at least 2 dims"):
        ng.tril(ng.tensor(np.ones(3)))
    with pytest.raises(ValueError, match="chunk: chunks must be > 0"):
        ng.chunk(x, 0)
    with pytest.raises(ValueError, match="repeat: 1 sizes for a tensor of 2 dims"):
        ng.repeat(x, 2)
    with pytest.raises(ValueError, match="repeat_interleave: 2 repeats for dim 0 of size 5"):
        ng.repeat_interleave(x, [1, 2], 0)
    with pytest.raises(ValueError, match="diagonal: dim1 and dim2"):
        ng.diagonal(x, 0, 1, -1)
    with pytest.raises(TypeError, match="tril: diagonal must be an int"):
        ng.tril(x, 0.5)


def test_methods_run_the_ops():
    x = ng.tensor(X)
    np.testing.assert_array_equal(x.flip(0).numpy(), X[::-1])
    np.testing.assert_array_equal(x.tril().numpy(), np.tril(X))
    np.testing.assert_array_equal(x.repeat(1, 2).numpy(), np.tile(X, (1, 2)))
    np.testing.assert_array_equal(x.unflatten(1, (2, 2)).numpy(), X.reshape(5, 2, 2))


def test_consistent_error_classes():
    """Issue 30's consistent errors: float or bool index arrays are an
    IndexError (also a TypeError, as before), a wrong-length tuple a
    ValueError (also a TypeError), and norm layers take rng= like the rest."""
    x = ng.tensor(X)
    for fn in (lambda: x[np.array([0.0, 1.0])], lambda: ng.gather(x, 0, np.array([[True]])),
               lambda: ng.gather(x, 1, np.array([[0.5]])),
               lambda: ng.embedding(np.array([1.0]), x)):
        with pytest.raises(IndexError, match="indices must be integers"):
            fn()
        with pytest.raises(TypeError, match="indices must be integers"):
            fn()
    image, w = ng.tensor(np.ones((1, 1, 4, 4))), ng.tensor(np.ones((1, 1, 2, 2)))
    for error in (ValueError, TypeError):
        with pytest.raises(error, match=r"conv2d: padding must be an int or a tuple of 2 ints"):
            ng.conv2d(image, w, None, 1, (1, 1, 1))
    with pytest.raises(TypeError, match="conv2d: padding"):
        ng.conv2d(image, w, None, 1, (1, 0.5))
    rng = np.random.default_rng(0)
    for layer in (ng.nn.LayerNorm(4, rng=rng), ng.nn.GroupNorm(2, 4, rng=rng),
                  ng.nn.BatchNorm1d(4, rng=rng), ng.nn.BatchNorm2d(4, rng=rng)):
        assert isinstance(layer, ng.nn.Module)


@pytest.mark.parametrize("mode, torch_mode", [("reflect", "reflect"), ("edge", "replicate"),
                                              ("replicate", "replicate"), ("wrap", "circular"),
                                              ("circular", "circular")])
def test_pad_modes_match_torch(dev, mode, torch_mode):
    from conftest import matches_torch as match
    x = np.random.default_rng(4).normal(size=(2, 3, 4, 5))
    match(lambda a: ng.pad(a, ((0, 0), (0, 0), (1, 3), (4, 2)), mode=mode),
          lambda a: torch.nn.functional.pad(a, (4, 2, 1, 3), mode=torch_mode), [x], dev=dev,
          name=mode)


def test_pad_mode_limits():
    x = ng.tensor(np.ones((3, 4)))
    with pytest.raises(ValueError, match="pad: mode 'reflect' pads dim 0 of size 3 by at most 2"):
        ng.pad(x, ((3, 0), (0, 0)), mode="reflect")
    with pytest.raises(ValueError, match="pad: mode must be one of"):
        ng.pad(x, 1, mode="symmetric")


def test_meshgrid_and_the_mean_pairs_match_torch():
    a, b, c = (np.arange(n, dtype=np.float64) for n in (2, 3, 4))
    for indexing in ("ij", "xy"):
        got = ng.meshgrid(ng.tensor(a), ng.tensor(b), ng.tensor(c), indexing=indexing)
        want = torch.meshgrid(torch.tensor(a), torch.tensor(b), torch.tensor(c),
                              indexing=indexing)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.numpy(), w.numpy())
    p = ng.param(X)
    with ng.grad_tape():
        (v, m), (s, m2) = ng.var_mean(p, 1), ng.std_mean(p, dim=0, keepdim=True)
        loss = ng.sum(v) + ng.sum(m) + ng.sum(s) + ng.sum(m2)
    loss.backward()
    t = torch.tensor(X, requires_grad=True)
    (tv, tm), (ts, tm2) = torch.var_mean(t, 1), torch.std_mean(t, 0, keepdim=True)
    (tv.sum() + tm.sum() + ts.sum() + tm2.sum()).backward()
    for g, w in ((v, tv), (m, tm), (s, ts), (m2, tm2)):
        np.testing.assert_allclose(g.numpy(), w.detach().numpy(), rtol=1e-13)
    np.testing.assert_allclose(p.grad, t.grad.numpy(), rtol=1e-12)


def test_chunk_of_an_empty_dim_gives_every_part_and_repeats_take_a_tensor():
    """torch.chunk of a size-0 dim gives ``chunks`` empty parts (here: one);
    repeat_interleave takes an int64 tensor of counts, and one count for
    every element (here: an error)."""
    for shape, dim in (((0,), 0), ((2, 0), 1), ((0, 3), 0)):
        got = ng.chunk(ng.zeros(shape), 3, dim)
        want = torch.chunk(torch.zeros(shape), 3, dim)
        assert [tuple(t.shape) for t in got] == [tuple(t.shape) for t in want]
    x = np.arange(3.0)
    for reps in (ng.tensor([0, 2, 1]), [2], ng.tensor([3])):
        theirs = torch.tensor(reps.numpy()) if isinstance(reps, ng.Tensor) else torch.tensor(reps)
        np.testing.assert_array_equal(
            ng.repeat_interleave(ng.tensor(x), reps, 0).numpy(),
            torch.repeat_interleave(torch.tensor(x), theirs, 0).numpy())


def test_repeat_interleave_takes_a_0d_tensor_of_repeats():
    x = np.arange(6.0).reshape(3, 2)
    got = ng.repeat_interleave(ng.tensor(x), ng.tensor(np.array(2)), 0)
    np.testing.assert_array_equal(
        got.numpy(), torch.repeat_interleave(torch.tensor(x), torch.tensor(2), 0).numpy())
