"""N-d ``matmul`` (``@``) and ``linear``: against PyTorch (float64, 1e-9, value and
every input's gradient), finite differences on both devices, transposed views
read without a copy, in-place accumulation, CUDA launch counts, errors, and
``ng.compile`` bit-identity."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import numbagrad as ng
from numbagrad import kernels
from conftest import inputs, matches_torch

MATMUL = [   # (shape of a, shape of b): ranks 1 to 5, broadcast batch dims, size 0 and 1
    ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (4,)), ((4,), (2, 4, 5)),
    ((3, 4), (2, 4, 5)), ((2, 1, 3, 4), (3, 4, 2)), ((2, 3, 2, 4), (2, 3, 4, 3)),
    ((1, 2, 1, 3, 4), (2, 1, 3, 4, 2)), ((2, 1, 3, 2, 4), (1, 3, 1, 4, 2)),
    ((2, 1, 3, 4), (1, 2, 4, 1)), ((1, 1, 4), (4, 2)), ((4,), (1, 4, 1)),
    ((0, 3, 4), (4, 2)), ((2, 0, 4), (2, 4, 3)), ((2, 3, 0), (2, 0, 2)),
    ((1, 3, 4), (0, 4, 2)), ((0, 1, 3, 4), (2, 4, 2)), ((4,), (4,)), ((3, 4), (4, 2)),
]
LINEAR = [   # (input shape, activation)
    ((2, 3, 4), None), ((2, 1, 2, 3, 4), "tanh"), ((3, 2, 4), "relu"), ((4,), None),
    ((0, 2, 4), None), ((2, 0, 4), "sigmoid"), ((1, 1, 4), None),
]


def loss_of(out, weights):
    """sum(out * weights) through ops every rank supports."""
    return (out.reshape(-1) * weights.reshape(-1)).sum()


@pytest.mark.parametrize("sa, sb", MATMUL, ids=[f"{a}@{b}" for a, b in MATMUL])
def test_matmul_matches_torch(sa, sb):
    matches_torch(lambda a, b: a @ b, torch.matmul, inputs([sa, sb]), name=f"{sa} @ {sb}")


@pytest.mark.parametrize("sx, act", LINEAR, ids=[f"{s}-{a}" for s, a in LINEAR])
def test_linear_matches_torch(sx, act):
    def torch_linear(x, w, b):
        y = F.linear(x, w, b)
        return y if act is None else getattr(torch, act)(y)
    matches_torch(lambda x, w, b: ng.linear(x, w, b, act), torch_linear,
                  inputs([sx, (3, 4), (3,)]), name=f"linear{sx}")


def swapped(p):
    """A leaf that is ``p``'s data with its last two dims swapped: a strided
    view, as ``x.mT`` gives."""
    return ng.Tensor(p._data.transpose(tuple(range(p.ndim - 2)) + (p.ndim - 1, p.ndim - 2)),
                     p._kern, requires_grad=True)


class Calls:
    """Records the kernels run and the work arrays taken."""

    def __init__(self):
        self.kernels, self.args, self.taken = [], [], 0

    def kernel(self, fn, name, args):
        self.kernels.append(name)
        self.args.append(args)

    def allocated(self, array):
        pass

    def temp(self, kern, shape, dtype):
        self.taken += 1

    def host_read(self):
        pass

    def host_copy(self, copy, source):
        pass


TRANSPOSED = [((2, 4, 3), (2, 4, 5), True, False), ((2, 3, 4), (2, 5, 4), False, True),
              ((2, 2, 4, 3), (2, 5, 4), True, True), ((3, 4), (2, 5, 4), False, True),
              ((2, 2, 4, 3), (4, 2), True, False), ((2, 3, 4), (5, 4), False, True)]


@pytest.mark.parametrize("sa, sb, swap_a, swap_b", TRANSPOSED)
def test_transposed_views_are_read_through_the_flags_not_copied(sa, sb, swap_a, swap_b):
    arrays = inputs([sa, sb], seed=3)
    base = [ng.param(a) for a in arrays]
    a, b = (swapped(p) if s else p for p, s in zip(base, (swap_a, swap_b)))
    ta, tb = (torch.tensor(x, requires_grad=True) for x in arrays)
    want = (ta.mT if swap_a else ta) @ (tb.mT if swap_b else tb)
    with ng.grad_tape(), kernels.observe(Calls()) as calls:
        out = a @ b
    # a stack times a matrix is one 2-D GEMM of the stack's rows
    assert calls.kernels == ["gemm" if len(sb) == 2 and not swap_a else "bgemm"], calls.kernels
    a3, b3 = calls.args[0][:2]
    for view, seen, flag, s in ((a, a3, calls.args[0][3], swap_a),
                                (b, b3, calls.args[0][4], swap_b)):
        assert flag == s and np.shares_memory(seen, view._data)
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12)
    weights = np.random.default_rng(1).normal(size=out.shape)
    with ng.grad_tape():
        loss = loss_of(a @ b, ng.tensor(weights))
    grads = ng.backward(loss)
    (want * torch.tensor(weights)).sum().backward()
    for p, t, s in ((a, ta, swap_a), (b, tb, swap_b)):
        got = grads[p.id]
        np.testing.assert_allclose(np.swapaxes(got, -1, -2) if s else got, t.grad.numpy(),
                                   rtol=1e-9, atol=1e-12)


GRADCHECK = [((2, 2, 3), (2, 3, 2)), ((2, 2, 3), (3, 2)), ((3,), (2, 3, 2)),
             ((2, 1, 1, 3), (3, 3, 2)), ((2, 1, 2, 1, 2), (1, 2, 1, 2, 2)), ((0, 2, 3), (3, 2))]


@pytest.mark.parametrize("sa, sb", GRADCHECK, ids=[f"{a}@{b}" for a, b in GRADCHECK])
def test_matmul_gradcheck(dev, sa, sb):
    ps = [dev.param(x) for x in inputs([sa, sb], seed=2)]
    weights = dev.tensor(np.random.default_rng(3).normal(size=(ps[0] @ ps[1]).shape))
    ng.gradcheck(lambda: loss_of(ps[0] @ ps[1], weights), ps,
                 directions=None if dev.name == "cpu" else 2)


@pytest.mark.parametrize("sa, sb, swap_a, swap_b", TRANSPOSED[1:3])
def test_transposed_views_match_torch_on_both_devices(dev, sa, sb, swap_a, swap_b):
    """(finite differences would write into the view: a strided device
    array cannot be uploaded to)"""
    arrays = inputs([sa, sb], seed=5)
    a, b = (swapped(dev.param(x)) if s else dev.param(x)
            for x, s in zip(arrays, (swap_a, swap_b)))
    ta, tb = (torch.tensor(x, requires_grad=True) for x in arrays)
    want = (ta.mT if swap_a else ta) @ (tb.mT if swap_b else tb)
    weights = np.random.default_rng(1).normal(size=tuple(want.shape))
    with ng.grad_tape():
        out = a @ b
        loss = loss_of(out, dev.tensor(weights))
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12)
    grads = ng.backward(loss)
    (want * torch.tensor(weights)).sum().backward()
    for p, t, s in ((a, ta, swap_a), (b, tb, swap_b)):
        got = dev.host(grads[p.id])
        np.testing.assert_allclose(np.swapaxes(got, -1, -2) if s else got, t.grad.numpy(),
                                   rtol=1e-9, atol=1e-12)


def test_linear_gradcheck(dev):
    ps = [dev.param(x) for x in inputs([(2, 2, 3), (2, 3), (2,)], seed=4)]
    weights = dev.tensor(np.random.default_rng(3).normal(size=(2, 2, 2)))
    ng.gradcheck(lambda: loss_of(ng.linear(*ps, activation="tanh"), weights), ps,
                 directions=None if dev.name == "cpu" else 2)


@pytest.mark.parametrize("sa, sb", [((2, 3, 4), (4, 2)), ((2, 1, 3, 4), (3, 4, 2)),
                                    ((3, 4), (2, 4, 2))])
def test_a_shared_weight_accumulates_in_place(dev, sa, sb):
    """Two backward passes add into one gradient buffer: each writes beta=1."""
    x, w = inputs([sa, sb], seed=7)
    a, b = dev.tensor(x), dev.param(w)
    ones = dev.tensor(np.ones(int(np.prod(np.broadcast_shapes(sa[:-1], sb[:-2] + (1,))))
                          * sb[-1]))
    for _ in range(2):
        with ng.grad_tape():
            loss = loss_of(a @ b, ones)
        loss.backward()
    tw = torch.tensor(w, requires_grad=True)
    (2 * (torch.tensor(x) @ tw).sum()).backward()
    np.testing.assert_allclose(dev.host(b.grad), tw.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_a_weight_shared_over_the_batch_is_one_gemm_each_way():
    x, w = inputs([(3, 2, 4), (4, 5)], seed=8)
    a, b = ng.param(x), ng.param(w)
    with ng.grad_tape(), kernels.observe(Calls()) as forward:
        out = a @ b
    weights = ng.tensor(np.ones(out.size))
    with ng.grad_tape():
        loss = loss_of(a @ b, weights)
    with kernels.observe(Calls()) as backward:
        ng.backward(loss)
    assert forward.kernels == ["gemm"] and forward.taken == 1
    assert backward.kernels.count("gemm") == 2 and "bgemm" not in backward.kernels


def test_linear_on_a_contiguous_stack_copies_nothing():
    x, w, bias = (ng.param(v) for v in inputs([(2, 3, 4), (5, 4), (5,)]))
    with ng.grad_tape(), kernels.observe(Calls()) as calls:
        out = ng.linear(x, w, bias)
    assert out.shape == (2, 3, 5)
    assert calls.kernels == ["linear"] and calls.taken == 1
    assert np.shares_memory(calls.args[0][0], x._data)


MATMUL_KERNELS = ("gemm", "bgemm", "expand_nd", "sum_to_nd")


@pytest.mark.parametrize("sa, sb, grads", [((2, 3, 4), (2, 4, 5), 2), ((2, 3, 4), (4, 5), 2),
                                           ((3, 4), (2, 4, 5), 1), ((2, 1, 3, 4), (2, 4, 1), 2),
                                           ((2, 3, 2, 4), (3, 4, 2), 2)])
def test_cuda_launches_one_per_forward_and_per_gradient(sa, sb, grads):
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    x, y = inputs([sa, sb])
    a = ng.param(x, device="cuda") if grads == 2 else ng.tensor(x, device="cuda")
    b = ng.param(y, device="cuda")
    n0 = ng.cuda.launch_count()
    with ng.grad_tape(), kernels.observe(Calls()) as forward:
        out = a @ b
    assert ng.cuda.launch_count() - n0 == 1 and forward.kernels[0] in ("gemm", "bgemm")
    with ng.grad_tape():
        loss = loss_of(a @ b, ng.tensor(np.ones(out.size), device="cuda"))
    n0 = ng.cuda.launch_count()
    with kernels.observe(Calls()) as backward:
        ng.backward(loss)
    assert ng.cuda.launch_count() - n0 == len(backward.kernels)   # one launch a call
    assert sum(k in MATMUL_KERNELS for k in backward.kernels) == grads, backward.kernels


BAD = [((2, 3, 4), (2, 5, 2), "not aligned"), ((2, 3, 4), (3, 4, 2), "batch dims"),
       ((2, 1, 3, 4), (3, 1, 4, 2), "batch dims"), ((), (3, 4), "at least 1 dim"),
       ((4,), (2, 3, 2), "not aligned")]


@pytest.mark.parametrize("sa, sb, what", BAD)
def test_bad_shapes_raise_before_anything_runs(dev, sa, sb, what):
    a, b = dev.param(np.ones(sa)), dev.param(np.ones(sb))
    with ng.grad_tape(), kernels.observe(Calls()) as calls:
        with pytest.raises(ValueError, match=what) as info:
            a @ b
    message = str(info.value)
    for part in ("matmul", str(tuple(sa)), str(tuple(sb)), "float64", dev.name):
        assert part in message, (part, message)
    assert calls.kernels == [] and calls.taken == 0


def test_linear_bad_input_raises_before_anything_runs(dev):
    x, w = dev.param(np.ones((2, 3, 4))), dev.param(np.ones((5, 3)))
    with kernels.observe(Calls()) as calls:
        with pytest.raises(ValueError, match=r"linear: input shape \(2, 3, 4\), float64, on "
                           + dev.name + ".* has 4 features but weight shape \\(5, 3\\)"):
            ng.linear(x, w)
    assert calls.kernels == [] and calls.taken == 0


def test_mixed_dtypes_and_devices_raise(dev):
    a = dev.param(np.ones((2, 3, 4)))
    with pytest.raises(TypeError, match="matmul: dtypes differ"):
        a @ dev.param(np.ones((2, 4, 2), np.float32))
    if dev.name == "cuda":
        with pytest.raises(ValueError, match="matmul"):
            a @ ng.param(np.ones((2, 4, 2)))


@pytest.mark.parametrize("kind", ["shared", "batched", "broadcast"])
def test_compiled_nd_matmul_step_is_bit_identical_to_eager(tmp_path, kind):
    rng = np.random.default_rng(0)
    wshape = {"shared": (4, 3), "batched": (2, 4, 3), "broadcast": (2, 1, 4, 3)}[kind]
    xs = [rng.normal(size=(2, 2, 5, 4)).astype(np.float32) for _ in range(3)]
    ys = [rng.normal(size=(20, 3)).astype(np.float32) for _ in range(3)]
    w0 = rng.normal(size=wshape).astype(np.float32)

    def make():
        w = ng.param(w0)
        opt = ng.optim.Adam([w], lr=0.05, accumulate_steps=2)

        def loss_fn(x, y):
            return ng.mse_loss((x @ w).reshape(20, 3), y)
        return w, opt, loss_fn
    wa, oa, fa = make()
    wb, ob, fb = make()
    step = ng.compile(fb, optimizer=ob, cache_dir=str(tmp_path))
    for i in range(6):
        x, y = ng.tensor(xs[i % 3]), ng.tensor(ys[i % 3])
        with ng.grad_tape():
            la = fa(x, y)
        la.backward()
        oa.step()
        lb = step(x, y)
        assert np.array_equal(la.numpy(), lb.numpy()), i
        assert np.array_equal(wa.numpy(), wb.numpy()), i
    assert [s["mode"] for s in step.stats] == ["njit"]


def test_bench_bmm_peers_compute_the_same_update():
    """The benchmark's bmm case (its one row: float32 Adam; float64 here)
    does the same math in every peer (NumPy's hand-written loop the
    reference), or its ratios compare nothing."""
    import pathlib
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "scripts"))
    import bench_peers
    names = ["numbagrad", "numbagrad compiled", "numpy", "torch", "jax"]
    steps = {n: bench_peers.PEERS[n]("bmm", np.dtype(np.float64), "adam", "cpu")
             for n in names}
    steps = {n: s for n, s in steps.items() if s is not None}
    assert {"numbagrad", "numbagrad compiled", "numpy", "torch"} <= set(steps)
    for _ in range(2 * bench_peers.K):
        for step in steps.values():
            step()
    want = steps["numpy"].weights()
    start = bench_peers.initial_weights("bmm", np.float64)
    assert [w.shape for w in want] == [(48, 64, 32), (48, 32, 64)] == [w.shape for w in start]
    assert not np.allclose(want[0], start[0]) and not np.allclose(want[1], start[1])
    for name, step in steps.items():
        for got, w in zip(step.weights(), want, strict=True):
            np.testing.assert_allclose(got, w, rtol=1e-9, atol=1e-12, err_msg=name)
    assert len(bench_peers.floor_gemms("bmm", np.float32)) == 3 * 48
