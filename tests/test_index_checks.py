"""Indices and class labels are range-checked on every path (issue: reliability
item 4): a compiled CPU step given a bad index by argument raises the op's
own error before anything changes, and CUDA device index arrays and labels,
which the host never reads, are checked by the kernels themselves (an error
flag read back once), raising IndexError naming the op, the value, its
position and the valid range, with the host path's negative-index rules."""
import warnings

import numpy as np
import pytest

import numbagrad as ng
from conftest import cuda_dev
from numbagrad.compile import compile as ng_compile

NONFINITE = pytest.mark.filterwarnings("ignore:.*encountered in scalar:RuntimeWarning")


def host(a):
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


# ------------------------------------------------------------ CPU: compiled replays
# (name, make(rng) -> (params, loss_fn(index), good indices, bad ones, error, match))
def _getitem(rng):
    X, w = ng.param(rng.normal(size=(5, 3))), ng.tensor(rng.normal(size=(2, 3)))
    return [X], lambda idx: ng.sum(X[idx] * w)


def _getitem_nd(rng):    # an array beside other keys: index_select_nd and index_add_nd
    X, w = ng.param(rng.normal(size=(2, 5, 3))), ng.tensor(rng.normal(size=(5,)))
    return [X], lambda idx: ng.sum(X[1, :, idx] * w)


def _embedding(rng):
    E, w = ng.param(rng.normal(size=(5, 3))), ng.tensor(rng.normal(size=(2, 2, 3)))
    return [E], lambda idx: ng.sum(ng.embedding(idx, E) * w)


def _gather(rng):
    G = ng.param(rng.normal(size=(2, 5)))
    return [G], lambda idx: ng.sum(ng.gather(G, 1, idx) * 1.5)


def _gather_nd(rng):      # a smaller index: gather_nd and scatter_add_nd
    G = ng.param(rng.normal(size=(3, 5, 2)))
    return [G], lambda idx: ng.sum(ng.gather(G, 1, idx) * 1.5)


def _take(rng):           # NumPy dispatch to x[idx]
    X = ng.param(rng.normal(size=(5,)))
    return [X], lambda idx: ng.sum(np.take(X, idx) * 2.0)


def _cross_entropy(rng):
    W = ng.param(rng.normal(size=(3, 5)))
    return [W], lambda y: ng.cross_entropy(ng.tensor(np.ones((2, 3))) @ W, y)


def _cross_entropy3(rng):
    W = ng.param(rng.normal(size=(2, 5, 2)))
    return [W], lambda y: ng.cross_entropy(W * 1.0, y)


def _smoothed(rng):       # the composed form (log_softmax, gather, mean)
    W = ng.param(rng.normal(size=(2, 5)))
    return [W], lambda y: ng.cross_entropy(W * 1.0, y, label_smoothing=0.1)


def _nll(rng):
    W = ng.param(rng.normal(size=(2, 5)))
    return [W], lambda y: ng.nll_loss(ng.log_softmax(W, axis=1), y)


IDX_MSG = r"index {v} is out of range for axis {a} of size {n} \(at position {p}\); " \
          r"valid indices lie in \[{lo}, {n}\)"
CPU_CASES = [
    ("getitem", _getitem, np.array([0, 4]), np.array([0, 5]), IndexError,
     "x\\[key\\]: " + IDX_MSG.format(v=5, a=0, n=5, p=r"\(1,\)", lo=-5)),
    ("getitem_negative", _getitem, np.array([0, -5]), np.array([0, -6]), IndexError,
     "x\\[key\\]: " + IDX_MSG.format(v=-6, a=0, n=5, p=r"\(1,\)", lo=-5)),
    ("getitem_nd", _getitem_nd, np.array([2, -1]), np.array([7, 1]), IndexError,
     "x\\[key\\]: " + IDX_MSG.format(v=7, a=2, n=3, p=r"\(0,\)", lo=-3)),
    ("take_int32", _take, np.array([1, 4], np.int32), np.array([1, 9], np.int32), IndexError,
     "x\\[key\\]: index 9 is out of range"),
    ("embedding", _embedding, np.array([[0, 4], [1, 1]]), np.array([[0, 4], [5, 1]]),
     IndexError, "embedding: " + IDX_MSG.format(v=5, a=0, n=5, p=r"\(1, 0\)", lo=0)),
    ("embedding_negative", _embedding, np.array([[0, 4], [1, 1]]), np.array([[0, -1], [1, 1]]),
     IndexError, "embedding: " + IDX_MSG.format(v=-1, a=0, n=5, p=r"\(0, 1\)", lo=0)),
    ("gather", _gather, np.array([[0], [4]]), np.array([[0], [5]]), IndexError,
     "gather: " + IDX_MSG.format(v=5, a=1, n=5, p=r"\(1, 0\)", lo=0)),
    ("gather_negative", _gather, np.array([[0], [4]]), np.array([[-1], [4]]), IndexError,
     "gather: " + IDX_MSG.format(v=-1, a=1, n=5, p=r"\(0, 0\)", lo=0)),
    ("gather_nd", _gather_nd, np.array([[[1, 0]], [[4, 2]]]), np.array([[[1, 0]], [[4, 8]]]),
     IndexError, "gather: " + IDX_MSG.format(v=8, a=1, n=5, p=r"\(1, 0, 1\)", lo=0)),
    # class labels: eager mode's error for a host target is a ValueError (unchanged)
    ("cross_entropy", _cross_entropy, np.array([0, 4]), np.array([0, 5]), ValueError,
     r"cross_entropy: target\[1\] is class 5, outside \[0, 5\)"),
    ("cross_entropy_negative", _cross_entropy, np.array([0, 4]), np.array([-3, 4]), ValueError,
     r"cross_entropy: target\[0\] is class -3, outside \[0, 5\)"),
    ("cross_entropy3", _cross_entropy3, np.array([[0, 4], [1, 2]]), np.array([[0, 4], [1, 6]]),
     ValueError, r"cross_entropy: target\[1, 1\] is class 6, outside \[0, 5\)"),
    ("cross_entropy_smoothed", _smoothed, np.array([0, 4]), np.array([0, 5]), ValueError,
     r"cross_entropy: target\[1\] is class 5, outside \[0, 5\)"),
    ("nll_loss", _nll, np.array([0, 4]), np.array([0, 5]), ValueError,
     r"nll_loss: target\[1\] is class 5, outside \[0, 5\)"),
]


def _state(params, opt):
    """Params, their .grad and the optimizer's whole state (t, window, slots)."""
    return ([p.numpy().copy() for p in params],
            [None if p.grad is None else host(p.grad).copy() for p in params],
            opt.state_dict())


def _same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif a is None or b is None:
        assert a is None and b is None
    else:
        np.testing.assert_array_equal(host(a), host(b))


@pytest.mark.parametrize("accumulate", [1, 2], ids=["update", "window"])
@pytest.mark.parametrize("name, make, good, bad, error, match", CPU_CASES,
                         ids=[c[0] for c in CPU_CASES])
def test_a_compiled_step_refuses_a_bad_index_before_changing_anything(
        tmp_path, name, make, good, bad, error, match, accumulate):
    """njit replay: eager's error, params, .grad and the optimizer untouched, and
    the step then goes on exactly as eager mode does."""
    params, loss_fn = make(np.random.default_rng(0))
    twins, twin_fn = make(np.random.default_rng(0))
    opt = ng.optim.Adam(params, lr=0.05, accumulate_steps=accumulate)
    topt = ng.optim.Adam(twins, lr=0.05, accumulate_steps=accumulate)
    step = ng_compile(loss_fn, optimizer=opt, verify=False, cache_dir=str(tmp_path))

    def eager(idx):
        with ng.grad_tape():
            loss = twin_fn(idx)
        loss.backward()
        topt.step()
        return loss

    with pytest.raises(error, match=match):   # eager mode's error, the reference
        with ng.grad_tape():
            twin_fn(bad)
    for _ in range(3):
        assert step(good).item() == eager(good).item()
    assert [s["mode"] for s in step.stats] == ["njit"]
    before = _state(params, opt)
    with pytest.raises(error, match=match):
        step(bad)
    _same(before, _state(params, opt))
    for _ in range(2):        # the step goes on from where it was, as eager does
        assert step(good).item() == eager(good).item()
    _same(_state(params, opt), _state(twins, topt))
    assert [s["mode"] for s in step.stats] == ["njit"]


def test_the_replay_reads_each_calls_labels_in_the_composed_cross_entropy(tmp_path):
    """label_smoothing / reduction="none" compose gather: the labels given by
    argument are read on every call (they were frozen at the recording)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 4))
    for kwargs in ({"label_smoothing": 0.2}, {"reduction": "none"}, {"ignore_index": 2}):
        W = ng.param(np.eye(4))

        def loss_fn(y, kwargs=kwargs):
            out = ng.cross_entropy(ng.tensor(x) @ W, y, **kwargs)
            return ng.sum(out) if kwargs.get("reduction") == "none" else out
        step = ng_compile(loss_fn, verify=False, cache_dir=str(tmp_path))
        # the last two hold the ignored class 2: run eagerly, as ignore_index asks
        for y in ([0, 1, 3], [0, 1, 3], [3, 3, 1], [1, 0, 0], [2, 0, 1], [2, 2, 2]):
            y = np.array(y)
            got = step(y).item()
            with ng.grad_tape():
                want = loss_fn(y).item()
            assert got == want or (np.isnan(got) and np.isnan(want)), (kwargs, y)
        assert [s["mode"] for s in step.stats] == ["njit"]


def test_a_python_replay_checks_too(tmp_path, monkeypatch):
    """The CPU's Python replay (no @njit function) runs the same checks."""
    from numbagrad.compile import CompiledStep, _Unsupported

    def refuse(*args, **kwargs):
        raise _Unsupported("refused by the test")
    monkeypatch.setattr(CompiledStep, "_njit_entry", refuse)
    params, loss_fn = _embedding(np.random.default_rng(0))
    opt = ng.optim.SGD(params, lr=0.1)
    step = ng_compile(loss_fn, optimizer=opt, verify=False, cache_dir=str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # "replayed from Python"
        step(np.array([[0, 1], [2, 3]]))
    assert [s["mode"] for s in step.stats] == ["replay"]
    step(np.array([[0, 1], [2, 3]]))
    before = _state(params, opt)
    with pytest.raises(IndexError, match="embedding: index -2 is out of range"):
        step(np.array([[0, 1], [-2, 3]]))
    _same(before, _state(params, opt))


# ------------------------------------------------------------ CUDA: device indices
def _device(a):
    from numba import cuda
    return cuda.to_device(np.asarray(a))


DEVICE_MSG = r" \(device indices, checked by the kernel\)"
# (name, op(x, device or host index), x shape, good index, bad index, match)
DEVICE_CASES = [
    ("getitem", lambda x, i: x[i], (4, 3), [3, 0, -4], [0, 4, 1],
     r"x\[key\]: " + IDX_MSG.format(v=4, a=0, n=4, p=r"\(1,\)", lo=-4) + DEVICE_MSG),
    ("getitem_negative", lambda x, i: x[i], (4, 3), [[-1, 2], [0, -2]], [[-1, 2], [-5, 0]],
     r"x\[key\]: " + IDX_MSG.format(v=-5, a=0, n=4, p=r"\(1, 0\)", lo=-4) + DEVICE_MSG),
    ("getitem_axis1", lambda x, i: x[:, i], (4, 3), [2, -3], [2, 3],
     r"x\[key\]: " + IDX_MSG.format(v=3, a=1, n=3, p=r"\(1,\)", lo=-3)),
    ("getitem_nd", lambda x, i: x[1, :, i], (2, 4, 3), [2, -1, 0], [2, -1, -7],
     r"x\[key\]: " + IDX_MSG.format(v=-7, a=2, n=3, p=r"\(2,\)", lo=-3)),
    ("embedding", lambda x, i: ng.embedding(i, x), (4, 3), [[3, 0], [1, 1]], [[3, 0], [1, 4]],
     r"embedding: " + IDX_MSG.format(v=4, a=0, n=4, p=r"\(1, 1\)", lo=0) + DEVICE_MSG),
    ("embedding_negative", lambda x, i: ng.embedding(i, x), (4, 3), [3, 0], [3, -1],
     r"embedding: " + IDX_MSG.format(v=-1, a=0, n=4, p=r"\(1,\)", lo=0)),
    ("gather", lambda x, i: ng.gather(x, 1, i), (4, 3), [[2], [0], [1], [2]],
     [[2], [0], [3], [2]], r"gather: " + IDX_MSG.format(v=3, a=1, n=3, p=r"\(2, 0\)", lo=0)),
    ("gather_negative", lambda x, i: ng.gather(x, 1, i), (4, 3), [[2], [0], [1], [2]],
     [[2], [-1], [1], [2]], r"gather: " + IDX_MSG.format(v=-1, a=1, n=3, p=r"\(1, 0\)", lo=0)),
    ("gather_nd", lambda x, i: ng.gather(x, 0, i), (4, 3), [[0, 1], [3, 2]], [[0, 1], [4, 2]],
     r"gather: " + IDX_MSG.format(v=4, a=0, n=4, p=r"\(1, 0\)", lo=0)),
]


@NONFINITE
@pytest.mark.parametrize("name, op, shape, good, bad, match", DEVICE_CASES,
                         ids=[c[0] for c in DEVICE_CASES])
def test_device_indices_are_checked_by_the_kernel(name, op, shape, good, bad, match):
    dev = cuda_dev()
    a = np.arange(float(np.prod(shape))).reshape(shape)
    x = dev.param(a)
    with pytest.raises(IndexError, match=match):
        op(x, _device(np.array(bad)))
    # the host path's rule and message for the same indices
    with pytest.raises(IndexError, match=match.replace(DEVICE_MSG, "")):
        op(x, np.array(bad))
    # valid device indices: the host indices' values and gradient, bit for bit
    results = []
    for index in (_device(np.array(good)), np.array(good)):
        x = dev.param(a)
        with ng.grad_tape():
            out = op(x, index)
            loss = ng.sum(out * 1.5)
        results.append((out.numpy(), dev.host(ng.backward(loss)[x.id])))
    for got, want in zip(*results):
        np.testing.assert_array_equal(got, want)
    # (the flag was cleared: the next call is fine)
    assert op(dev.tensor(a), _device(np.array(good))).numpy().shape == results[0][0].shape


@NONFINITE
@pytest.mark.parametrize("shape, labels, bad, where", [
    ((4, 3), [0, 2, 1, 2], [0, 2, 3, 2], "2"),
    ((4, 3), [0, 2, 1, 2], [0, -1, 1, 2], "1"),
    ((4, 3), [0, 2, 1, 2], [0, 2, 1, -100], "3"),     # ignore_index is not applied
    ((2, 3, 2), [[0, 2], [1, 1]], [[0, 2], [7, 1]], "1, 0"),
], ids=["above", "negative", "ignore_index", "positions"])
def test_device_labels_are_checked_by_the_kernel(shape, labels, bad, where):
    dev = cuda_dev()
    a = np.random.default_rng(0).normal(size=shape)
    value = np.array(bad).reshape(-1)[np.flatnonzero(np.array(bad).reshape(-1)
                                                     != np.array(labels).reshape(-1))[0]]
    with pytest.raises(IndexError, match=rf"cross_entropy: target\[{where}\] is class "
                                         rf"{value}, outside \[0, 3\) .*device labels"):
        ng.cross_entropy(dev.tensor(a), _device(np.array(bad)))
    # the composed form (label_smoothing) names cross_entropy too
    with pytest.raises(IndexError, match=rf"cross_entropy: index {value} is out of range for "
                                         r"axis 1 of size 3 .*valid indices lie in \[0, 3\)"):
        ng.cross_entropy(dev.tensor(a), _device(np.array(bad)), label_smoothing=0.1)
    for kwargs in ({}, {"label_smoothing": 0.1}):   # valid: the host labels' bits
        results = []
        for target in (_device(np.array(labels)), np.array(labels)):
            x = dev.param(a)
            with ng.grad_tape():
                loss = ng.cross_entropy(x, target, **kwargs)
            results.append((loss.numpy(), dev.host(ng.backward(loss)[x.id])))
        for got, want in zip(*results):
            np.testing.assert_array_equal(got, want)


def test_only_device_indices_read_the_flag_back():
    """Host indices were checked before upload: their launches read nothing
    back; device ones add one 4-byte read and no launch."""
    dev = cuda_dev()
    x = dev.param(np.ones((4, 3)))
    ng.embedding(np.array([0]), x)     # the flag exists from here on
    counts = []
    for index in (np.array([1, 2]), _device(np.array([1, 2]))):
        launches, transfers = ng.cuda.launch_count(), ng.cuda.transfer_count()
        ng.embedding(index, x)
        counts.append((ng.cuda.launch_count() - launches,
                       ng.cuda.transfer_count() - transfers))
    assert counts == [(1, 1), (1, 1)]    # host: the upload; device: the flag's read


@NONFINITE
def test_a_cuda_replay_checks_device_and_host_indices():
    """The CUDA replay issues the recorded launches: a device index is checked
    by its kernel (before any gradient is written), a host one before any
    launch, and the step then goes on as eager mode."""
    dev = cuda_dev()
    rng = np.random.default_rng(0)
    a, w = rng.normal(size=(5, 3)), rng.normal(size=(2, 3))
    E, T = dev.param(a), dev.param(a)
    opt, topt = ng.optim.SGD([E], lr=0.1), ng.optim.SGD([T], lr=0.1)

    def fn(param, idx, y):
        h = ng.embedding(idx, param)
        return ng.sum(h * dev.tensor(w)) + ng.cross_entropy(ng.reshape(h, (2, 3)) * 1.0, y)

    step = ng_compile(lambda idx, y: fn(E, idx, y), optimizer=opt, verify=False)

    def eager(idx, y):
        with ng.grad_tape():
            loss = fn(T, idx, y)
        loss.backward()
        topt.step()
        return loss
    good = (_device(np.array([1, 4])), _device(np.array([0, 2])))
    for _ in range(3):
        assert step(*good).item() == eager(*good).item()
    assert [s["mode"] for s in step.stats] == ["replay"]
    bads = [((_device(np.array([1, 5])), good[1]), IndexError, "embedding: index 5"),
            ((_device(np.array([-1, 4])), good[1]), IndexError, "embedding: index -1"),
            ((good[0], _device(np.array([0, 3]))), IndexError,
             r"cross_entropy: target\[1\] is class 3")]
    for args, error, match in bads:
        before = _state([E], opt)
        with pytest.raises(error, match=match):
            step(*args)
        _same(before, _state([E], opt))
    assert step(*good).item() == eager(*good).item()
    np.testing.assert_array_equal(E.numpy(), T.numpy())
    # host indices: checked before any launch, the step's error is eager mode's
    hstep = ng_compile(lambda idx: ng.sum(ng.embedding(idx, E)), optimizer=opt, verify=False)
    for _ in range(2):
        hstep(np.array([1, 2]))
    launches, t = ng.cuda.launch_count(), opt.t
    with pytest.raises(IndexError, match=r"embedding: index 7 is out of range .* \[0, 5\)$"):
        hstep(np.array([1, 7]))
    assert ng.cuda.launch_count() == launches and opt.t == t
