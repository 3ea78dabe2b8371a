"""PyTorch habits of ng.nn (issue 35): layers take ng.get_default_dtype() when
built without dtype=; Sequential(OrderedDict) names its children by the keys;
MultiheadAttention(need_weights=True) returns the attention weights, values
and gradients as torch's; ng.nn.functional holds the ops under
torch.nn.functional's names."""
import inspect
from collections import OrderedDict

import numpy as np
import pytest

import numbagrad as ng
import numbagrad.nn.functional as F
from conftest import Dev, inputs, weighted_sum
from numbagrad import nn
from numbagrad.ops.table import OPS

torch = pytest.importorskip("torch")
TF = torch.nn.functional


@pytest.fixture
def default_dtype():
    """Restores the default dtype a test sets."""
    before = ng.get_default_dtype()
    yield
    ng.set_default_dtype(before)


# ------------------------------------------------------------ default dtype
LAYERS = {
    "Linear": lambda **kw: nn.Linear(3, 2, **kw),
    "Embedding": lambda **kw: nn.Embedding(4, 3, **kw),
    "Conv1d": lambda **kw: nn.Conv1d(2, 4, 3, **kw),
    "Conv2d": lambda **kw: nn.Conv2d(2, 4, 3, **kw),
    "Conv3d": lambda **kw: nn.Conv3d(2, 4, 3, **kw),
    "ConvTranspose1d": lambda **kw: nn.ConvTranspose1d(2, 4, 3, **kw),
    "ConvTranspose2d": lambda **kw: nn.ConvTranspose2d(2, 4, 3, **kw),
    "LayerNorm": lambda **kw: nn.LayerNorm(3, **kw),
    "GroupNorm": lambda **kw: nn.GroupNorm(2, 4, **kw),
    "BatchNorm1d": lambda **kw: nn.BatchNorm1d(3, **kw),
    "BatchNorm2d": lambda **kw: nn.BatchNorm2d(3, **kw),
    "MultiheadAttention": lambda **kw: nn.MultiheadAttention(4, 2, **kw),
    "RNN": lambda **kw: nn.RNN(3, 2, **kw),
    "LSTM": lambda **kw: nn.LSTM(3, 2, **kw),
    "GRU": lambda **kw: nn.GRU(3, 2, **kw),
}


def _float_dtypes(layer):
    tensors = list(layer.parameters()) + [b for b in layer.buffers() if b.dtype.kind == "f"]
    assert tensors
    return {t.dtype for t in tensors}


def test_every_layer_with_a_dtype_defaults_to_none():
    with_dtype = sorted(name for name in nn.__all__
                        if inspect.isclass(getattr(nn, name))
                        and "dtype" in inspect.signature(getattr(nn, name)).parameters)
    assert with_dtype == sorted(LAYERS)     # a new layer with dtype= belongs in LAYERS
    for name in with_dtype:
        assert inspect.signature(getattr(nn, name)).parameters["dtype"].default is None, name


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layers_take_the_default_dtype_when_built(name, default_dtype):
    make = LAYERS[name]
    assert _float_dtypes(make()) == {np.dtype(np.float64)}
    ng.set_default_dtype(np.float32)
    layer = make()
    assert _float_dtypes(layer) == {np.dtype(np.float32)}
    assert _float_dtypes(make(dtype=np.float64)) == {np.dtype(np.float64)}
    ng.set_default_dtype(np.float64)
    assert _float_dtypes(layer) == {np.dtype(np.float32)}    # built layers keep theirs
    assert _float_dtypes(make()) == {np.dtype(np.float64)}


def test_a_float32_default_model_trains_in_float32(default_dtype):
    ng.set_default_dtype(np.float32)
    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.Linear(4, 5, rng=rng), nn.ReLU(), nn.LayerNorm(5),
                          nn.Linear(5, 2, rng=rng))
    x = rng.normal(size=(3, 4)).astype(np.float32)
    with ng.grad_tape():
        out = model(ng.tensor(x))
        loss = ng.mse_loss(out, np.zeros((3, 2), np.float32))
    loss.backward()
    assert out.dtype == np.float32
    assert all(p.grad.dtype == np.float32 for p in model.parameters())


def test_set_default_dtype_refuses_other_dtypes(default_dtype):
    with pytest.raises(TypeError, match="float32 or float64, got int64"):
        ng.set_default_dtype(np.int64)
    with pytest.raises(TypeError, match="is not a dtype"):
        ng.set_default_dtype("no such dtype")
    assert ng.get_default_dtype() == np.float64


# ------------------------------------------------------------ Sequential(OrderedDict)
def _named_pair(rng=None):
    ours = nn.Sequential(OrderedDict([("fc", nn.Linear(4, 5, rng=rng)), ("act", nn.ReLU()),
                                      ("norm", nn.BatchNorm1d(5)),
                                      ("out", nn.Linear(5, 3, rng=rng))]))
    theirs = torch.nn.Sequential(OrderedDict([
        ("fc", torch.nn.Linear(4, 5)), ("act", torch.nn.ReLU()),
        ("norm", torch.nn.BatchNorm1d(5)), ("out", torch.nn.Linear(5, 3))])).double()
    return ours, theirs


def test_sequential_ordered_dict_names_like_torch():
    ours, theirs = _named_pair(np.random.default_rng(0))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert ours.fc is ours[0] and ours.out is ours[-1] and len(ours) == 4
    assert [n for n, _ in ours.named_children()] == ["fc", "act", "norm", "out"]
    head = ours[1:3]
    assert isinstance(head, nn.Sequential) and list(head._modules) == ["act", "norm"]
    assert head.norm is ours.norm
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    (x,) = inputs([(6, 4)], seed=1)
    xt = torch.tensor(x, requires_grad=True)
    xn = ng.param(x)
    with ng.grad_tape():
        loss = weighted_sum(ours(xn), ng.tensor(np.arange(18.0).reshape(6, 3)))
    grads = ng.backward(loss)
    (theirs(xt) * torch.arange(18.0, dtype=torch.float64).reshape(6, 3)).sum().backward()
    np.testing.assert_allclose(loss.item(), (theirs(xt).detach() * torch.arange(
        18.0, dtype=torch.float64).reshape(6, 3)).sum().item(), rtol=1e-12)
    np.testing.assert_allclose(grads[xn.id], xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grads[ours.fc.weight.id], theirs.fc.weight.grad.numpy(),
                               rtol=1e-10, atol=1e-12)


def test_sequential_ordered_dict_keeps_the_fusion(monkeypatch):
    calls = []
    linear = ng.ops.linear

    def spy(x, w, b=None, activation=None, negative_slope=0.01):
        calls.append(activation)
        return linear(x, w, b, activation, negative_slope)
    monkeypatch.setattr(ng.ops, "linear", spy)
    rng = np.random.default_rng(2)
    model = nn.Sequential(OrderedDict([("fc", nn.Linear(4, 5, rng=rng)), ("act", nn.Tanh()),
                                       ("out", nn.Linear(5, 2, rng=rng))]))
    x = rng.normal(size=(3, 4))
    out = model(ng.tensor(x)).numpy()
    assert calls == ["tanh", None]
    w1, b1, w2, b2 = (p.numpy() for p in model.parameters())
    np.testing.assert_allclose(out, np.tanh(x @ w1.T + b1) @ w2.T + b2, rtol=1e-12)


@pytest.mark.parametrize("key, match", [(1, "got 1"), ("a.b", "got 'a.b'"), ("", "got ''"),
                                        ("train", "attribute 'train' already exists")])
def test_sequential_refuses_bad_keys(key, match):
    with pytest.raises(KeyError, match=match):
        nn.Sequential(OrderedDict([("fc", nn.Linear(2, 2)), (key, nn.ReLU())]))


def test_sequential_refuses_non_modules_and_plain_dicts():
    with pytest.raises(TypeError, match="'act': int is not an ng.nn.Module"):
        nn.Sequential(OrderedDict([("fc", nn.Linear(2, 2)), ("act", 3)]))
    with pytest.raises(TypeError, match="argument 0 is dict.*pass an OrderedDict"):
        nn.Sequential({"fc": nn.Linear(2, 2)})
    seq = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="integers or slices, not str"):
        seq["0"]
    with pytest.raises(IndexError, match="index 1 is out of range for 1 modules"):
        seq[1]


# ------------------------------------------------------------ MultiheadAttention weights
E, H = 8, 2


def _mha_pair(dev=Dev("cpu"), seed=0, **kw):
    torch.manual_seed(seed)
    theirs = torch.nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64, **kw)
    ours = nn.MultiheadAttention(E, H, device=dev.name, rng=np.random.default_rng(0), **kw)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    return ours, theirs


def _masks(mask, n, length, s):
    """(our keyword arguments, torch's) for one masking case."""
    rng = np.random.default_rng(4)
    padding = np.zeros((n, s), bool)
    padding[0, -1] = padding[1, 1] = True   # (no row of the causal cases fully masked)
    if mask == "bool":
        am = np.triu(np.ones((length, s), bool), 1)
        return dict(attn_mask=am), dict(attn_mask=torch.tensor(am))
    if mask == "float":
        am = rng.normal(size=(n * H, length, s))
        return dict(attn_mask=am), dict(attn_mask=torch.tensor(am))
    if mask == "causal":
        am = torch.nn.Transformer.generate_square_subsequent_mask(length, dtype=torch.float64)
        return dict(is_causal=True), dict(attn_mask=am[:, :s], is_causal=True)
    if mask == "padding":
        return dict(key_padding_mask=padding), dict(key_padding_mask=torch.tensor(padding))
    if mask == "padding+float":
        am, kpm = rng.normal(size=(length, s)), rng.normal(size=(n, s))
        return (dict(attn_mask=am, key_padding_mask=kpm),
                dict(attn_mask=torch.tensor(am), key_padding_mask=torch.tensor(kpm)))
    if mask == "padding+causal":
        am = torch.nn.Transformer.generate_square_subsequent_mask(length, dtype=torch.float64)
        return (dict(is_causal=True, key_padding_mask=padding),
                dict(attn_mask=am[:, :s],
                     key_padding_mask=torch.tensor(np.where(padding, -np.inf, 0.0))))
    return {}, {}


MASKS = [None, "bool", "float", "causal", "padding", "padding+float", "padding+causal"]


@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("mask", MASKS)
def test_mha_weights_match_torch(mask, average):
    ours, theirs = _mha_pair()
    self_attention = mask is not None and "causal" in mask
    x0, y0 = inputs([(2, 3, E), (2, 4, E)], seed=12)
    y0 = x0 if self_attention else y0
    kw, tkw = _masks(mask, 2, 3, y0.shape[1])
    x, y = ng.param(x0), ng.param(y0)
    xt, yt = (torch.tensor(a, requires_grad=True) for a in (x0, y0))
    want, want_w = theirs(xt, yt, yt, need_weights=True, average_attn_weights=average, **tkw)
    g_out, g_w = inputs([tuple(want.shape), tuple(want_w.shape)], seed=5)
    with ng.grad_tape():
        out, weights = ours(x, y, y, need_weights=True, average_attn_weights=average, **kw)
        loss = weighted_sum(out, ng.tensor(g_out)) + weighted_sum(weights, ng.tensor(g_w))
    grads = ng.backward(loss)
    ((want * torch.tensor(g_out)).sum() + (want_w * torch.tensor(g_w)).sum()).backward()
    assert weights.shape == tuple(want_w.shape) == ((2, 3, y0.shape[1]) if average
                                                    else (2, H, 3, y0.shape[1]))
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(weights.numpy(), want_w.detach().numpy(), rtol=1e-9,
                               atol=1e-12)
    fused, none = ours(x0, y0, y0, **kw)
    assert none is None
    np.testing.assert_allclose(out.numpy(), fused.numpy(), rtol=1e-12, atol=1e-14)
    pairs = [(x, xt), (ours.in_proj_weight, theirs.in_proj_weight),
             (ours.in_proj_bias, theirs.in_proj_bias)]
    pairs += [] if self_attention else [(y, yt)]
    for p, t in pairs:
        np.testing.assert_allclose(grads[p.id], t.grad.numpy(), rtol=1e-8, atol=1e-11)


@pytest.mark.parametrize("average", [True, False])
def test_mha_weights_unbatched_and_sequence_first(average):
    torch.manual_seed(1)
    theirs = torch.nn.MultiheadAttention(E, H, dtype=torch.float64)
    ours = nn.MultiheadAttention(E, H, batch_first=False)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    x0, y0 = inputs([(3, 2, E), (5, 2, E)], seed=7)            # (L, N, E), (S, N, E)
    for q, kv in ((x0, y0), (x0[:, 0], y0[:, 0])):
        kpm = np.zeros(kv.shape[:-1][::-1], bool)
        kpm[..., 1] = True
        want, want_w = theirs(torch.tensor(q), torch.tensor(kv), torch.tensor(kv),
                              key_padding_mask=torch.tensor(kpm),
                              average_attn_weights=average)
        out, weights = ours(q, kv, kv, kpm, True, average_attn_weights=average)
        np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(weights.numpy(), want_w.detach().numpy(), rtol=1e-9,
                                   atol=1e-12)
    assert weights.shape == ((3, 5) if average else (H, 3, 5))


def test_mha_weights_on_cuda_match_the_cpu():
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here: " + str(ng.kernels.cuda_unavailable_reason()))
    (cpu, _), (gpu, _) = _mha_pair(), _mha_pair(Dev("cuda"))
    x0, y0 = inputs([(2, 3, E), (2, 4, E)], seed=12)
    kw, _ = _masks("padding+float", 2, 3, 4)
    want = cpu(x0, y0, y0, need_weights=True, **kw)
    got = gpu(ng.tensor(x0, device="cuda"), ng.tensor(y0, device="cuda"),
              ng.tensor(y0, device="cuda"), need_weights=True, **kw)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-9, atol=1e-12)


def test_mha_weights_with_dropout_are_the_ones_applied():
    ours, _ = _mha_pair(dropout=0.5)
    x0, y0 = inputs([(2, 3, E), (2, 4, E)], seed=3)
    ng.manual_seed(0)
    out, weights = ours(x0, y0, y0, need_weights=True, average_attn_weights=False)
    w = weights.numpy()
    e = ours.embed_dim
    wv = ours.in_proj_weight.numpy()[2 * e:]
    bv = ours.in_proj_bias.numpy()[2 * e:]
    v = (y0 @ wv.T + bv).reshape(2, 4, H, E // H).transpose(0, 2, 1, 3)
    heads = (w @ v).transpose(0, 2, 1, 3).reshape(2, 3, E)
    expect = heads @ ours.out_proj.weight.numpy().T + ours.out_proj.bias.numpy()
    np.testing.assert_allclose(out.numpy(), expect, rtol=1e-10, atol=1e-12)
    assert (w == 0).any() and not np.allclose(w.sum(-1), 1.0)     # dropped, then scaled
    ours.eval()
    _, weights = ours(x0, y0, y0, need_weights=True, average_attn_weights=False)
    np.testing.assert_allclose(weights.numpy().sum(-1), 1.0, rtol=1e-12)
    kept = w != 0
    np.testing.assert_allclose(w[kept], 2.0 * weights.numpy()[kept], rtol=1e-10)


def test_mha_bad_arguments_raise():
    ours, _ = _mha_pair()
    x = np.ones((2, 3, E))
    with pytest.raises(TypeError, match="need_weights must be a bool, got 'yes'"):
        ours(x, x, x, need_weights="yes")
    with pytest.raises(ValueError, match=r"key_padding_mask must be \(N, S\) = \(2, 3\), got "
                                         r"\(3,\)"):
        ours(x, x, x, key_padding_mask=np.zeros(3, bool))
    with pytest.raises(TypeError, match="key_padding_mask must be boolean or of the query's "
                                        "dtype float64, got float32"):
        ours(x, x, x, key_padding_mask=np.zeros((2, 3), np.float32))


# ------------------------------------------------------------ ng.nn.functional
def test_functional_exports_the_ops_under_torchs_names():
    assert F is ng.nn.functional
    assert F.__all__ and len(set(F.__all__)) == len(F.__all__)
    for name in F.__all__:
        assert getattr(F, name) is getattr(ng, name), name
        assert callable(getattr(TF, name)), name
    assert F._TORCH_NAMES <= set(dir(TF))             # no misspelt name in the module's list
    torch_functions = {n for n in dir(TF) if not n.startswith("_") and (
        inspect.isfunction(getattr(TF, n)) or inspect.isbuiltin(getattr(TF, n)))}
    table = {op.name for op in OPS}
    assert sorted(table & torch_functions) == sorted(set(F.__all__) | set(F._DIFFERENT))
    for name in ("relu", "softmax", "cross_entropy", "conv2d", "scaled_dot_product_attention"):
        assert name in F.__all__
    with pytest.raises(AttributeError, match="no 'pad': ng.pad takes NumPy's pad_width"):
        F.pad
    with pytest.raises(AttributeError, match="no attribute 'no_such_op'"):
        F.no_such_op


def test_a_net_written_with_functional_matches_torchs():
    rng = np.random.default_rng(9)
    x0 = rng.normal(size=(2, 2, 8, 8))
    conv_w, conv_b = rng.normal(size=(3, 2, 3, 3)) * 0.3, rng.normal(size=3)
    fc_w, fc_b = rng.normal(size=(5, 12)) * 0.3, rng.normal(size=5)
    ln_w, ln_b = 1 + 0.1 * rng.normal(size=5), 0.1 * rng.normal(size=5)
    emb = rng.normal(size=(6, 5))
    labels = np.array([1, 4])

    def net(f, x, params, idx):
        cw, cb, fw, fb, lw, lb, e = params
        h = f.max_pool2d(f.relu(f.conv2d(x, cw, cb, padding=1)), 2, stride=2)
        h = f.avg_pool2d(h, 2).reshape((2, 12))
        h = f.gelu(f.linear(h, fw, fb), approximate="tanh")
        h = f.layer_norm(h, (5,), lw, lb) + f.embedding(idx, e)
        h = f.dropout(f.silu(h), p=0.5, training=False)
        return (f.cross_entropy(h, idx, label_smoothing=0.1)
                + f.nll_loss(f.log_softmax(h, dim=1), idx, reduction="sum")
                + f.mse_loss(f.softmax(h, dim=-1), f.sigmoid(h)))

    arrays = [x0, conv_w, conv_b, fc_w, fc_b, ln_w, ln_b, emb]
    ours = [ng.param(a) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    with ng.grad_tape():
        loss = net(F, ours[0], ours[1:], labels)
    grads = ng.backward(loss)
    want = net(TF, theirs[0], theirs[1:], torch.tensor(labels))
    want.backward()
    np.testing.assert_allclose(loss.item(), want.item(), rtol=1e-10)
    for p, t in zip(ours, theirs):
        np.testing.assert_allclose(grads[p.id], t.grad.numpy(), rtol=1e-8, atol=1e-11)
