"""layer_norm / group_norm / batch_norm and the LayerNorm, GroupNorm,
BatchNorm1d / BatchNorm2d layers against PyTorch: values and the input,
weight and bias gradients, the running statistics (in place, unbiased,
momentum), both devices, gradcheck, bad input, accumulation, ng.compile,
CUDA launches and PTX for the new kernel sources."""

import numpy as np
import pytest

import numbagrad as ng
from conftest import cuda_dev, cuda_launches, inputs, matches_torch
from numbagrad.compile import compile as ng_compile

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _affine(fn, tfn, has_w, has_b):
    """(ng function, torch function) of (x, *weight and bias present)."""
    def pick(args):
        rest = list(args[1:])
        w = rest.pop(0) if has_w else None
        b = rest.pop(0) if has_b else None
        return args[0], w, b
    return (lambda *a: fn(*pick(a)), lambda *a: tfn(*pick(a)))


AFFINE = [(True, True), (True, False), (False, True), (False, False)]


# ------------------------------------------------------------ layer_norm
@pytest.mark.parametrize("xs, shape", [((3, 5), (5,)), ((2, 3, 4), (4,)), ((2, 3, 4), (3, 4)),
                                       ((4,), (4,)), ((2, 1, 3, 2), (3, 2))])
@pytest.mark.parametrize("has_w, has_b", AFFINE)
def test_layer_norm_matches_torch(xs, shape, has_w, has_b):
    f, g = _affine(lambda x, w, b: ng.layer_norm(x, shape, w, b, eps=1e-3),
                   lambda x, w, b: F.layer_norm(x, shape, w, b, eps=1e-3), has_w, has_b)
    shapes = [xs] + [shape] * (has_w + has_b)
    matches_torch(f, g, inputs(shapes, seed=1), name=f"layer_norm{xs}{shape}")


def test_layer_norm_of_a_strided_view_and_an_int_shape():
    x = inputs([(4, 3)], seed=2)[0]
    matches_torch(lambda x: ng.layer_norm(x.T, 4), lambda x: F.layer_norm(x.T, (4,)), [x],
                  name="transposed")


# ------------------------------------------------------------ group_norm
@pytest.mark.parametrize("xs, groups", [((2, 6), 3), ((2, 6, 4), 1), ((2, 6, 4), 2),
                                        ((2, 6, 4), 6), ((1, 4, 2, 3), 2), ((3, 4, 2, 1, 2), 4)])
@pytest.mark.parametrize("has_w, has_b", AFFINE)
def test_group_norm_matches_torch(xs, groups, has_w, has_b):
    def tfn(x, w, b):
        # (torch's backward fails for a bias without a weight: a weight of ones is none)
        w = torch.ones(xs[1], dtype=x.dtype) if w is None and b is not None else w
        return F.group_norm(x, groups, w, b)
    f, g = _affine(lambda x, w, b: ng.group_norm(x, groups, w, b), tfn, has_w, has_b)
    shapes = [xs] + [(xs[1],)] * (has_w + has_b)
    matches_torch(f, g, inputs(shapes, seed=3), name=f"group_norm{xs}/{groups}")


# ------------------------------------------------------------ batch_norm
def _batch_norm_case(xs, training, has_w, has_b, momentum=0.1, dev=None, dtype=np.float64,
                     rtol=1e-9, atol=1e-12):
    """ng.batch_norm against F.batch_norm: output, gradients and the running
    statistics (both updated in place when training)."""
    c = xs[1]
    rng = np.random.default_rng(4)
    rm, rv = rng.normal(size=c).astype(dtype), rng.uniform(0.5, 2, size=c).astype(dtype)
    ng_rm, ng_rv = ((dev.tensor(rm), dev.tensor(rv)) if dev is not None
                    else (ng.tensor(rm), ng.tensor(rv)))
    t_rm, t_rv = torch.tensor(rm), torch.tensor(rv)
    f, g = _affine(lambda x, w, b: ng.batch_norm(x, ng_rm, ng_rv, w, b, training, momentum),
                   lambda x, w, b: F.batch_norm(x, t_rm, t_rv, w, b, training, momentum),
                   has_w, has_b)
    arrays = [a.astype(dtype) for a in inputs([xs] + [(c,)] * (has_w + has_b), seed=5)]
    if dtype == np.float64:
        matches_torch(f, g, arrays, dev=dev, name=f"batch_norm{xs} training={training}",
                      rtol=rtol, atol=atol)
    else:
        _device_run(dev, dtype, f, g, arrays)
    np.testing.assert_allclose(ng_rm.numpy(), t_rm.numpy(), rtol=rtol, atol=atol)
    np.testing.assert_allclose(ng_rv.numpy(), t_rv.numpy(), rtol=rtol, atol=atol)
    changed = not np.array_equal(ng_rm.numpy(), rm)
    assert changed == (training and momentum > 0)


@pytest.mark.parametrize("xs", [(4, 3), (3, 2, 5), (2, 3, 2, 2), (2, 2, 1, 2, 3)])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("has_w, has_b", [(True, True), (False, False), (True, False)])
def test_batch_norm_matches_torch(xs, training, has_w, has_b):
    _batch_norm_case(xs, training, has_w, has_b)


@pytest.mark.parametrize("momentum", [0.0, 0.3, 1.0])
def test_batch_norm_momentum(momentum):
    _batch_norm_case((5, 2, 3), True, True, True, momentum)


def test_running_variance_is_unbiased_and_updated_in_place():
    x = inputs([(4, 2, 3)], seed=6)[0]
    rm, rv = np.zeros(2), np.ones(2)
    rm_id = id(rm)
    out = ng.batch_norm(ng.tensor(x), rm, rv, training=True, momentum=0.5)
    assert id(rm) == rm_id     # the caller's arrays themselves
    batch = x.transpose(1, 0, 2).reshape(2, -1)
    np.testing.assert_allclose(rm, 0.5 * batch.mean(axis=1), rtol=1e-12)
    np.testing.assert_allclose(rv, 0.5 + 0.5 * batch.var(axis=1, ddof=1), rtol=1e-12)
    # the output is normalised by the biased variance
    want = (x - batch.mean(axis=1)[:, None]) / np.sqrt(batch.var(axis=1)[:, None] + 1e-5)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-9, atol=1e-12)


def test_batch_norm_without_running_stats_and_an_empty_batch():
    x = inputs([(3, 2, 2)], seed=7)[0]
    matches_torch(lambda x: ng.batch_norm(x, None, None, training=True),
                  lambda x: F.batch_norm(x, None, None, training=True), [x], name="no stats")
    rm, rv = np.zeros(2), np.ones(2)
    out = ng.batch_norm(ng.tensor(np.zeros((0, 2))), rm, rv, training=True)
    assert out.shape == (0, 2) and np.all(rm == 0) and np.all(rv == 1)   # as PyTorch


# ------------------------------------------------------------ both devices
def _device_run(dev, dtype, fn, tfn, arrays):
    if dtype == np.float64:
        matches_torch(fn, tfn, arrays, dev=dev, name=f"{dev}")
        return
    arrays = [a.astype(np.float32) for a in arrays]
    ps = [dev.param(a) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    weights = np.random.default_rng(1).normal(size=arrays[0].shape).astype(np.float32)
    with ng.grad_tape():
        out = fn(*ps)
        loss = (out * dev.tensor(weights)).sum()
    grads = ng.backward(loss)
    want = tfn(*ts)
    (want * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    for p, t in zip(ps, ts):
        np.testing.assert_allclose(dev.host(grads[p.id]), t.grad.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_layer_and_group_norm_on_both_devices(dev, dtype):
    arrays = inputs([(2, 2, 3), (2, 3), (2, 3)], seed=8)
    _device_run(dev, dtype, lambda x, w, b: ng.layer_norm(x, (2, 3), w, b),
                lambda x, w, b: F.layer_norm(x, (2, 3), w, b), arrays)
    arrays = inputs([(2, 4, 3), (4,), (4,)], seed=9)
    _device_run(dev, dtype, lambda x, w, b: ng.group_norm(x, 2, w, b),
                lambda x, w, b: F.group_norm(x, 2, w, b), arrays)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_on_both_devices(dev, dtype, training):
    tol = dict(rtol=1e-9, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-5)
    _batch_norm_case((3, 2, 2), training, True, True, 0.2, dev=dev, dtype=dtype, **tol)


def test_gradcheck(dev):
    x, w, b = (dev.param(a) for a in inputs([(2, 4, 2), (4,), (4,)], seed=10))
    weights = dev.tensor(np.random.default_rng(11).normal(size=(2, 4, 2)))
    rm, rv = dev.tensor(np.zeros(4)), dev.tensor(np.ones(4))
    for f, params in ((lambda: ng.layer_norm(x, (4, 2), None, None), [x]),
                      (lambda: ng.group_norm(x, 2, w, b), [x, w, b]),
                      (lambda: ng.batch_norm(x, None, None, w, b, training=True), [x, w, b]),
                      (lambda: ng.batch_norm(x, rm, rv, w, b, training=False), [x, w, b])):
        ng.gradcheck(lambda: (f() * weights).sum(), params,
                     directions=None if dev.name == "cpu" else 2)


def test_the_same_tensor_as_weight_and_bias(dev):
    x, w = inputs([(3, 4), (4,)], seed=12)
    matches_torch(lambda x, w: ng.layer_norm(x, 4, w, w),
                  lambda x, w: F.layer_norm(x, (4,), w, w), [x, w], dev=dev, name="w is b")
    matches_torch(lambda x, w: ng.batch_norm(x, None, None, w, w, True),
                  lambda x, w: F.batch_norm(x, None, None, w, w, True), [x, w], dev=dev,
                  name="bn w is b")


# ------------------------------------------------------------ bad input
BAD = [
    (lambda x, w, rm, rv: ng.layer_norm(x, (3,), w), ValueError, "does not match the last"),
    (lambda x, w, rm, rv: ng.layer_norm(x, (2, 3, 4, 5), w), ValueError, "does not match"),
    (lambda x, w, rm, rv: ng.layer_norm(x, (), w), ValueError, "at least 1 dim"),
    (lambda x, w, rm, rv: ng.layer_norm(x, 4.0, w), TypeError, "int or a tuple of ints"),
    (lambda x, w, rm, rv: ng.layer_norm(x, (4,), w), ValueError, "weight of shape"),
    (lambda x, w, rm, rv: ng.layer_norm(x, (4,), None, w), ValueError, "bias of shape"),
    (lambda x, w, rm, rv: ng.layer_norm(x, (3, 4), eps=-1e-5), ValueError, "eps must be"),
    (lambda x, w, rm, rv: ng.layer_norm(x, (3, 4), eps=float("nan")), ValueError, "eps"),
    (lambda x, w, rm, rv: ng.layer_norm(x, (3, 4), w.astype(np.float32)), TypeError,
     "dtypes differ"),
    (lambda x, w, rm, rv: ng.group_norm(x, 2), ValueError, "num_groups=2 must divide"),
    (lambda x, w, rm, rv: ng.group_norm(x, 0), ValueError, "positive int"),
    (lambda x, w, rm, rv: ng.group_norm(x[0, 0], 1), ValueError, "at least 2 dims"),
    (lambda x, w, rm, rv: ng.group_norm(x, 3, w), ValueError, "weight of shape"),
    (lambda x, w, rm, rv: ng.group_norm(x, 3, eps="1e-5"), ValueError, "eps must be"),
    (lambda x, w, rm, rv: ng.batch_norm(x, rm[:2], rv, training=True), ValueError,
     "running_mean .shape"),
    (lambda x, w, rm, rv: ng.batch_norm(x, rm, rv.astype(np.float32)), ValueError,
     "running_var .shape"),
    (lambda x, w, rm, rv: ng.batch_norm(x, None, None), ValueError, "needed when not training"),
    (lambda x, w, rm, rv: ng.batch_norm(x, rm, None, training=True), ValueError, "both"),
    (lambda x, w, rm, rv: ng.batch_norm(x, rm, rv, training=True, momentum=2), ValueError,
     "momentum"),
    (lambda x, w, rm, rv: ng.batch_norm(x, rm, rv, training=True, eps=-1), ValueError, "eps"),
    (lambda x, w, rm, rv: ng.batch_norm(x, rm, rv, w, training=True), ValueError,
     "weight of shape"),
    (lambda x, w, rm, rv: ng.batch_norm(x[:1, :, :1], rm, rv, training=True), ValueError,
     "more than 1 value per channel"),
    (lambda x, w, rm, rv: ng.batch_norm(x, rm, rv, training=1), TypeError, "training must be"),
    (lambda x, w, rm, rv: ng.batch_norm(x, list(rm), list(rv)), TypeError, "running_mean must"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_input_raises_before_anything_changes(case):
    fn, kind, words = BAD[case]
    x = ng.param(np.ones((2, 3, 4)))
    w = ng.param(np.ones((3, 4)))
    rm, rv = np.zeros(3), np.ones(3)
    with ng.grad_tape():
        with pytest.raises(kind, match=words) as info:
            fn(x, w, rm, rv)
    assert any(op in str(info.value) for op in ("layer_norm", "group_norm", "batch_norm"))
    assert x.grad is None and w.grad is None
    assert np.all(x.numpy() == 1) and np.all(w.numpy() == 1)
    assert np.all(rm == 0) and np.all(rv == 1)


def test_layer_constructors_refuse_bad_arguments():
    with pytest.raises(ValueError, match="GroupNorm: num_groups=4 must divide num_channels=6"):
        ng.nn.GroupNorm(4, 6)
    with pytest.raises(ValueError, match="LayerNorm: eps"):
        ng.nn.LayerNorm(3, eps=-1.0)
    with pytest.raises(ValueError, match="BatchNorm1d: num_features"):
        ng.nn.BatchNorm1d(0)
    with pytest.raises(NotImplementedError, match="momentum=None"):
        ng.nn.BatchNorm2d(3, momentum=None)
    bn = ng.nn.BatchNorm2d(3)
    with pytest.raises(ValueError, match="BatchNorm2d: expected a 4-D input"):
        bn(ng.tensor(np.ones((2, 3))))
    assert bn.num_batches_tracked.numpy() == 0 and np.all(bn.running_mean.numpy() == 0)


# ------------------------------------------------------------ layers
def _load(mine, ref):
    state = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    assert list(mine.state_dict()) == list(state)
    assert {k: (v.shape, v.dtype) for k, v in mine.state_dict().items()} == \
        {k: (v.shape, v.dtype) for k, v in state.items()}
    mine.load_state_dict(state)


@pytest.mark.parametrize("kind, args, kw, xs", [
    ("LayerNorm", ((3, 4),), {}, (2, 3, 4)),
    ("LayerNorm", (4,), dict(bias=False), (2, 3, 4)),
    ("LayerNorm", (4,), dict(elementwise_affine=False), (2, 4)),
    ("GroupNorm", (2, 4), {}, (2, 4, 3)),
    ("GroupNorm", (4, 4), dict(affine=False, eps=1e-3), (2, 4, 2, 2)),
    ("BatchNorm1d", (3,), {}, (4, 3)),
    ("BatchNorm1d", (3,), dict(momentum=0.3), (2, 3, 5)),
    ("BatchNorm1d", (3,), dict(track_running_stats=False), (4, 3)),
    ("BatchNorm2d", (2,), dict(affine=False), (2, 2, 3, 3)),
])
def test_layers_match_torch_in_train_and_eval_mode(kind, args, kw, xs):
    """Defaults (init, buffers), a torch state dict loaded, then train steps
    (buffers updated) and eval mode against the torch module."""
    torch.manual_seed(0)
    ref = getattr(torch.nn, kind)(*args, **kw).double()
    mine = getattr(ng.nn, kind)(*args, **kw)
    for k, v in ref.state_dict().items():     # PyTorch's default init and buffers
        np.testing.assert_array_equal(mine.state_dict()[k], v.numpy(), err_msg=k)
    with torch.no_grad():                     # non-trivial params and running stats
        for p in ref.parameters():
            p.add_(torch.randn(p.shape, dtype=torch.float64))
    _load(mine, ref)
    for seed in (1, 2):
        x = inputs([xs], seed=seed)[0] * 2 + 1
        np.testing.assert_allclose(mine(ng.tensor(x)).numpy(),
                                   ref(torch.tensor(x)).detach().numpy(), rtol=1e-9, atol=1e-12)
    for k, v in ref.state_dict().items():     # buffers updated as PyTorch's
        np.testing.assert_allclose(mine.state_dict()[k], v.numpy(), rtol=1e-9, err_msg=k)
    mine.eval()
    ref.eval()
    before = mine.state_dict()
    x = inputs([xs], seed=3)[0]
    np.testing.assert_allclose(mine(ng.tensor(x)).numpy(), ref(torch.tensor(x)).detach().numpy(),
                               rtol=1e-9, atol=1e-12)
    for k, v in mine.state_dict().items():    # eval mode leaves the buffers alone
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    np.testing.assert_array_equal(mine.state_dict().get("num_batches_tracked", 0),
                                  ref.state_dict().get("num_batches_tracked", 0))


def _torch_cnn():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Conv2d(2, 4, 2), torch.nn.BatchNorm2d(4),
                               torch.nn.GroupNorm(2, 4), torch.nn.Flatten(),
                               torch.nn.Linear(16, 6), torch.nn.BatchNorm1d(6),
                               torch.nn.LayerNorm(6))


def _ng_cnn(dtype, device):
    kw = dict(dtype=dtype, device=device)
    return ng.nn.Sequential(ng.nn.Conv2d(2, 4, 2, **kw), ng.nn.BatchNorm2d(4, **kw),
                            ng.nn.GroupNorm(2, 4, **kw), ng.nn.Flatten(),
                            ng.nn.Linear(16, 6, **kw), ng.nn.BatchNorm1d(6, **kw),
                            ng.nn.LayerNorm(6, **kw))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_a_torch_models_state_dict_gives_its_eval_outputs_on_both_devices(dev, dtype):
    ref = _torch_cnn()
    if dtype == np.float64:
        ref = ref.double()
    x = inputs([(3, 2, 3, 3)], seed=13)[0].astype(dtype)
    ref(torch.tensor(x))                      # one train step: non-trivial running stats
    ref.eval()
    mine = _ng_cnn(dtype, dev.name)
    _load(mine, ref)
    mine.eval()
    tol = 1e-9 if dtype == np.float64 else 1e-5
    x = inputs([(2, 2, 3, 3)], seed=14)[0].astype(dtype)
    np.testing.assert_allclose(mine(dev.tensor(x)).numpy(), ref(torch.tensor(x)).detach().numpy(),
                               rtol=tol, atol=tol)


def test_batch_norm_buffers_move_with_the_module():
    dev = cuda_dev()
    bn = ng.nn.BatchNorm1d(2, dtype=np.float32).to(dev.name)
    assert bn.running_mean.device == dev.name and bn.num_batches_tracked.device == dev.name
    x = inputs([(3, 2)], seed=19)[0].astype(np.float32)
    bn(dev.tensor(x))
    ref = torch.nn.BatchNorm1d(2)
    ref(torch.tensor(x))
    for k, v in ref.state_dict().items():
        np.testing.assert_allclose(bn.state_dict()[k], v.detach().numpy(), rtol=1e-5, err_msg=k)


# ------------------------------------------------------------ accumulation
def test_batch_norm_running_stats_after_a_window_equal_torchs(dev):
    """Per micro-batch statistics, as in PyTorch: after a window of k=3
    micro-batches the buffers equal PyTorch's after the same micro-batches
    (and differ from one full batch's update)."""
    k = 3
    rng = np.random.default_rng(15)
    micro = [rng.normal(size=(4, 2, 2)) * 2 + 1 for _ in range(k)]
    torch.manual_seed(0)
    ref = torch.nn.BatchNorm1d(2).double()
    tref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    bn = ng.nn.BatchNorm1d(2, device=dev.name)
    opt = ng.optim.SGD(bn.parameters(), lr=0.1, accumulate_steps=k)
    for x in micro:
        with ng.grad_tape():
            loss = ng.mean(bn(dev.tensor(x)) ** 3)
        loss.backward()
        stepped = opt.step()
        (ref(torch.tensor(x)) ** 3).mean().div(k).backward()
    assert stepped
    tref_opt.step()
    for key, v in ref.state_dict().items():
        np.testing.assert_allclose(bn.state_dict()[key], v.detach().numpy(), rtol=1e-9,
                                   atol=1e-12, err_msg=key)
    full = torch.nn.BatchNorm1d(2).double()
    full(torch.tensor(np.concatenate(micro)))
    assert not np.allclose(bn.state_dict()["running_var"], full.running_var.numpy())


def _ln_gn_model(device, seed=0):
    rng = np.random.default_rng(seed)
    kw = dict(device=device)
    lin = ng.nn.Linear(3, 4, rng=rng, **kw)
    gn = ng.nn.GroupNorm(2, 4, **kw)
    ln = ng.nn.LayerNorm(4, **kw)
    head = ng.nn.Linear(4, 2, rng=rng, **kw)
    with_affine = [gn, ln]
    for m in with_affine:    # non-trivial affine params
        m.weight = ng.param(rng.normal(size=4) + 1, device=device)
        m.bias = ng.param(rng.normal(size=4), device=device)
    params = lin.parameters() + gn.parameters() + ln.parameters() + head.parameters()

    def loss_fn(x, y):
        h = ng.dropout(gn(lin(x)), p=0.0)
        return ng.mse_loss(head(ng.relu(ln(h))), y)
    return params, loss_fn


def test_layer_and_group_norm_k_micro_batches_equal_the_full_batch(dev):
    """The exact promise: with LayerNorm, GroupNorm and dropout(p=0), k
    micro-batches accumulated give the full batch's update (to 1e-8)."""
    k = 4
    rng = np.random.default_rng(16)
    x, y = rng.normal(size=(8, 3)), rng.normal(size=(8, 2))
    (pa, fa), (pb, fb) = _ln_gn_model(dev.name), _ln_gn_model(dev.name)
    oa = ng.optim.SGD(pa, lr=0.5, accumulate_steps=k)
    ob = ng.optim.SGD(pb, lr=0.5)
    for i in range(k):
        rows = slice(2 * i, 2 * i + 2)
        with ng.grad_tape():
            loss = fa(dev.tensor(x[rows]), dev.tensor(y[rows]))
        loss.backward()
        oa.step()
    with ng.grad_tape():
        loss = fb(dev.tensor(x), dev.tensor(y))
    loss.backward()
    ob.step()
    for a, b, a0 in zip(pa, pb, _ln_gn_model(dev.name)[0]):
        assert not np.allclose(a.numpy(), a0.numpy())      # an update happened
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-8)


# ------------------------------------------------------------ ng.compile
def _small_model(seed=0):
    rng = np.random.default_rng(seed)
    f32 = dict(dtype=np.float32)
    lin = ng.nn.Linear(3, 4, rng=rng, **f32)
    bn = ng.nn.BatchNorm1d(4, **f32)
    gn = ng.nn.GroupNorm(2, 4, **f32)
    ln = ng.nn.LayerNorm(4, **f32)
    head = ng.nn.Linear(4, 3, rng=rng, **f32)
    mods = [lin, bn, gn, ln, head]

    def loss_fn(x, labels):
        return ng.cross_entropy(head(ng.relu(ln(gn(bn(lin(x)))))), labels)
    return mods, loss_fn


def test_compiled_step_is_bit_identical_to_eager_with_running_stats(tmp_path):
    (ma, fa), (mb, fb) = _small_model(), _small_model()
    pa = [p for m in ma for p in m.parameters()]
    pb = [p for m in mb for p in m.parameters()]
    oa = ng.optim.Adam(pa, lr=0.01, accumulate_steps=2)
    ob = ng.optim.Adam(pb, lr=0.01, accumulate_steps=2)
    step = ng_compile(fb, optimizer=ob, cache_dir=str(tmp_path))
    rng = np.random.default_rng(17)
    batches = [(ng.tensor(rng.normal(size=(5, 3)).astype(np.float32)), rng.integers(0, 3, 5))
               for _ in range(2)]
    for i in range(6):
        x, labels = batches[i % 2]
        with ng.grad_tape():
            la = fa(x, labels)
        la.backward()
        oa.step()
        lb = step(x, labels)
        assert la.numpy().tobytes() == lb.numpy().tobytes(), i
        for a, b in zip(pa, pb):
            assert a.numpy().tobytes() == b.numpy().tobytes(), i
        for key, v in ma[1].state_dict().items():   # updated on every compiled call too
            assert v.tobytes() == mb[1].state_dict()[key].tobytes(), (i, key)
    assert int(mb[1].num_batches_tracked.numpy()) == 6
    assert step.stats[-1]["mode"] == "njit"


# ------------------------------------------------------------ CUDA launches
def test_cuda_launch_bounds():
    dev = cuda_dev()
    x, w, b = inputs([(2, 4, 3), (4,), (4,)], seed=18)
    wp, bp = dev.param(w), dev.param(b)
    rm, rv = dev.tensor(np.zeros(4)), dev.tensor(np.ones(4))
    # one fused launch forward, one for every gradient together
    for f in (lambda t: ng.group_norm(t, 2, wp, bp),
              lambda t: ng.layer_norm(t, (4, 3)),
              lambda t: ng.batch_norm(t, rm, rv, wp, bp, training=True),
              lambda t: ng.batch_norm(t, rm, rv, wp, None, training=False)):
        assert cuda_launches(f, dev.param(x)) == (1, 1)
    # the same tensor as weight and bias: one launch per gradient written (dx, dw, db)
    w3 = dev.param(w[:3])
    assert cuda_launches(lambda t: ng.layer_norm(t, 3, w3, w3), dev.param(x)) == (1, 3)


# ------------------------------------------------------------ PTX


def test_layer_norm_rows_give_one_set_of_bits_in_every_layout():
    """A layer norm's rows add in eight partial sums (the shared row
    functions, the CUDA kernels' too): the same bits from C-contiguous and
    strided arrays, forward and backward, serial and threaded, for rows of
    every length mod 8, and the float64 formula's values to rounding."""
    from numbagrad.kernels.cpu import norm

    rng = np.random.default_rng(5)
    dt = np.float32      # (float64 runs the same code; its strided twins compile for 40 s)

    def strided(a):       # a's values in a view that is not C-contiguous
        s = np.empty(a.shape[:-1] + (2,), a.dtype)[..., :1]
        s[...] = a
        return s
    for k in (1, 7, 8, 13, 128):
        shape = (37, 1, k, 1)
        x, g = (rng.normal(size=shape).astype(dt) for _ in range(2))
        w, b = (rng.normal(size=(1, k)).astype(dt) for _ in range(2))
        for has_w, has_b in AFFINE:
            got = []
            for fn, xx, make in ((norm.group_norm, x, np.empty_like),
                                 (norm.group_norm_mt, x, np.empty_like),
                                 (norm.group_norm, strided(x), lambda a: strided(a))):
                out, mean, rstd = make(x), np.empty((37, 1)), np.empty((37, 1))
                fn(xx, w, b, out, mean, rstd, 1e-5, has_w, has_b)
                got.append((np.ascontiguousarray(out), mean, rstd))
            for other in got[1:]:
                for a, c in zip(got[0], other):
                    assert a.tobytes() == c.tobytes(), (k, has_w, has_b)
            x64 = x.astype(np.float64)
            xhat = (x64 - x64.mean(2, keepdims=True)) / np.sqrt(x64.var(2, keepdims=True) + 1e-5)
            want = xhat * (w[None, :, :, None] if has_w else 1) + (b[None, :, :, None]
                                                                   if has_b else 0)
            np.testing.assert_allclose(got[0][0], want, rtol=1e-4, atol=1e-5)
            mean, rstd = got[0][1], got[0][2]
            for beta in (0.0, 0.5):
                grads = []
                for fn, xx, gg, make in ((norm.group_norm_backward, x, g, np.copy),
                                         (norm.group_norm_backward_mt, x, g, np.copy),
                                         (norm.group_norm_backward, x, strided(g), strided)):
                    dx = make(g)
                    fn(xx, w, gg, mean, rstd, dx, beta, True, w.copy(), 1.0, False, b.copy(),
                       1.0, False, has_w)
                    grads.append(np.ascontiguousarray(dx))
                assert grads[0].tobytes() == grads[1].tobytes() == grads[2].tobytes(), (k, beta)
