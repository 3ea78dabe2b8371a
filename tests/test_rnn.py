"""nn.RNN, nn.LSTM and nn.GRU against PyTorch: a torch state dict loads and gives
torch's outputs, final states and gradients (input, initial state, every
param) for two layers, batch_first both ways, unbatched and bidirectional
input, on both devices; state-dict keys and init; gradcheck; inter-layer
dropout; ng.compile; bad input."""
import numpy as np
import pytest

import numbagrad as ng
from conftest import Dev, compiled_matches_eager, cuda_dev

torch = pytest.importorskip("torch")

KINDS = ["RNN", "LSTM", "GRU"]
CPU = Dev("cpu")


def _pair(kind, dev, input_size=5, hidden=4, dtype=np.float64, seed=0, **kw):
    """(torch module, numbagrad module with the torch module's state dict)."""
    torch.manual_seed(seed)
    t = getattr(torch.nn, kind)(input_size, hidden, dtype=getattr(torch, np.dtype(dtype).name),
                                **kw)
    m = getattr(ng.nn, kind)(input_size, hidden, dtype=dtype, device=dev.name,
                             rng=np.random.default_rng(seed), **kw)
    m.load_state_dict({k: v.detach().numpy() for k, v in t.state_dict().items()})
    return t, m


def _states(kind, shape, rng, dev):
    """Random initial states of ``shape``: host arrays and (torch, numbagrad) leaves."""
    arrays = [rng.normal(size=shape) for _ in range(2 if kind == "LSTM" else 1)]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    ns = [dev.param(a) for a in arrays]
    pack = (lambda s: tuple(s)) if kind == "LSTM" else (lambda s: s[0])
    return ts, ns, pack(ts), pack(ns)


def _finals(kind, h):
    return list(h) if kind == "LSTM" else [h]


def _check_against_torch(kind, dev, x0, with_hx, hidden=4, rtol=1e-9, atol=1e-12, **kw):
    """Outputs, final states and every gradient of a weighted loss match torch's."""
    t, m = _pair(kind, dev, input_size=x0.shape[-1], hidden=hidden, **kw)
    assert list(m.state_dict()) == list(t.state_dict())
    rng = np.random.default_rng(1)
    layers = t.num_layers * (2 if t.bidirectional else 1)
    hshape = (layers, hidden) if x0.ndim == 2 else \
        (layers, x0.shape[0 if t.batch_first else 1], hidden)
    ts, ns, targ, narg = _states(kind, hshape, rng, dev) if with_hx else ([], [], None, None)
    xt, x = torch.tensor(x0, requires_grad=True), dev.param(x0)
    out_t, h_t = t(xt, targ)
    finals_t = _finals(kind, h_t)
    weights = [rng.normal(size=tuple(a.shape)) for a in [out_t] + finals_t]
    sum(((a * torch.tensor(w)).sum() for a, w in zip([out_t] + finals_t, weights))).backward()
    with ng.grad_tape():
        out, h = m(x, narg)
        finals = _finals(kind, h)
        loss = sum((a * dev.tensor(w)).sum() for a, w in zip([out] + finals, weights))
    grads = ng.backward(loss)
    for got, want in zip([out] + finals, [out_t] + finals_t, strict=True):
        np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=rtol, atol=atol)
    named = dict(m.named_parameters())
    pairs = [(x, xt, "input")] + [(n, s, "hx") for n, s in zip(ns, ts)] + \
        [(named[k], p, k) for k, p in t.named_parameters()]
    for p, want, name in pairs:
        np.testing.assert_allclose(dev.host(grads[p.id]), want.grad.numpy(), rtol=rtol,
                                   atol=atol, err_msg=name)


# (input shape, initial state given, constructor arguments); input_size 5
CONFIGS = {
    "time-major-hx": ((3, 2, 5), True, dict(num_layers=2)),
    "batch-first": ((2, 3, 5), False, dict(num_layers=2, batch_first=True)),
    "batch-first-hx": ((2, 3, 5), True, dict(num_layers=2, batch_first=True)),
    "unbatched": ((3, 5), True, dict(num_layers=2, batch_first=True)),
    "bidirectional": ((3, 2, 5), True, dict(num_layers=2, bidirectional=True)),
    "bidirectional-batch-first": ((2, 3, 5), False, dict(num_layers=2, bidirectional=True,
                                                         batch_first=True)),
}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("kind", KINDS)
def test_matches_torch_on_cpu(kind, config):
    shape, with_hx, kw = CONFIGS[config]
    x0 = np.random.default_rng(2).normal(size=shape)
    _check_against_torch(kind, CPU, x0, with_hx, **kw)


@pytest.mark.parametrize("kind, kw", [("RNN", dict(nonlinearity="relu")),
                                      ("LSTM", dict(bias=False)), ("GRU", dict(bias=False))])
def test_relu_and_no_bias_match_torch(kind, kw):
    x0 = np.random.default_rng(3).normal(size=(3, 2, 5))
    _check_against_torch(kind, CPU, x0, kind != "GRU", num_layers=2, **kw)
    _check_against_torch(kind, CPU, x0, kind == "GRU", num_layers=1, **kw)


@pytest.mark.parametrize("kind", KINDS)
def test_matches_torch_on_cuda(kind):
    # the simulator: seq 3, batch 2, hidden 3, two layers, batch_first and an initial state
    dev = cuda_dev()
    x0 = np.random.default_rng(4).normal(size=(2, 3, 4))
    _check_against_torch(kind, dev, x0, True, hidden=3, num_layers=2, batch_first=True)


@pytest.mark.parametrize("kind", ["LSTM"])
def test_float32_matches_torch(kind):
    # float32: the LSTM's CPU kernels take their vectorised path (RNN and GRU are
    # compositions of ops whose float32 paths their own tests cover; a cold
    # float32 compile of each costs a minute of CI): values and gradients
    x0 = np.random.default_rng(5).normal(size=(4, 3, 5)).astype(np.float32)
    t, m = _pair(kind, CPU, dtype=np.float32, num_layers=2)
    xt, x = torch.tensor(x0, requires_grad=True), ng.param(x0)
    out_t, _ = t(xt)
    w = np.random.default_rng(6).normal(size=tuple(out_t.shape)).astype(np.float32)
    (out_t * torch.tensor(w)).sum().backward()
    with ng.grad_tape():
        out, _ = m(x)
        loss = (out * ng.tensor(w)).sum()
    grads = ng.backward(loss)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.numpy(), out_t.detach().numpy(), rtol=1e-5, atol=1e-6)
    named = dict(m.named_parameters())
    for p, want in [(x, xt)] + [(named[k], p) for k, p in t.named_parameters()]:
        np.testing.assert_allclose(grads[p.id], want.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_lstm_threaded_twin_matches_torch_and_its_one_thread_blocks(monkeypatch):
    # the layer kernels' threaded twins split the batch rows over the threads: an
    # odd batch (uneven blocks), both directions, an initial state; then the
    # twins' bits against their blocks run on one thread (the governor's choice)
    from numbagrad.kernels import cpu
    monkeypatch.setattr(cpu, "MT_MIN", 1)
    x0 = np.random.default_rng(9).normal(size=(3, 5, 4))
    _check_against_torch("LSTM", CPU, x0, True, num_layers=2, bidirectional=True)
    rnn = cpu.rnn
    rng = np.random.default_rng(10)
    steps, batch, n = 4, 5, 3
    proj, w = rng.normal(size=(steps, batch, 4 * n)), rng.normal(size=(4 * n, n))
    h0, c0 = rng.normal(size=(batch, n)), rng.normal(size=(batch, n))
    gy = rng.normal(size=(2, steps, batch, n))
    outs = []
    for fwd, bwd in ((rnn.lstm_layer_mt, rnn.lstm_layer_backward_mt),
                     (rnn.lstm_layer_st, rnn.lstm_layer_backward_st)):
        y, act = np.empty((2, steps, batch, n)), np.empty((steps, batch, 4 * n))
        fwd(proj, w, np.empty((n, 4 * n)), h0, c0, True, True, y, act, np.empty((batch, 4 * n)))
        dg, carry = np.empty_like(act), np.empty((2, batch, n))
        bwd(gy, y, act, w, c0, True, True, dg, carry, np.empty_like(carry))
        outs.append((y, dg, carry))
    for a, b in zip(*outs):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_keys_shapes_and_init_are_torchs(kind):
    for kw in (dict(num_layers=2), dict(num_layers=2, bidirectional=True, bias=False)):
        t = getattr(torch.nn, kind)(5, 4, **kw)
        m = getattr(ng.nn, kind)(5, 4, rng=np.random.default_rng(0), dtype=np.float32, **kw)
        assert [(k, tuple(v.shape)) for k, v in t.state_dict().items()] == \
            [(k, v.shape) for k, v in m.state_dict().items()]
        bound = 1 / np.sqrt(4)
        for name, p in m.named_parameters():
            a = p.numpy()
            assert a.dtype == np.float32 and np.abs(a).max() <= bound, name
        flat = np.concatenate([p.numpy().ravel() for p in m.parameters()])
        assert flat.min() < -0.8 * bound and flat.max() > 0.8 * bound and flat.std() > 0.2
    again = getattr(ng.nn, kind)(5, 4, 2, rng=np.random.default_rng(0), dtype=np.float32)
    first = getattr(ng.nn, kind)(5, 4, 2, rng=np.random.default_rng(0), dtype=np.float32)
    for a, b in zip(again.parameters(), first.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck(kind):
    rng = np.random.default_rng(6)
    m = getattr(ng.nn, kind)(2, 2, 2, bidirectional=kind == "GRU", dtype=np.float64, rng=rng)
    layers = 4 if kind == "GRU" else 2
    x = ng.param(rng.normal(size=(3, 1, 2)))
    hs = [ng.param(rng.normal(size=(layers, 1, 2))) for _ in range(2 if kind == "LSTM" else 1)]
    w = ng.tensor(rng.normal(size=(3, 1, 2 * (1 + (kind == "GRU")))))

    def loss():
        out, h = m(x, tuple(hs) if kind == "LSTM" else hs[0])
        return (out * w).sum() + sum((q * q).sum() for q in _finals(kind, h))
    ng.gradcheck(loss, [x, *hs, *m.parameters()])


def test_dropout_between_layers_in_training_only():
    rng = np.random.default_rng(7)
    x0 = rng.normal(size=(3, 2, 5))
    t, m = _pair("LSTM", CPU, num_layers=2, dropout=1.0)
    m.eval()                       # eval: no dropout, torch's output
    np.testing.assert_allclose(m(x0)[0].numpy(), t.eval()(torch.tensor(x0))[0].detach().numpy(),
                               rtol=1e-9, atol=1e-12)
    m.train()                      # p = 1: the second layer sees zeros
    top = torch.nn.LSTM(4, 4, dtype=torch.float64)
    top.load_state_dict({k.replace("l1", "l0"): v for k, v in t.state_dict().items()
                         if "l1" in k})
    want, (h_top, _) = top(torch.zeros(3, 2, 4, dtype=torch.float64))
    out, (h, _) = m(x0)
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(h.numpy()[1], h_top.detach().numpy()[0], rtol=1e-9, atol=1e-12)
    with pytest.warns(UserWarning, match="no effect with num_layers=1"):
        ng.nn.GRU(3, 3, dropout=0.5)


def _model(seed=0):
    rng = np.random.default_rng(seed)
    lstm = ng.nn.LSTM(3, 4, 2, batch_first=True, dropout=0.3, dtype=np.float32, rng=rng)
    head = ng.nn.Linear(4, 2, dtype=np.float32, rng=rng)

    def loss_fn(x, y):
        out, (h, c) = lstm(x)
        return ng.mse_loss(head(out[:, -1]), y) + (c * c).mean()
    return lstm.parameters() + head.parameters(), loss_fn


def test_compiled_training_step_is_bit_identical_to_eager(tmp_path):
    def make():
        params, loss_fn = _model()
        return params, loss_fn, ng.optim.Adam(params, lr=0.01, accumulate_steps=2)
    rng = np.random.default_rng(8)
    batches = [(ng.tensor(rng.normal(size=(2, 3, 3)).astype(np.float32)),
                ng.tensor(rng.normal(size=(2, 2)).astype(np.float32))) for _ in range(2)]
    step = compiled_matches_eager(make, [batches[i % 2] for i in range(4)], tmp_path, same_random=True)
    assert step.stats[-1]["mode"] == "njit"


@pytest.mark.parametrize("make, args, exc, match", [
    (lambda: ng.nn.LSTM(5, 4), [np.zeros((3, 2, 6))], ValueError,
     r"input.size\(-1\) must be equal to input_size: expected 5, got input of shape "
     r"\(3, 2, 6\)"),
    (lambda: ng.nn.GRU(5, 4), [np.zeros((1, 3, 2, 5))], ValueError,
     r"input must be 3-D \(L, N, H_in\) or 2-D unbatched"),
    (lambda: ng.nn.RNN(5, 4, 2), [np.zeros((3, 2, 5)), np.zeros((1, 2, 4))], ValueError,
     r"h_0 must have shape \(2, 2, 4\).*input of shape \(3, 2, 5\), got \(1, 2, 4\)"),
    (lambda: ng.nn.RNN(5, 4, batch_first=True), [np.zeros((3, 2, 5)), np.zeros((1, 2, 4))],
     ValueError, r"h_0 must have shape \(1, 3, 4\)"),
    (lambda: ng.nn.LSTM(5, 4), [np.zeros((3, 5)), (np.zeros((1, 4)), np.zeros((1, 1, 4)))],
     ValueError, r"c_0 must have shape \(1, 4\)"),
    (lambda: ng.nn.LSTM(5, 4), [np.zeros((3, 2, 5)), np.zeros((1, 2, 4))], TypeError,
     r"hx must be a tuple \(h_0, c_0\)"),
    (lambda: ng.nn.LSTM(5, 4), [np.zeros((0, 2, 5))], ValueError, "sequence length is 0"),
    (lambda: ng.nn.GRU(5, 4, dtype=np.float32), [np.zeros((3, 2, 5))], TypeError,
     r"must have the parameters' dtype and device \(float32, on cpu\)"),
])
def test_bad_input_raises_clearly(make, args, exc, match):
    m = make()
    before = [p.numpy().copy() for p in m.parameters()]
    with pytest.raises(exc, match=match):
        m(*args)
    for p, b in zip(m.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), b)


def test_bad_arguments_raise():
    with pytest.raises(NotImplementedError, match="proj_size=2"):
        ng.nn.LSTM(5, 4, proj_size=2)
    with pytest.raises(ValueError, match="nonlinearity must be 'tanh' or 'relu', got 'gelu'"):
        ng.nn.RNN(5, 4, nonlinearity="gelu")
    with pytest.raises(ValueError, match="hidden_size must be a positive integer, got 0"):
        ng.nn.GRU(5, 0)
    with pytest.raises(ValueError, match=r"dropout must be a probability in \[0, 1\]"):
        ng.nn.LSTM(5, 4, 2, dropout=1.5)
    with pytest.raises(TypeError, match="batch_first must be a bool"):
        ng.nn.LSTM(5, 4, batch_first=1)
    assert repr(ng.nn.LSTM(5, 4, 2, batch_first=True)) == \
        "LSTM(5, 4, num_layers=2, batch_first=True)"
    assert repr(ng.nn.RNN(5, 4, nonlinearity="relu")) == "RNN(5, 4, nonlinearity='relu')"
