"""PyTorch's tensor habits (issue 35): in-place ops and ``.data`` writes with
the version-counter refusal, detach/clone/to(dtype), size(dim), numel,
tolist, ng.no_grad inside a tape, boolean-mask indexing, ``__array__``
sharing memory, and the default dtype of tensors built from Python numbers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import numbagrad as ng
from conftest import Dev


def rng_array(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


# ------------------------------------------------------------ sizes and lists
def test_size_is_numpys_count_and_pytorchs_call():
    t = ng.tensor(np.zeros((2, 3, 4)))
    tt = torch.zeros(2, 3, 4)
    assert t.size == 24 and isinstance(t.size, int) and t.size + 1 == 25
    assert t.size() == tuple(tt.size()) and t.size(-1) == tt.size(-1) == 4
    assert t.size(1) == tt.size(1) and t.numel() == tt.numel() and t.dim() == tt.dim()
    with pytest.raises(np.exceptions.AxisError, match="size\\(3\\)"):
        t.size(3)
    assert ng.tensor(rng_array(2, 2)).tolist() == rng_array(2, 2).tolist()
    assert ng.tensor(2.5).tolist() == 2.5


def test_array_shares_memory_on_cpu():
    t = ng.tensor(np.arange(4.0))
    a = np.asarray(t)
    assert np.shares_memory(a, t.data)
    a[0] = 7.0
    assert t.numpy()[0] == 7.0
    assert not np.shares_memory(t.numpy(), t.data)   # numpy() stays a copy


# ------------------------------------------------------------ .data
def test_data_update_after_backward_writes_the_param(dev: Dev):
    """The issue's habit: ``p.data += -lr * p.grad`` once the gradient is in."""
    x, y = rng_array(4, 3), rng_array(4, 2, seed=1)
    W = dev.param(rng_array(3, 2, seed=2))
    before = W.numpy()
    with ng.grad_tape():
        loss = ng.mse_loss(ng.tensor(x, device=dev.name) @ W, ng.tensor(y, device=dev.name))
    loss.backward()
    grad = dev.host(W.grad)
    if dev.name == "cpu":
        W.data += -0.1 * W.grad
    else:
        W.data = ng.tensor(before - 0.1 * grad, device="cuda")
    tw = torch.tensor(before, requires_grad=True)
    torch.nn.functional.mse_loss(torch.tensor(x) @ tw, torch.tensor(y)).backward()
    with torch.no_grad():
        tw.data += -0.1 * tw.grad
    np.testing.assert_allclose(W.numpy(), tw.detach().numpy(), rtol=1e-12)
    assert W.is_param


def test_data_assignment_casts_and_refuses_other_shapes(dev: Dev):
    W = dev.param(np.zeros((2, 3)), dtype=np.float32)
    W.data = np.arange(6.0).reshape(2, 3)     # float64 values into float32
    np.testing.assert_array_equal(W.numpy(), np.arange(6.0, dtype=np.float32).reshape(2, 3))
    assert W.dtype == np.float32
    with pytest.raises(ValueError, match=r"shape \(4,\) does not broadcast to .*\(2, 3\)"):
        W.data = np.ones(4)
    np.testing.assert_array_equal(W.numpy(), np.arange(6.0).reshape(2, 3))


# ------------------------------------------------------------ in-place methods
IN_PLACE = [
    ("add_", lambda t, o: t.add_(o), lambda t, o: t.add_(o)),
    ("add_ alpha", lambda t, o: t.add_(o, alpha=-0.5), lambda t, o: t.add_(o, alpha=-0.5)),
    ("sub_", lambda t, o: t.sub_(o), lambda t, o: t.sub_(o)),
    ("mul_", lambda t, o: t.mul_(o), lambda t, o: t.mul_(o)),
    ("div_", lambda t, o: t.div_(o), lambda t, o: t.div_(o)),
    ("clamp_", lambda t, o: t.clamp_(-0.3, 0.4), lambda t, o: t.clamp_(-0.3, 0.4)),
    ("fill_", lambda t, o: t.fill_(1.5), lambda t, o: t.fill_(1.5)),
    ("zero_", lambda t, o: t.zero_(), lambda t, o: t.zero_()),
    ("copy_", lambda t, o: t.copy_(o), lambda t, o: t.copy_(o)),
]


@pytest.mark.parametrize("name,ours,theirs", IN_PLACE, ids=[c[0] for c in IN_PLACE])
def test_in_place_methods_match_torch(dev: Dev, name, ours, theirs):
    a, b = rng_array(2, 3), rng_array(3, seed=1)      # b broadcasts into a's shape
    for make in (dev.tensor, dev.param):
        t = make(a)
        kept = t.data
        out = ours(t, dev.tensor(b))
        ref = theirs(torch.tensor(a), torch.tensor(b))
        assert out is t and t.data is kept           # the same tensor, the same array
        np.testing.assert_allclose(t.numpy(), ref.numpy(), rtol=1e-15, atol=0)


def test_augmented_assignment_is_in_place_outside_a_tape(dev: Dev):
    W = dev.param(np.ones(3))
    alias = W
    W += 1
    W *= dev.tensor(np.array([1.0, 2.0, 3.0]))
    W -= 0.5
    W /= 2
    assert W is alias and W.is_param
    np.testing.assert_allclose(alias.numpy(), (np.array([2.0, 4.0, 6.0]) - 0.5) / 2)


def test_setitem_follows_numpy(dev: Dev):
    a = rng_array(3, 4)
    t, ref = dev.tensor(a), a.copy()
    t[0] = 5.0
    ref[0] = 5.0
    t[1, 1:3] = dev.tensor(np.array([7.0, 8.0]))
    ref[1, 1:3] = [7.0, 8.0]
    t[..., -1] = np.arange(3.0)
    ref[..., -1] = np.arange(3.0)
    np.testing.assert_array_equal(t.numpy(), ref)
    if dev.name == "cpu":
        t[t > 1.0] = 0.0
        ref[ref > 1.0] = 0.0
        t[[0, 2]] = -1.0
        ref[[0, 2]] = -1.0
        np.testing.assert_array_equal(t.numpy(), ref)
    else:
        with pytest.raises(TypeError, match="integers and slices only"):
            t[np.array([0, 2])] = -1.0
        np.testing.assert_array_equal(t.numpy(), ref)


def test_setitem_refuses_a_shape_that_does_not_broadcast():
    t = ng.tensor(np.zeros((2, 3)))
    with pytest.raises(ValueError):
        t[0] = np.ones(4)
    np.testing.assert_array_equal(t.numpy(), np.zeros((2, 3)))


# ------------------------------------------------------------ refusals
def test_in_place_on_a_param_inside_a_tape_is_refused_before_writing(dev: Dev):
    W = dev.param(np.ones(3))
    with ng.grad_tape():
        for write in (lambda: W.add_(1.0), lambda: W.zero_(), lambda: W.copy_(np.zeros(3)),
                      lambda: W.__setitem__(0, 2.0)):
            with pytest.raises(RuntimeError, match="on a param .* inside ng.grad_tape"):
                write()
        with pytest.raises(RuntimeError, match="on a param"):
            W += 1
        with ng.no_grad():
            W.add_(1.0)       # allowed: nothing records inside no_grad
    np.testing.assert_array_equal(W.numpy(), np.full(3, 2.0))


def test_in_place_on_a_recorded_tensor_is_refused(dev: Dev):
    W = dev.param(np.ones(3))
    with ng.grad_tape():
        y = W.tanh()
        for write in (lambda: y.mul_(2.0), lambda: y.__setitem__(0, 0.0),
                      lambda: y.detach().zero_()):
            with pytest.raises(RuntimeError, match="output of a recorded op"):
                write()
        loss = y.sum()
    loss.backward()
    np.testing.assert_allclose(dev.host(W.grad), 1 - np.tanh(1.0) ** 2)
    y.detach().zero_()     # the graph has run: writing it is the user's business
    assert not y.numpy().any()


def test_in_place_on_a_constant_with_a_recorded_operand_is_refused():
    W = ng.param(np.ones(3))
    c = ng.tensor(np.zeros(3))
    with ng.grad_tape():
        with pytest.raises(RuntimeError, match="operand needs a gradient"):
            c.add_(W * 2)
        c.add_(1.0)    # a constant operand: fine inside the tape too
    np.testing.assert_array_equal(c.numpy(), np.ones(3))


def test_augmented_assignment_on_recorded_values_rebinds_like_pytorchs_result():
    """``loss += reg`` inside a tape: the value and gradients PyTorch gives."""
    a = rng_array(3)
    W = ng.param(a)
    tw = torch.tensor(a, requires_grad=True)
    with ng.grad_tape():
        loss = (W * W).sum()
        loss += W.sum()
        total = ng.tensor(0.0)
        total += loss          # a constant and a recorded operand: rebinds too
    tl = (tw * tw).sum()
    tl += tw.sum()
    total.backward()
    tl.backward()
    np.testing.assert_allclose(W.grad, tw.grad.numpy(), rtol=1e-15)
    np.testing.assert_allclose(total.item(), tl.item(), rtol=1e-15)


def test_backward_refuses_an_input_written_after_it_was_recorded(dev: Dev):
    """PyTorch's version-counter error: no gradient is written."""
    W = dev.param(np.ones(3))
    c = dev.tensor(np.array([1.0, 2.0, 3.0]))
    with ng.grad_tape():
        loss = (W * c).sum()
    c.mul_(10.0)
    with pytest.raises(RuntimeError, match="modified in place after it was recorded"):
        loss.backward()
    assert W.grad is None
    with ng.grad_tape():    # recorded again after the write: fine
        loss = (W * c).sum()
    loss.backward()
    np.testing.assert_allclose(dev.host(W.grad), [10.0, 20.0, 30.0])


def test_backward_refuses_a_param_written_through_its_data_or_a_detach():
    for write in (lambda W: setattr(W, "data", np.zeros(3)), lambda W: W.detach().add_(1.0),
                  lambda W: W.add_(1.0)):
        W = ng.param(np.ones(3))
        with ng.grad_tape():
            loss = (W * W).sum()
        write(W)
        with pytest.raises(RuntimeError, match="modified in place"):
            ng.backward(loss)
        assert W.grad is None


def _refused_then_recorded_again(record, write, check=None):
    """``record()`` -> a loss; ``write()`` between it and its backward must
    make the backward refuse before any gradient is written; a loss recorded
    again after the write runs (and ``check`` reads what it gave)."""
    loss, params = record()
    write()
    with pytest.raises(RuntimeError, match="modified in place after it was recorded"):
        loss.backward()
    assert all(p.grad is None for p in params)
    loss, _ = record()
    loss.backward()
    if check is not None:
        check()


def test_backward_refuses_params_an_optimizer_update_wrote(dev: Dev):
    """PyTorch: opt.step() between a forward and its backward is a version
    error (the backward would use the new weights)."""
    W, x = dev.param(rng_array(3, 4)), dev.param(np.ones((4, 2)))
    opt = ng.optim.SGD([W], lr=0.1, accumulate_steps=2)

    def record():
        with ng.grad_tape():
            return ng.sum(ng.matmul(W, x)), (x,)
    for _ in range(2):                   # the second step applies the update
        record()[0].backward()
        opt.step()
    x.grad = None
    loss, _ = record()
    record()[0].backward()
    assert opt.step() is False           # counts a micro-step, writes nothing
    loss.backward()                      # so the first graph still runs
    x.grad = None
    _refused_then_recorded_again(record, lambda: opt.step() or opt.step())


def test_backward_refuses_params_load_state_dict_wrote(dev: Dev):
    lin = ng.nn.Linear(4, 3, device=dev.name)
    x = dev.param(np.ones((2, 4)))

    def record():
        with ng.grad_tape():
            return ng.sum(lin(x)), (x,)
    doubled = {k: 2 * v for k, v in lin.state_dict().items()}
    _refused_then_recorded_again(
        record, lambda: lin.load_state_dict(doubled),
        lambda: np.testing.assert_allclose(
            dev.host(x.grad), np.tile(doubled["weight"].sum(axis=0), (2, 1)), rtol=1e-6))


@pytest.mark.parametrize("how", ["detach", "view", "sibling view", "view of a view"])
def test_backward_refuses_an_input_whose_data_was_written_through_another_tensor(
        dev: Dev, how: str):
    """A view and a detach() share their base's writes (PyTorch's shared
    version counter), whether made inside or outside the tape."""
    base = dev.tensor(np.ones((6, 4)))
    q = dev.param(np.ones((4, 5)))
    read, write = {"detach": (lambda: base.detach(), lambda: base.add_(1.0)),
                   "view": (lambda: base[0:3], lambda: base.add_(1.0)),
                   "sibling view": (lambda: base[3:6], lambda: base[0:3].mul_(2.0)),
                   "view of a view": (lambda: base.T.T[1:4],
                                      lambda: base.detach().sub_(1.0))}[how]
    held = read()

    def record():
        with ng.grad_tape():
            return ng.sum(ng.matmul(held[0:3], q)), (q,)
    _refused_then_recorded_again(record, write)


def test_backward_refuses_an_input_nn_init_wrote_through_a_view():
    W = ng.param(np.ones((2, 3)))
    x = ng.param(np.ones((3, 2)))
    with ng.grad_tape():
        loss = ng.sum(ng.matmul(W, x))
    ng.nn.init.zeros_(W[0])
    with pytest.raises(RuntimeError, match="modified in place after it was recorded"):
        loss.backward()


def test_backward_refuses_a_constant_a_checkpoint_reads_again():
    """A checkpointed segment runs again for the backward: its input batch,
    written in between, is refused as any recorded op's input is."""
    W = ng.param(np.eye(2))
    for write in (lambda x: x.add_(1.0), lambda x: x.detach().add_(1.0),
                  lambda x: ng.reshape(x, (4,)).mul_(2.0)):
        x = ng.tensor(np.ones((2, 2)))
        with ng.grad_tape():
            loss = ng.sum(ng.checkpoint(lambda v: ng.matmul(v, W), x))
        write(x)
        with pytest.raises(RuntimeError, match="modified in place after it was recorded"):
            loss.backward()
        assert W.grad is None


def test_a_view_carried_across_steps_does_not_keep_their_graphs():
    """A consumed graph is freed though a view of its output (whose base is
    that output) lives on: the recurrent-state pattern keeps no history."""
    import gc
    import weakref
    W = ng.param(np.eye(3) * 0.5)
    h = ng.tensor(np.ones((1, 3)))
    products = []
    for _ in range(5):
        with ng.grad_tape():
            product = ng.matmul(h, W)
            out = ng.tanh(product)
            loss = ng.sum(out)
        loss.backward()
        with ng.no_grad():
            h = ng.reshape(out, (1, 3))          # a view of out, carried on
        products.append(weakref.ref(product))
        del product, out, loss
    gc.collect()
    assert [r() is None for r in products] == [True] * 5
    chain = ng.reshape(ng.reshape(ng.reshape(h, (3,)), (1, 3)), (3, 1))
    assert chain._base is h._base                # one link to the root


def test_a_copy_does_not_share_its_source_writes(dev: Dev):
    """reshape of a strided tensor copies: writing the source later leaves the copy's graph alone."""
    base = dev.tensor(np.ones((4, 3)))
    q = dev.param(np.ones((4, 5)))
    flat = ng.reshape(base.T, (12,))             # a copy (base.T is strided)
    with ng.grad_tape():
        loss = ng.sum(ng.matmul(ng.reshape(flat, (3, 4)), q))
    base.add_(1.0)
    loss.backward()
    np.testing.assert_array_equal(dev.host(q.grad), np.full((4, 5), 3.0))


# ------------------------------------------------------------ detach, clone, to
def test_detach_shares_data_and_leaves_the_graph(dev: Dev):
    W = dev.param(rng_array(3))
    with ng.grad_tape():
        d = W.detach()
        loss = (W * d).sum()
    assert not d.requires_grad and d.is_leaf and dev.host(d.data) is not None
    assert Dev.address(d.data) == Dev.address(W.data)
    loss.backward()
    np.testing.assert_allclose(dev.host(W.grad), W.numpy())   # d counts as a constant


def test_clone_is_a_recorded_copy(dev: Dev):
    a = rng_array(2, 3)
    W = dev.param(a)
    with ng.grad_tape():
        c = W.clone()
        loss = (c * c).sum()
    assert Dev.address(c.data) != Dev.address(W.data) and c.requires_grad
    loss.backward()
    np.testing.assert_allclose(dev.host(W.grad), 2 * a)
    m = dev.tensor(a) > 0
    assert m.clone().dtype == np.bool_ and (m.clone().numpy() == m.numpy()).all()


def test_to_dtype_float_and_double(dev: Dev):
    a = rng_array(3)
    W = dev.param(a)
    with ng.grad_tape():
        f = W.float()
        loss = (f * f).sum()
    assert f.dtype == np.float32 and W.double() is W and W.to(np.float64) is W
    loss.backward()
    assert W.grad.dtype == np.float64
    np.testing.assert_allclose(dev.host(W.grad), 2 * a.astype(np.float32), rtol=1e-6)
    assert W.to(dtype=np.float32).dtype == np.float32
    assert W.to(f).dtype == np.float32 and W.to(f).device == dev.name
    c = W.to(dev.name, np.float32, copy=True)
    assert c.dtype == np.float32
    assert W.to(copy=True) is not W and (W.to(copy=True).numpy() == a).all()
    with pytest.raises(TypeError, match="two devices"):
        W.to("cpu", "cuda")


def test_to_another_device_and_back():
    pytest.importorskip("numba.cuda")
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    a = rng_array(3)
    t = ng.tensor(a).to("cuda", np.float32)
    assert t.device == "cuda" and t.dtype == np.float32
    back = t.to("cpu")
    np.testing.assert_array_equal(back.numpy(), a.astype(np.float32))


# ------------------------------------------------------------ no_grad
def test_no_grad_pauses_a_tape():
    W = ng.param(np.ones(2))
    with ng.grad_tape():
        assert ng.is_grad_enabled()
        with ng.no_grad():
            assert not ng.is_grad_enabled()
            p = W * 3
            with ng.grad_tape():       # PyTorch's enable_grad inside no_grad
                q = W * 4
            assert not ng.is_grad_enabled()
        r = W * 5
        assert ng.is_grad_enabled()
    assert not ng.is_grad_enabled()
    assert (p.requires_grad, q.requires_grad, r.requires_grad) == (False, True, True)

    @ng.no_grad()
    def plain(x):
        return x * 2

    with ng.grad_tape():
        assert not plain(W).requires_grad
        assert (W * 2).requires_grad


def test_no_grad_restores_the_tape_after_an_exception():
    with ng.grad_tape():
        with pytest.raises(ZeroDivisionError):
            with ng.no_grad():
                1 / 0
        assert ng.is_grad_enabled()


# ------------------------------------------------------------ boolean masks
@pytest.mark.parametrize("kind", ["tensor", "numpy", "list", "leading", "empty"])
def test_boolean_mask_indexing_matches_torch(dev: Dev, kind):
    a = rng_array(3, 4)
    W = dev.param(a)
    tw = torch.tensor(a, requires_grad=True)
    if kind == "leading":
        mask = np.array([True, False, True])
    elif kind == "empty":
        mask = np.zeros((3, 4), bool)
    else:
        mask = a > 0.1
    key = {"tensor": lambda: W > 0.1, "list": lambda: mask.tolist()}.get(kind, lambda: mask)
    weights = rng_array(*np.asarray(a[mask]).shape, seed=3)
    with ng.grad_tape():
        got = W[key()]
        loss = (got * dev.tensor(weights)).sum() if got.size else got.sum()
    ref = tw[torch.tensor(mask)]
    np.testing.assert_array_equal(got.numpy(), ref.detach().numpy())
    (ref * torch.tensor(weights)).sum().backward()
    if got.size:
        loss.backward()
        np.testing.assert_allclose(dev.host(W.grad), tw.grad.numpy(), rtol=1e-15)


def test_boolean_mask_of_the_wrong_shape_is_an_index_error():
    x = ng.tensor(np.zeros((3, 4)))
    with pytest.raises(IndexError, match=r"mask of shape \(4,\)"):
        x[np.ones(4, bool)]


# ------------------------------------------------------------ default dtype
@pytest.fixture
def default_float32():
    ng.set_default_dtype(np.float32)
    yield
    ng.set_default_dtype(np.float64)


def test_default_dtype_applies_to_python_numbers(default_float32):
    assert ng.get_default_dtype() == np.float32
    assert ng.tensor([1.0, 2.0]).dtype == np.float32
    assert ng.param(3.0).dtype == np.float32
    assert ng.tensor(np.arange(3)).dtype == np.int64             # integers stay integers
    assert ng.param(np.arange(3)).dtype == np.float32            # a param is a float
    assert (ng.tensor([1, 2]) * 0.5).dtype == np.float32          # an int tensor and a float
    assert ng.tensor(np.zeros(2)).dtype == np.float64            # a float array keeps its own
    assert ng.tensor(np.float64(2.0)).dtype == np.float64
    assert ng.tensor([1.0], dtype=np.float64).dtype == np.float64
    x64 = ng.tensor(np.ones(2))
    assert (x64 + [1.0, 2.0]).dtype == np.float64   # an operand list does not convert x


def test_default_dtype_is_float64_until_set():
    assert ng.get_default_dtype() == np.float64
    assert ng.tensor([1.0]).dtype == np.float64


def test_in_place_writes_inside_a_compiled_function_are_refused():
    W = ng.param(np.ones(3))
    c = ng.tensor(np.zeros(3))
    opt = ng.optim.SGD([W], lr=0.1)

    def step(x):
        c.add_(1.0)
        with ng.grad_tape():
            loss = (W * x).sum()
        loss.backward()
        opt.step()
        return loss

    compiled = ng.compile(step)
    with pytest.raises(RuntimeError, match="not replayed by the compiled step"):
        compiled(ng.tensor(np.ones(3)))
    assert not c.numpy().any()


def test_backward_refuses_a_condition_written_after_where_read_it(dev: Dev):
    """``where``'s (and so ``masked_fill``'s) condition tensor counts as an
    input of the recorded op: written in place before the backward, the
    backward is refused (PyTorch's version check) rather than route the
    gradient by the new mask."""
    p = dev.param(np.ones(4))
    m = dev.tensor(np.array([True, False, True, False]))
    with ng.grad_tape():
        loss = ng.sum(ng.where(m, p, 0.0))
    m.fill_(True)
    with pytest.raises(RuntimeError, match="modified in place after it was recorded"):
        loss.backward()
    with ng.grad_tape():
        loss = ng.sum(ng.masked_fill(p, m, 0.0))
    loss.backward()
    np.testing.assert_array_equal(dev.host(p.grad), np.zeros(4))


INDEXED_READS = {
    "x[idx]": lambda p, i: ng.sum(p[i]),
    "gather": lambda p, i: ng.sum(ng.gather(p, 0, ng.reshape(i, (2, 1)) if isinstance(
        i, ng.Tensor) else i.reshape(2, 1)) * np.array([[1.0], [2.0]])),
    "embedding": lambda p, i: ng.sum(ng.embedding(i, p)),
}


@pytest.mark.parametrize("kind", ["ndarray", "tensor"])
@pytest.mark.parametrize("op", sorted(INDEXED_READS))
def test_indices_written_before_the_backward_do_not_move_the_gradient(op: str, kind: str):
    """The backward of an indexing op reads its indices again: a caller's
    index array (or int64 tensor) written between the forward and the
    backward moved the gradient to the new rows. The recorded op keeps its
    own copy, so the gradient is the recorded forward's."""
    idx = np.array([0, 1])
    index = idx if kind == "ndarray" else ng.tensor(idx)
    p = ng.param(np.ones((5, 1)))
    with ng.grad_tape():
        loss = INDEXED_READS[op](p, index)
    want = torch.ones((5, 1), dtype=torch.float64, requires_grad=True)
    torch_loss = {"x[idx]": lambda: want[torch.tensor(idx)].sum(),
                  "gather": lambda: (torch.gather(want, 0, torch.tensor(idx).reshape(2, 1))
                                     * torch.tensor([[1.0], [2.0]], dtype=torch.float64)).sum(),
                  "embedding": lambda: torch.nn.functional.embedding(torch.tensor(idx),
                                                                     want).sum()}[op]()
    torch_loss.backward()
    if kind == "ndarray":
        idx[:] = [3, 4]
    else:
        index.add_(3)
    loss.backward()
    np.testing.assert_array_equal(p.grad, want.grad.numpy())


def test_writes_into_a_broadcast_view_are_refused():
    """An expanded view's elements share memory: a write kept whichever
    element came last (PyTorch refuses it too). (On CUDA a strided view is
    a copy.)"""
    c = ng.tensor(np.arange(3.0))
    e = c.expand(2, 3)
    for write in (lambda: e.add_(1.0), lambda: e.__setitem__((0, 0), 100.0),
                  lambda: ng.broadcast_to(c, (4, 3)).mul_(2.0)):
        with pytest.raises(RuntimeError, match="broadcast view"):
            write()
    np.testing.assert_array_equal(c.numpy(), np.arange(3.0))
    c[None].add_(1.0)       # a size-1 dim shares no element
    np.testing.assert_array_equal(c.numpy(), np.arange(3.0) + 1)


def test_nll_loss_labels_written_before_the_backward_do_not_move_the_gradient():
    """nll_loss's backward reads its labels again: it keeps its own copy."""
    logp = ng.param(np.arange(12.0).reshape(3, 4))
    labels = np.array([1, 2, 3])
    with ng.grad_tape():
        loss = ng.nll_loss(logp, labels)
    labels[...] = 0
    loss.backward()
    want = np.zeros((3, 4))
    want[[0, 1, 2], [1, 2, 3]] = -1.0 / 3
    np.testing.assert_array_equal(logp.grad, want)
