"""The N-d paths that read operands in place: broadcasts that do not merge
into 2 dims (``binary_nd``), strided views (``unary_nd``), softmax along a
middle axis (``softmax3``), cross_entropy with positions (``cross_entropy3``),
an array index beside other keys (``index_select_nd``/``index_add_nd``) and
a gather with a smaller index (``gather_nd``/``scatter_add_nd``):
values and gradients against PyTorch (float64, 1e-9) on both devices, the
CUDA launch bound per op over one N-d graph, and ng.compile against eager."""
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import numbagrad as ng
from conftest import cuda_dev, cuda_launches, inputs, matches_torch

# broadcasts whose dims do not merge into 2 (rank 3 and 4 after merging)
NOT_2D = [((2, 1, 3, 1), (1, 4, 1, 5)), ((2, 1, 3), (4, 1)), ((3, 1, 2, 1), (2, 1, 2))]
BINARY = {"add": (ng.add, torch.add), "sub": (ng.sub, torch.sub), "mul": (ng.mul, torch.mul),
          "div": (lambda a, b: a / (b * b + 1.0), lambda a, b: a / (b * b + 1.0))}


def run(dev, f, g, shapes, seed=0):
    matches_torch(f, g, inputs(shapes, seed), dev, name=str(shapes))


@pytest.mark.parametrize("sa, sb", NOT_2D, ids=str)
def test_broadcasts_beyond_2d_like_torch(dev, sa, sb):
    for name, (f, g) in BINARY.items():
        run(dev, f, g, [sa, sb])
        run(dev, lambda a, b: f(b, a), lambda a, b: g(b, a), [sa, sb])


def test_strided_operands_are_read_through_their_strides(dev):
    # permuted and sliced views (views on the CPU; CUDA's shape ops copy first)
    run(dev, lambda a, b: a.permute(2, 0, 1) * b, lambda a, b: a.permute(2, 0, 1) * b,
        [(2, 3, 4), (4, 1, 3)])
    run(dev, lambda a, b: a[:, ::2, ::-1] - b.permute(1, 0, 2)[:, :2],
        lambda a, b: a[:, ::2].flip(2) - b.permute(1, 0, 2)[:, :2], [(2, 4, 3), (3, 2, 3)])
    run(dev, lambda x: ng.tanh(x.permute(2, 0, 1)) + ng.relu(x).permute(2, 0, 1) ** 2.0,
        lambda x: torch.tanh(x.permute(2, 0, 1)) + torch.relu(x).permute(2, 0, 1) ** 2.0,
        [(2, 3, 4)])
    run(dev, lambda x: ng.sigmoid(x[:, ::2]) * 3.0, lambda x: torch.sigmoid(x[:, ::2]) * 3.0,
        [(3, 4, 5)])
    run(dev, lambda x: ng.exp(x.permute(0, 2, 1, 3)[:, ::2]) / 2.0,
        lambda x: torch.exp(x.permute(0, 2, 1, 3)[:, ::2]) / 2.0, [(2, 2, 3, 2)])


def test_x_op_x_on_a_strided_view(dev):
    run(dev, lambda x: (lambda v: v * v)(x.permute(2, 0, 1)),
        lambda x: (lambda v: v * v)(x.permute(2, 0, 1)), [(2, 3, 4)])


@pytest.mark.parametrize("shape, axis", [((2, 3, 4), 1), ((2, 3, 2, 2), 1), ((2, 2, 3, 2), 2),
                                         ((2, 0, 3), 1), ((2, 1, 3), 1)], ids=str)
def test_softmax_along_a_middle_axis(dev, shape, axis):
    run(dev, lambda x: ng.softmax(x, axis), lambda x: torch.softmax(x, axis), [shape])
    run(dev, lambda x: ng.log_softmax(x, axis), lambda x: torch.log_softmax(x, axis), [shape])


@pytest.mark.parametrize("shape", [(2, 3, 4), (3, 2, 2, 3)], ids=str)
def test_cross_entropy_with_positions_in_place(dev, shape):
    labels = np.random.default_rng(2).integers(0, shape[1], size=(shape[0],) + shape[2:])
    for red in ("mean", "sum"):
        run(dev, lambda x: ng.cross_entropy(x * 1.0, labels, red),
            lambda x: F.cross_entropy(x * 1.0, torch.tensor(labels), reduction=red), [shape])
    # float32 at 1e-5
    x32 = np.random.default_rng(3).normal(size=shape).astype(np.float32)
    got = ng.cross_entropy(dev.tensor(x32), labels).item()
    want = F.cross_entropy(torch.tensor(x32), torch.tensor(labels)).item()
    assert got == pytest.approx(want, rel=1e-5)


IDX = np.array([[2, 0], [2, -1]])
INDEX_FORMS = [   # (id, shape, numbagrad key, the same in torch)
    ("int_adjacent", (2, 5, 3), (slice(None), 1, IDX), lambda t: t[:, 1, torch.tensor(IDX)]),
    # NumPy puts the index dims first when an int and the array stand apart (torch does not)
    ("int_apart", (2, 5, 3), (1, slice(None), np.array([0, 2, 2])),
     lambda t: t[1][:, torch.tensor([0, 2, 2])].T),
    ("strided", (4, 5, 3), (slice(None, None, 2), slice(1, None, 2), [2, 2, 0]),
     lambda t: t[::2, 1::2, torch.tensor([2, 2, 0])]),
    ("strided_middle", (3, 4, 2, 3), (slice(None, None, 2), IDX, slice(1, None)),
     lambda t: t[::2, torch.tensor(IDX), 1:]),
    ("strided_first_dims", (4, 3, 5, 6), (slice(None, None, 2), 1, slice(1, None, 2), [4, 0]),
     None),
]


@pytest.mark.parametrize("name, shape, key, g", INDEX_FORMS, ids=[f[0] for f in INDEX_FORMS])
def test_array_index_beside_other_keys_like_torch(dev, name, shape, key, g):
    if g is not None:
        run(dev, lambda x: x[key], g, [shape])
        return
    # (torch has no such form: against NumPy, the gradient by np.add.at)
    a = inputs([shape])[0]
    x = dev.param(a)
    w = np.random.default_rng(1).normal(size=a[key].shape)
    with ng.grad_tape():
        out = x[key]
        loss = (out * dev.tensor(w)).sum()
    np.testing.assert_array_equal(out.numpy(), a[key])
    want = np.zeros(shape)
    np.add.at(want, key, w)
    np.testing.assert_allclose(dev.host(ng.backward(loss)[x.id]), want, rtol=1e-12)


@pytest.mark.parametrize("shape, axis, ishape", [((4, 5, 3), 1, (2, 3, 2)),
                                                 ((3, 4, 2, 3), 1, (2, 2, 2, 2)),
                                                 ((3, 2, 4), 2, (3, 1, 4)),
                                                 ((2, 3, 4), 0, (3, 2, 3))], ids=str)
def test_gather_with_a_smaller_index_like_torch(dev, shape, axis, ishape):
    index = np.random.default_rng(4).integers(0, shape[axis], size=ishape)
    run(dev, lambda x: ng.gather(x, axis, index),
        lambda t: torch.gather(t, axis, torch.tensor(index)), [shape])


def test_devices_agree_bit_for_bit_on_broadcast_gradients():
    cuda = cuda_dev()
    a0, b0 = inputs([(2, 1, 3, 1), (1, 4, 1, 5)], seed=7)
    grads = []
    for dev in ("cpu", cuda.name):
        a, b = ng.param(a0, device=dev), ng.param(b0, device=dev)
        with ng.grad_tape():
            loss = ((a * b) / (b * b + 1.0) - a).sum()
        g = ng.backward(loss)
        grads.append([cuda.host(g[a.id]), cuda.host(g[b.id])])
    for got, want in zip(grads[1], grads[0]):
        np.testing.assert_array_equal(got, want)


def test_cuda_nd_graph_one_launch_per_op_forward_and_per_gradient():
    cuda = cuda_dev()
    rng = np.random.default_rng(0)
    x4 = cuda.param(rng.normal(size=(2, 1, 3, 1)))
    y4 = cuda.tensor(rng.normal(size=(1, 4, 1, 5)))
    x3 = cuda.param(rng.normal(size=(2, 3, 4)))
    labels = rng.integers(0, 3, size=(2, 4))
    others = [cuda.tensor(rng.normal(size=(2, 3, 4))), cuda.tensor(rng.normal(size=(2, 1, 4)))]
    # (op, x, launches forward, launches backward): one kernel each way
    bounds = [("broadcast add, rank 4", lambda t: t + y4, x4, 1, 1),
              ("broadcast mul, rank 4", lambda t: y4 * t, x4, 1, 1),
              ("tanh", ng.tanh, x3, 1, 1),
              ("softmax, axis 1 of 3", lambda t: ng.softmax(t, 1), x3, 1, 1),
              ("log_softmax, axis 1 of 3", lambda t: ng.log_softmax(t, 1), x3, 1, 1),
              ("cross_entropy with positions", lambda t: ng.cross_entropy(t, labels), x3, 1, 1),
              ("x[:, 1, idx]", lambda t: t[:, 1, np.array([0, 3, 3])], x3, 1, 1),
              ("x[:, 1:, idx]", lambda t: t[:, 1:, [2, 0]], x3, 1, 1),
              ("gather, a smaller index", lambda t: ng.gather(t, 1, np.zeros((1, 2, 3), int)),
               x3, 1, 1),
              # concatenate/stack: one concat per eight inputs forward, one read per gradient
              ("concatenate of 3", lambda t: ng.concatenate([t, others[0], others[1]], 1), x3,
               1, 1),
              ("stack of t three times", lambda t: ng.stack([t, t, t], 2), x3, 1, 3)]
    for name, f, x, forward, backward in bounds:
        assert cuda_launches(f, x) == (forward, backward), name
    # the permute of a strided result is its own op (one copy on CUDA), the unary one more
    assert cuda_launches(lambda t: ng.tanh(t.permute(2, 0, 1)), x3) == (1 + 1, 1)
    # both gradients of a broadcast binary op in one launch
    b4 = cuda.param(rng.normal(size=(1, 4, 1, 5)))
    with ng.grad_tape():
        out = x4 * b4
    before = ng.cuda.launch_count()
    out._node.backward(ng.tape._Backward.make(collect=True), out._node,
                       ng.kernels.get("cuda").from_host(np.ones(out.shape)))
    assert ng.cuda.launch_count() - before == 1


def test_cuda_rank_beyond_the_kernels_is_a_clear_error():
    cuda = cuda_dev()
    a = cuda.tensor(np.ones((2, 1, 2, 1, 2, 1, 2)))
    b = cuda.tensor(np.ones((1, 2, 1, 2, 1, 2, 1)))
    with pytest.raises(ValueError, match=r"binary_nd: arrays of rank 1 to 6 on cuda"):
        a + b
    # the CPU kernels take any rank
    matches_torch(ng.add, torch.add, inputs([(2, 1, 2, 1, 2, 1, 2), (1, 2, 1, 2, 1, 2, 1)]))


def test_nd_paths_compile_bit_identical_to_eager():
    rng = np.random.default_rng(0)
    x0, w0, v0 = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 1, 4)), rng.normal(size=(3, 1))
    labels = np.array([[0, 1, 2, 2], [2, 2, 1, 0]])

    def make():
        w, v = ng.param(w0), ng.param(v0)
        opt = ng.optim.Adam([w, v], lr=0.01)

        def step(x):
            h = ng.tanh(x)
            z = ng.softmax(h, axis=1) * w + v                  # softmax3, binary_nd twice
            return ng.cross_entropy(z, labels) + z[:, 1, [0, 2]].sum() \
                + z[:, 1:, [2, 0]].mean()                     # cross_entropy3, index_*_nd
        return w, v, opt, step

    w_e, v_e, opt_e, step_e = make()
    w_c, v_c, opt_c, step_c = make()
    compiled = ng.compile(step_c, optimizer=opt_c)
    for i in range(3):
        x = ng.tensor(x0 + i)
        with ng.grad_tape():
            loss = step_e(x)
        loss.backward()
        opt_e.step()
        with warnings.catch_warnings():
            warnings.simplefilter("error")     # a step that falls back to eager warns
            assert compiled(x).item() == loss.item()
    np.testing.assert_array_equal(w_c.numpy(), w_e.numpy())
    np.testing.assert_array_equal(v_c.numpy(), v_e.numpy())


def test_transposed_and_sliced_operands_share_one_block_per_dtype():
    # A block compiles its ~25 loops per operand type: the 2-D kernels hand
    # any non-C operand over as the read-only "A" view the N-d kernels'
    # broadcasts are, so F, A and N-d operands share one block, and the
    # values are NumPy's.
    from numba import types

    from numbagrad.kernels import codes
    from numbagrad.kernels.cpu import elementwise as E
    from numbagrad.kernels.cpu import strided as S
    rng = np.random.default_rng(3)
    base = rng.normal(size=(8, 8))
    out = np.empty((4, 6))
    for x in (base[:4, :6].T.copy().T, base.T[:4, :6], base[::2, ::-1][:, :6]):  # F, A, A
        E.unary(codes.MUL_S, x, out, 3.0, 1.0, 0.0)
        np.testing.assert_array_equal(out, x * 3.0)
        E.binary(codes.SUB, x, base[:4, :6].copy(), out)
        np.testing.assert_array_equal(out, x - base[:4, :6])
    # (rank 6: what the ops hand the N-d kernels for ranks 3 to 6)
    x3 = base[:6, :6].reshape(1, 1, 1, 2, 3, 6).transpose(0, 1, 2, 3, 5, 4)
    o3 = np.empty((1, 1, 1, 2, 6, 3))
    S.unary_nd(codes.MUL_S, x3, o3, 3.0, 1.0, 0.0)
    np.testing.assert_array_equal(o3, x3 * 3.0)
    S.binary_nd(codes.SUB, x3, x3.copy(), o3)
    np.testing.assert_array_equal(o3, 0.0)
    any_view = types.Array(types.float64, 2, "A", readonly=True)
    # what the 2-D kernels hand their blocks (typed afresh here: a kernel loaded
    # from Numba's disk cache never compiles its blocks in this process)
    from numba import njit

    @njit
    def handed(x, y):
        return E._one_layout((x, y))
    for x in (base[:4, :6].T.copy().T, base.T[:4, :6], base[::2, ::-1][:, :6]):
        handed(x, base[:4, :6].copy())
    for sig in handed.nopython_signatures:
        assert tuple(sig.return_type) == (any_view, any_view), sig
    for block, operands in ((E._unary_block, 1), (E._binary_block, 2)):
        strided = {sig[1:1 + operands] for sig in block.signatures
                   if sig[1].dtype == types.float64
                   and any(a.layout != "C" for a in sig[1:1 + operands])}
        # (empty when the kernels came from the disk cache)
        assert strided <= {(any_view,) * operands}, (block, strided)


def test_cpu_nd_ops_of_ranks_3_to_6_run_one_rank_6_kernel():
    # the leading 1s change no element and no order; one compile serves them
    from conftest import KernelNames

    from numbagrad import kernels

    class Ranks(KernelNames):
        def kernel(self, fn, name, args):
            if name.split("_mt")[0] in ("unary_nd", "binary_nd", "unary_nd_backward",
                                        "binary_nd_backward"):
                self.names.append((name, {a.ndim for a in args if isinstance(a, np.ndarray)}))

    seen = Ranks()
    with kernels.observe(seen):
        for sa, sb in (((2, 1, 3), (4, 1)), ((2, 1, 3, 1), (1, 4, 1, 5)),
                       ((2, 3, 1, 2, 1), (3, 2, 2, 1))):
            a, b = ng.param(np.ones(sa)), ng.param(np.ones(sb))
            with ng.grad_tape():
                loss = (ng.exp(a.permute(*reversed(range(len(sa))))).sum() + (a * b).sum())
            ng.backward(loss)
    assert {name for name, _ in seen.names} >= {"binary_nd", "binary_nd_backward"}
    assert all(ranks == {6} for _, ranks in seen.names), seen.names
