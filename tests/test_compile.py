"""ng.compile: a recorded training step replayed as one @njit function (CPU) or
as back-to-back launches (CUDA), bit-identical to eager execution."""
import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import numbagrad as ng
from numbagrad.compile import GraphChangedError
from numbagrad.compile import compile as ng_compile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("ngcache"))


def host(a):
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


def same(a, b):
    """Bit-identical host arrays (NaN never expected here)."""
    a, b = host(a), host(b)
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.all(a == b))


def eager_step(fn, opt, *args):
    with ng.grad_tape():
        loss = fn(*args)
    loss.backward()
    if opt is not None:
        opt.step()
    return loss


def check_twins(pa, pb, oa=None, ob=None):
    for a, b in zip(pa, pb):
        assert same(a.data, b.data)
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            assert same(a.grad, b.grad)
    if oa is not None:
        assert (oa.t, oa.pending_steps) == (ob.t, ob.pending_steps)


# ------------------------------------------------------------ models
def linear_case(dtype=np.float32, device="cpu", optimizer="adam", seed=0):
    rng = np.random.default_rng(seed)
    W = ng.param(rng.normal(size=(2, 3)).astype(dtype), device=device)
    opt = {"adam": lambda: ng.optim.Adam([W], lr=0.05, accumulate_steps=4),
           "sgd": lambda: ng.optim.SGD([W], lr=0.1, momentum=0.9, accumulate_steps=4),
           None: lambda: None}[optimizer]()

    def loss_fn(x, y):
        return ng.mse_loss(W @ x, y)
    return [W], opt, loss_fn


def linear_batches(dtype=np.float32, device="cpu", n=5, batch=4, seed=1):
    rng = np.random.default_rng(seed)
    return [(ng.tensor(rng.normal(size=(3, batch)).astype(dtype), device=device),
             ng.tensor(rng.normal(size=(2, batch)).astype(dtype), device=device))
            for _ in range(n)]


def mlp_case(sizes=(64, 64, 10), device="cpu", optimizer=True, seed=0):
    rng = np.random.default_rng(seed)
    model = ng.nn.Sequential(
        ng.nn.Linear(sizes[0], sizes[1], dtype=np.float32, device=device, rng=rng), ng.nn.ReLU(),
        ng.nn.Linear(sizes[1], sizes[2], dtype=np.float32, device=device, rng=rng))
    opt = (ng.optim.Adam(model.parameters(), lr=1e-2, accumulate_steps=4)
           if optimizer else None)

    def loss_fn(x, labels):
        return ng.cross_entropy(model(x), labels)
    return model.parameters(), opt, loss_fn


def mlp_batches(sizes=(64, 64, 10), batch=32, device="cpu", n=3, label_dtype=np.int64):
    rng = np.random.default_rng(7)
    return [(ng.tensor(rng.normal(size=(batch, sizes[0])).astype(np.float32), device=device),
             rng.integers(0, sizes[2], batch).astype(label_dtype)) for _ in range(n)]


def run_twins(make, batches, cache, calls=14, counts=False):
    """The same model twice: eager and compiled, compared with == after every call;
    with ``counts``, each call's (launches, transfers) for eager and compiled."""
    pa, oa, fa = make()
    pb, ob, fb = make()
    step = ng_compile(fb, optimizer=ob, cache_dir=cache)
    launches = []

    def counters():
        return (ng.cuda.launch_count(), ng.cuda.transfer_count()) if counts else (0, 0)
    for i in range(calls):
        args = batches[i % len(batches)]
        c0 = counters()
        la = eager_step(fa, oa, *args)
        c1 = counters()
        lb = step(*args)
        c2 = counters()
        launches.append(((c1[0] - c0[0], c1[1] - c0[1]), (c2[0] - c1[0], c2[1] - c1[1])))
        assert same(la.data, lb.data), f"loss differs on call {i}"
        check_twins(pa, pb, oa, ob)
    return step, launches


# ------------------------------------------------------------ bit-identity, CPU
@pytest.mark.parametrize("optimizer", ["adam", "sgd", None])
def test_linear_is_bit_identical_to_eager(cache, optimizer):
    step, _ = run_twins(lambda: linear_case(optimizer=optimizer), linear_batches(), cache)
    assert [s["mode"] for s in step.stats] == ["njit"]
    assert step.stats[0]["fused_update"] == (optimizer is not None)


def test_linear_float64_and_host_targets(cache):
    # y as a host array: the op copies it each call, the compiled step reads it in place
    rng = np.random.default_rng(3)
    batches = [(ng.tensor(rng.normal(size=(3, 6))), rng.normal(size=(2, 6))) for _ in range(3)]
    step, _ = run_twins(lambda: linear_case(np.float64), batches, cache, calls=9)
    assert [s["mode"] for s in step.stats] == ["njit"]


@pytest.mark.parametrize("optimizer", [True, False], ids=["adam", "no-optimizer"])
def test_mlp_is_bit_identical_to_eager(cache, optimizer):
    step, _ = run_twins(lambda: mlp_case(optimizer=optimizer), mlp_batches(), cache, calls=13)
    assert [s["mode"] for s in step.stats] == ["njit"]


# ------------------------------------------------------------ the fused update
def fused_case(make_opt, sizes=(5, 7, 3), seed=0):
    def make():
        rng = np.random.default_rng(seed)
        model = ng.nn.Sequential(ng.nn.Linear(sizes[0], sizes[1], dtype=np.float32, rng=rng),
                                 ng.nn.Tanh(),
                                 ng.nn.Linear(sizes[1], sizes[2], dtype=np.float32, rng=rng))

        def loss_fn(x, labels):
            return ng.cross_entropy(model(x), labels)
        return model.parameters(), make_opt(model.parameters()), loss_fn
    return make


FUSED_OPTIMIZERS = {
    "adam": lambda ps: ng.optim.Adam(ps, lr=0.05, accumulate_steps=3),
    "adamw-clip": lambda ps: ng.optim.AdamW(ps, lr=0.05, weight_decay=0.1, max_grad_norm=0.05,
                                            accumulate_steps=2),
    "sgd-momentum-decay": lambda ps: ng.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01,
                                                  accumulate_steps=3),
    "sgd-sum-unchecked": lambda ps: ng.optim.SGD(ps, lr=0.05, accumulate_steps=2, average=False,
                                                 nonfinite="ignore"),
    "adam-cosine-k1": lambda ps: ng.optim.Adam(ps, lr=ng.optim.schedules.cosine(0.05, 6),
                                               max_grad_norm=1.0),
}


@pytest.mark.parametrize("kind", FUSED_OPTIMIZERS)
def test_the_fused_update_is_bit_identical_and_skips_python_step(cache, kind):
    make = fused_case(FUSED_OPTIMIZERS[kind])
    pa, oa, fa = make()
    pb, ob, fb = make()
    calls = []
    python_step = ob.step
    ob.step = lambda *a, **k: calls.append(1) or python_step(*a, **k)
    step = ng_compile(fb, optimizer=ob, cache_dir=cache)
    for i in range(14):
        args = mlp_batches((5, 7, 3), batch=6, n=3)[i % 3]
        assert same(eager_step(fa, oa, *args).data, step(*args).data)
        check_twins(pa, pb, oa, ob)
        assert (oa.last_grad_norm, oa.lr) == (ob.last_grad_norm, ob.lr)
    assert step.stats[-1]["fused_update"] and step.stats[-1]["mode"] == "njit"
    assert len(calls) == 4     # the recording and the checking calls 2, 4, 8 step eagerly
    assert oa.t == ob.t > 0


def test_fused_and_python_updates_interleave(cache):
    # a second signature's calls step the optimizer eagerly (Adam's step counts swap
    # buffers there); a state dict loads mid-window; the fused update follows both
    make = fused_case(FUSED_OPTIMIZERS["adam"])
    pa, oa, fa = make()
    pb, ob, fb = make()
    step = ng_compile(fb, optimizer=ob, cache_dir=cache)
    small = mlp_batches((5, 7, 3), batch=6, n=2)
    big = mlp_batches((5, 7, 3), batch=9, n=1)
    for i, args in enumerate(small + big + small + small + big + small * 3):
        assert same(eager_step(fa, oa, *args).data, step(*args).data)
        check_twins(pa, pb, oa, ob)
        if i == 6:
            saved = oa.state_dict()
            oa.load_state_dict(saved)
            ob.load_state_dict(saved)
    assert oa.t == ob.t >= 3


@pytest.mark.parametrize("nonfinite", ["raise", "skip"])
def test_a_non_finite_window_under_the_fused_update_acts_as_eager(cache, nonfinite):
    make = fused_case(lambda ps: ng.optim.Adam(ps, lr=0.05, accumulate_steps=2,
                                               nonfinite=nonfinite))
    pa, oa, fa = make()
    pb, ob, fb = make()
    step = ng_compile(fb, optimizer=ob, verify=False, cache_dir=cache)
    (x, labels), = mlp_batches((5, 7, 3), batch=6, n=1)
    bad = ng.tensor(np.where(np.arange(30).reshape(6, 5) == 7, np.inf, x.numpy()))
    for args in [(x, labels), (x, labels), (x, labels), (bad, labels), (x, labels), (x, labels)]:
        outcome = []
        for fn in (lambda a: eager_step(fa, oa, *a), lambda a: step(*a)):
            with pytest.warns() if nonfinite == "skip" and args[0] is bad else \
                    contextlib.nullcontext():
                try:
                    fn(args)
                    outcome.append(None)
                except FloatingPointError as exc:
                    outcome.append(str(exc))
        assert outcome[0] == outcome[1]
        check_twins(pa, pb, oa, ob)
        assert (oa.skipped, oa.last_grad_norm) == (ob.skipped, ob.last_grad_norm)
    assert step.stats[-1]["fused_update"]


def test_the_update_stays_in_python_when_it_cannot_be_fused(cache, monkeypatch):
    # a param fn never reaches, or a group above the threaded kernels' threshold
    def unreached(ps):
        return ng.optim.Adam([*ps, ng.param(np.ones(3, np.float32))], lr=0.05,
                             accumulate_steps=2)
    for make_opt in (unreached, FUSED_OPTIMIZERS["adam"]):
        if make_opt is not unreached:
            kernels = sys.modules["numbagrad.kernels.cpu.optim"]
            monkeypatch.setattr(kernels, "_threaded", lambda n: True)
        step, _ = run_twins(fused_case(make_opt), mlp_batches((5, 7, 3), batch=6), cache,
                            calls=6)
        assert not step.stats[-1]["fused_update"] and step.stats[-1]["mode"] == "njit"
    _, ob, fb = fused_case(FUSED_OPTIMIZERS["adam"])()
    step = ng_compile(fb, optimizer=ob, fuse_update=False, cache_dir=cache)
    step(*mlp_batches((5, 7, 3), batch=6, n=1)[0])
    assert not step.stats[-1]["fused_update"]


def test_int32_labels_and_a_transposed_argument(cache):
    step, _ = run_twins(lambda: mlp_case((5, 7, 3)),
                        mlp_batches((5, 7, 3), batch=6, label_dtype=np.int32), cache, calls=6)
    assert step.stats[-1]["mode"] == "njit"
    rng = np.random.default_rng(4)
    batches = [(ng.tensor(rng.normal(size=(4, 3)).astype(np.float32)).T,
                ng.tensor(rng.normal(size=(2, 4)).astype(np.float32))) for _ in range(2)]
    step, _ = run_twins(linear_case, batches, cache, calls=6)
    assert step.stats[-1]["mode"] == "njit"


def test_grad_clearing_and_kept_losses_match_eager(cache):
    pa, _, fa = linear_case(optimizer=None)
    pb, _, fb = linear_case(optimizer=None)
    step = ng_compile(fb, cache_dir=cache)
    kept_a, kept_b = [], []
    for i, (x, y) in enumerate(linear_batches(n=6)):
        kept_a.append(eager_step(fa, None, x, y))
        kept_b.append(step(x, y))
        if i == 2:
            pa[0].grad = None
            pb[0].grad = None
        check_twins(pa, pb)
    # losses the caller keeps are never overwritten by later calls
    assert [a.item() for a in kept_a] == [b.item() for b in kept_b]
    assert len({id(b) for b in kept_b}) == len(kept_b)
    # ... and one it drops is refilled instead of made again (the step keeps it alive)
    quiet = ng_compile(fb, verify=False, cache_dir=cache)
    x, y = linear_batches(n=1)[0]
    quiet(x, y)
    first = quiet(x, y)
    first_id, value = id(first), first.item()
    second = quiet(x, y)
    del first
    third = quiet(x, y)
    assert second.item() == value and third.item() == value
    if ng.buffers.IDLE_REFS is not None:
        assert id(third) == first_id and third is not second


# ------------------------------------------------------------ signatures and state
def test_new_signature_records_again_and_old_ones_stay(cache):
    pa, oa, fa = linear_case()
    pb, ob, fb = linear_case()
    step = ng_compile(fb, optimizer=ob, cache_dir=cache)
    narrow, wide = linear_batches(n=2, batch=4), linear_batches(n=2, batch=8, seed=2)
    for args in narrow + wide + narrow + wide:
        assert same(eager_step(fa, oa, *args).data, step(*args).data)
        check_twins(pa, pb, oa, ob)
    assert len(step.stats) == 2 and len(step.signatures) == 2
    assert all(s["mode"] == "njit" for s in step.stats)


def test_a_new_optimizer_over_the_params_records_again(cache):
    pa, _, fa = linear_case(optimizer=None)
    pb, _, fb = linear_case(optimizer=None)
    step = ng_compile(fb, cache_dir=cache)
    batches = linear_batches()
    for args in batches[:3]:
        eager_step(fa, None, *args)
        step(*args)
    oa = ng.optim.SGD(pa, lr=0.1, accumulate_steps=2)   # data and .grad move into its buffers
    ob = ng.optim.SGD(pb, lr=0.1, accumulate_steps=2)
    for args in batches:
        assert same(eager_step(fa, oa, *args).data, step(*args).data)
        ob.step()
        check_twins(pa, pb, oa, ob)
    assert len(step.stats) == 2                         # the step noticed and recorded again
    step.optimizer = ob                                 # one call now steps it too
    for args in batches:
        assert same(eager_step(fa, oa, *args).data, step(*args).data)
        check_twins(pa, pb, oa, ob)
    assert len(step.stats) == 3


# ------------------------------------------------------------ errors
def test_a_wrong_shape_raises_eager_mode_error(cache):
    _, opt, fn = linear_case()
    step = ng_compile(fn, optimizer=opt, cache_dir=cache)
    x, y = linear_batches(n=1)[0]
    step(x, y)
    bad = ng.tensor(np.ones((4, 4), np.float32))
    with pytest.raises(ValueError) as eager_error:
        eager_step(fn, None, bad, y)
    with pytest.raises(ValueError, match=re.escape(str(eager_error.value))):
        step(bad, y)
    step(x, y)      # the recording machinery is restored after the error


def test_an_out_of_range_label_raises_eager_mode_error(cache):
    pa, _, fa = mlp_case((5, 7, 3), optimizer=False)
    pb, _, fb = mlp_case((5, 7, 3), optimizer=False)
    step = ng_compile(fb, cache_dir=cache)
    x, labels = mlp_batches((5, 7, 3), batch=6, n=1)[0]
    for _ in range(3):
        eager_step(fa, None, x, labels)
        step(x, labels)
    bad = labels.copy()
    bad[4] = 3
    with pytest.raises(ValueError) as eager_error:
        eager_step(fa, None, x, bad)
    with pytest.raises(ValueError, match=re.escape(str(eager_error.value))):
        step(x, bad)                       # a replayed call: checked before any kernel
    check_twins(pa, pb)                    # nothing was written
    assert len(step.stats) == 1


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("first", ["some ignored", "none ignored", "all ignored"])
def test_labels_holding_ignore_index_give_eager_results_on_every_call(cache, first, smoothing):
    """Whichever labels the first call records, every later call's loss and
    weights are eager's, with its own labels: a recording whose labels hold
    ignore_index kept their mask as constants, so it replays only what it can
    (every call eagerly; or, recorded with every label ignored, those that
    ignore every label), and a verifying call whose labels a replay could
    not take runs eagerly too rather than report a changed graph."""
    rng = np.random.default_rng(3)
    x = ng.tensor(rng.normal(size=(6, 4)))
    labels = {"some ignored": [1, -100, 2, 0, -100, 3], "none ignored": [0, 1, 2, 3, 1, 0],
              "all ignored": [-100] * 6}
    later = [[3, 2, -100, 1, 0, 2], [0, 0, 1, 1, 2, 2], [-100] * 6, [2, -100, -100, 0, 3, 3],
             [1, 2, 3, 0, 1, 2], [-100, 1, 2, 3, 0, -100]]
    calls = [np.array(y) for y in [labels[first]] + later * 2]

    def make():
        W = ng.param(np.eye(4) + 0.1)
        opt = ng.optim.SGD([W], lr=0.1)
        return W, opt, lambda x, y: ng.cross_entropy(ng.matmul(x, W), y,
                                                     label_smoothing=smoothing)
    (Wa, oa, fa), (Wb, ob, fb) = make(), make()
    step = ng_compile(fb, optimizer=ob, cache_dir=cache)
    for i, y in enumerate(calls):
        want = eager_step(fa, oa, x, y)
        if i == 0 and first == "some ignored":
            with pytest.warns(RuntimeWarning, match="target holds ignore_index.*runs eagerly"):
                got = step(x, y)
        else:
            got = step(x, y)
        assert want.numpy().tobytes() == got.numpy().tobytes(), i
        assert same(Wa.data, Wb.data), i
    if first == "some ignored":
        assert step.stats[-1]["mode"] == "eager"
    with pytest.raises(ValueError, match="outside"):   # labels no replay check may let in
        step(x, np.full(6, -1))


HOST_DERIVED = {
    "x[i, j]": (lambda W: lambda i, j: W[i, j].sum(),
                [([0], [0]), ([1], [1]), ([2], [3]), ([0], [2])]),
    "x[mask]": (lambda W: lambda m: W[m].sum(),
                [(np.array(m, bool),) for m in ([1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0])]),
    "masked_select": (lambda W: lambda m: ng.masked_select(W, m).sum(),
                      [(np.array(m, bool)[:, None],) for m in ([1, 0, 0], [0, 1, 0], [0, 1, 1])]),
    "one_hot": (lambda W: lambda ids: ng.matmul(ng.one_hot(ids, 3), W).sum(),
                [([0],), ([1],), ([2],), ([2],)]),
    "repeat_interleave": (lambda W: lambda r: ng.repeat_interleave(W, r, 0).sum(),
                          [([1, 0, 0],), ([0, 2, 0],), ([0, 0, 3],), ([1, 1, 1],)]),
}
# the same with tensor arguments (bool masks, int64 indices): read through .numpy()
# or as their data, which the recorder must trace back to the argument too
HOST_DERIVED.update({f"{name}, tensors": (make, [tuple(ng.tensor(np.asarray(a)) for a in args)
                                                 for args in calls])
                     for name, (make, calls) in list(HOST_DERIVED.items())})


@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize("case", sorted(HOST_DERIVED))
def test_host_positions_made_from_an_argument_give_eager_results(cache, case, verify):
    """Ops that turn an argument's values into positions on the host (several
    index arrays, a boolean mask, one_hot, per-element repeats) made arrays
    a replay kept as constants: every call used the first call's positions
    (with verify=True, calls 2, 4, 8 raised GraphChangedError and the others
    were wrong). Such a signature now runs eagerly, with a RuntimeWarning."""
    make, calls = HOST_DERIVED[case]
    Wa, Wb = (ng.param(np.arange(12.0).reshape(3, 4)) for _ in range(2))
    fa, fb = make(Wa), make(Wb)
    step = ng_compile(fb, cache_dir=cache, verify=verify)
    for i, args in enumerate(calls):
        args = tuple(a if isinstance(a, ng.Tensor) else np.asarray(a) for a in args)
        want = eager_step(fa, None, *args)
        with pytest.warns(RuntimeWarning, match="on the host.*runs eagerly") if i == 0 \
                else contextlib.nullcontext():
            got = step(*args)
        assert want.item() == got.item(), i
        assert same(Wa.grad, Wb.grad), i
        Wa.grad = Wb.grad = None
    assert step.stats[-1]["mode"] == "eager"


def test_host_positions_made_from_constants_still_compile(cache, recwarn):
    """Positions made from arrays fn creates itself are constants of the
    recording (as any such array): the step compiles, without a warning."""
    W = ng.param(np.arange(12.0).reshape(3, 4))
    step = ng_compile(lambda x: ng.sum(W[np.array([0, 1]), np.array([3, 0])] * x),
                      cache_dir=cache)
    for k in range(4):
        assert step(np.full(2, float(k))).item() == 7.0 * k      # W[0, 3] + W[1, 0]
    assert step.stats[-1]["mode"] != "eager"
    assert not [w for w in recwarn if "cannot be replayed" in str(w.message)]


def test_a_value_dependent_graph_is_detected(cache):
    params, opt, _ = linear_case()
    W = params[0]

    def fn(x, y):
        h = W @ x
        if float(x.numpy().sum()) > 0:     # Python control flow on a value: not captured
            h = ng.relu(h)
        return ng.mse_loss(h, y)
    step = ng_compile(fn, optimizer=opt, cache_dir=cache)
    x, y = linear_batches(n=1)[0]
    pos, neg = ng.tensor(np.abs(x.numpy())), ng.tensor(-np.abs(x.numpy()))
    with pytest.warns(RuntimeWarning, match="copied a tensor to the host"):
        step(pos, y)
    with pytest.raises(GraphChangedError, match="different graph.*kernel call #1.*control flow"):
        step(neg, y)


def test_a_changed_graph_leaves_grads_and_the_window_as_they_were(cache):
    """The verifying call's eager backward ran before its graph was compared:
    the GraphChangedError puts back every .grad and the window's state, so
    the next micro-step counts only its own gradient."""
    W = ng.param(np.eye(3))
    opt = ng.optim.SGD([W], lr=0.1, accumulate_steps=3)
    relu = [False]

    def fn(x):
        h = ng.matmul(x, W)
        return ng.sum((ng.relu(h) if relu[0] else h) ** 2)
    step = ng_compile(fn, optimizer=opt, cache_dir=cache)
    x = ng.tensor(np.arange(6.0).reshape(2, 3) - 2.0)
    step(x)
    grad, pending, fed = W.grad.copy(), opt.pending_steps, opt._window.fed
    relu[0] = True
    with pytest.raises(GraphChangedError):
        step(x)                            # call 2 verifies
    assert np.array_equal(W.grad, grad) and opt.pending_steps == pending
    assert opt._window.fed == fed


def test_a_changed_graph_puts_back_the_grads_of_params_only_it_reaches(cache):
    """A param the first recording did not reach, and no optimizer holds: its
    .grad too is as it was after the GraphChangedError."""
    A, B = ng.param(np.ones(3)), ng.param(np.ones(3))
    which = [A]

    def fn(x):
        return ng.sum(x * which[0])
    step = ng_compile(fn, backward=True, cache_dir=cache)
    x = ng.tensor(np.arange(3.0))
    step(x)
    which[0] = B
    with pytest.raises(GraphChangedError):
        step(x)
    assert np.array_equal(A.grad, np.arange(3.0)) and B.grad is None


def test_a_closure_flag_change_is_detected_on_a_checking_call(cache):
    params, _, _ = linear_case(optimizer=None)
    W = params[0]
    flag = {"tanh": False}

    def fn(x, y):
        h = W @ x
        return ng.mse_loss(ng.tanh(h) if flag["tanh"] else h, y)
    step = ng_compile(fn, cache_dir=cache)
    x, y = linear_batches(n=1)[0]
    step(x, y)
    step(x, y)          # call 2 checks: same graph
    flag["tanh"] = True
    step(x, y)          # call 3 replays the recorded graph (documented)
    with pytest.raises(GraphChangedError, match="on call 4"):
        step(x, y)      # call 4 checks again
    unchecked = ng_compile(fn, verify=False, cache_dir=cache)
    for _ in range(4):
        unchecked(x, y)


def test_fallbacks_replay_from_python_then_run_eagerly(cache, monkeypatch):
    # what the generator cannot express is replayed kernel by kernel, else run eagerly
    compile_module = sys.modules["numbagrad.compile"]

    def refuse(*args, **kwargs):
        raise compile_module._Unsupported("refused by the test")
    monkeypatch.setattr(compile_module._Codegen, "kernel", refuse)
    with pytest.warns(RuntimeWarning, match="replayed from Python"):
        step, _ = run_twins(lambda: mlp_case((5, 7, 3)), mlp_batches((5, 7, 3), batch=6),
                            cache, calls=6)
    assert step.stats[-1]["mode"] == "replay"
    monkeypatch.setattr(compile_module._ReplayEntry, "__init__", refuse)
    with pytest.warns(RuntimeWarning, match="runs eagerly"):
        step, _ = run_twins(linear_case, linear_batches(), cache, calls=6)
    assert step.stats[-1]["mode"] == "eager"


def test_fn_must_return_a_tensor(cache):
    step = ng_compile(lambda x: 1.0, cache_dir=cache)
    with pytest.raises(TypeError, match="must return the loss Tensor"):
        step(ng.tensor(np.ones(3)))


# ------------------------------------------------------------ CUDA (simulator)
@pytest.mark.skipif(not ng.cuda_available(), reason="CUDA unusable here")
def test_cuda_matches_eager_with_the_same_launches(cache):
    # Each call's launches, eager then compiled: the same, replays included. Transfers
    # too, once the first window has passed (the kernels make their scratch buffers,
    # one host copy each, the first time any model needs them).
    step, counts = run_twins(lambda: linear_case(device="cuda", optimizer="sgd"),
                             linear_batches(device="cuda", n=3), cache, calls=9, counts=True)
    assert step.stats[0]["mode"] == "replay"
    assert [e[0] for e, _ in counts] == [c[0] for _, c in counts], counts
    # calls 2, 4 and 8 record again, keeping W.grad first (one copy to the host,
    # put back should the graph have changed)
    kept = [int(i in (1, 3, 7)) for i in range(len(counts))]
    assert counts[4:] == [(e, (e[0], e[1] + k)) for (e, _), k in zip(counts, kept)][4:], counts
    assert counts[-1][0][0] > 0
    step, counts = run_twins(lambda: mlp_case((4, 5, 3), device="cuda"),
                             mlp_batches((4, 5, 3), batch=4, device="cuda", n=2), cache,
                             calls=6, counts=True)
    assert [e[0] for e, _ in counts] == [c[0] for _, c in counts], counts
    assert counts[4:] == [(e, e) for e, _ in counts[4:]], counts
    assert counts[-1][1][1] == 1          # the labels' upload, as eager


# ------------------------------------------------------------ the cache folder
CACHE_RUN = textwrap.dedent("""
    import json, time
    import numpy as np
    import numbagrad as ng
    from numbagrad.compile import compile
    rng = np.random.default_rng(0)
    model = ng.nn.Sequential(ng.nn.Linear(8, 6, dtype=np.float32, rng=rng), ng.nn.ReLU(),
                             ng.nn.Linear(6, 3, dtype=np.float32, rng=rng))
    opt = ng.optim.Adam(model.parameters(), lr=1e-2, accumulate_steps=2)
    step = compile(lambda x, labels: ng.cross_entropy(model(x), labels), optimizer=opt)
    x = ng.tensor(rng.normal(size=(4, 8)).astype(np.float32))
    labels = rng.integers(0, 3, 4)
    t = time.perf_counter()
    step(x, labels)
    first = time.perf_counter() - t
    losses = [step(x, labels).item() for _ in range(3)]
    print(json.dumps(dict(step.stats[-1], first_call_s=first, losses=losses)))
""")


def test_generated_code_is_cached_across_processes(tmp_path):
    env = dict(os.environ, NUMBAGRAD_CACHE_DIR=str(tmp_path), PYTHONPATH=ROOT)
    env.pop("NUMBA_CACHE_DIR", None)
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", CACHE_RUN], env=env, capture_output=True,
                              text=True, timeout=240, check=False)
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    print(f"\nnew signature, fresh process: cold cache jit {cold['jit_s']:.3f} s "
          f"(first call {cold['first_call_s']:.3f} s), warm cache jit {warm['jit_s']:.3f} s "
          f"(first call {warm['first_call_s']:.3f} s)")
    assert (cold["cache"], warm["cache"]) == ("miss", "hit")
    assert cold["module"] == warm["module"] and cold["losses"] == warm["losses"]
    folder = os.path.join(str(tmp_path), "compiled")
    names = os.listdir(folder)
    assert any(n.endswith(".py") for n in names)
    assert any(n.endswith(".nbi") for n in os.listdir(os.path.join(folder, "__pycache__")))


def test_a_constant_that_equals_the_first_argument_stays_a_constant():
    # Found in review: host copies were matched to arguments by value, so a
    # constant made inside fn that happened to equal the first batch was
    # re-made from every later batch. Copies are now traced by where they
    # came from: ng.tensor(x) of an argument follows the argument, ng.tensor
    # of anything else is a constant.
    w = ng.param(np.ones(3))
    const = np.zeros(3)

    def fn(x):
        c = ng.tensor(const)
        return ng.sum(w * ng.tensor(x) + c * 0.0 + c)

    step = ng.compile(fn, verify=False)
    step(np.zeros(3))
    assert step(np.array([1.0, 2.0, 3.0])).item() == 6.0
    assert step(np.array([2.0, 2.0, 3.0])).item() == 7.0
