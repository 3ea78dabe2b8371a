"""Half precision (ops/half.py): float16 and bfloat16 tensors against PyTorch's."""
import subprocess
import sys

import numpy as np
import pytest

import numbagrad as ng
from numbagrad import kernels

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

HALVES = [(np.dtype(np.float16), torch.float16), (np.dtype(ml_dtypes.bfloat16), torch.bfloat16)]
ULP = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


def _t(x):
    """A host array (half, float32) as a torch tensor of the same dtype."""
    if x.dtype == ml_dtypes.bfloat16:
        return torch.tensor(x.astype(np.float32)).to(torch.bfloat16)
    return torch.tensor(x)


def _f32(x):
    return np.asarray(x).astype(np.float32)


def _close(got, want, tdt, ulps=2):
    """``got`` (a half array) within ``ulps`` of ``want``'s magnitude in units of the format."""
    want = want.detach().float().numpy() if isinstance(want, torch.Tensor) else want
    tol = ulps * ULP[tdt] * np.maximum(np.abs(want), 1.0)
    assert np.all(np.abs(_f32(got) - want) <= tol), (_f32(got), want)


@pytest.mark.parametrize("kind, dtype", [(0, np.float16), (1, ml_dtypes.bfloat16)])
def test_the_casts_give_numpys_bits(kind, dtype):
    # every half value widened, and float32s (random bits, halfway cases,
    # overflow, subnormals, inf, nan) rounded to nearest even
    cpu = kernels.get("cpu")
    bits = np.arange(2 ** 16, dtype=np.uint16)
    wide = np.empty(bits.size, np.float32)
    cpu.half_to_float(bits, wide.view(np.uint32), kind)
    want = bits.view(dtype).astype(np.float32)
    assert np.array_equal(wide, want, equal_nan=True)
    rng = np.random.default_rng(0)
    with np.errstate(invalid="ignore"):
        x = np.concatenate([rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32)
                            .view(np.float32), want * np.float32(1 + 2 ** -11), want,
                            np.float32([65520, 65519.99, 2 ** -25, 3 * 2 ** -25, np.inf, -0.0])])
    out = np.empty(x.size, np.uint16)
    cpu.float_to_half(x.view(np.uint32), out, kind)
    with np.errstate(all="ignore"):
        ref = x.astype(dtype)
    same = (out == ref.view(np.uint16)) | (np.isnan(x))
    assert same.all(), x[~same][:5]


def test_promotion_is_torchs():
    dts = [ng.float16, ng.bfloat16, ng.float32, ng.float64, ng.int64, ng.bool]
    tdt = {ng.float16: torch.float16, ng.bfloat16: torch.bfloat16, ng.float32: torch.float32,
           ng.float64: torch.float64, ng.int64: torch.int64, ng.bool: torch.bool}
    for a in dts:
        for b in dts:
            assert tdt[ng.promote_types(a, b)] == torch.promote_types(tdt[a], tdt[b]), (a, b)
        t = ng.tensor(np.zeros(2), dtype=a)
        for number in (1, 2.5, True) if a in (ng.float16, ng.bfloat16) else ():
            want = torch.result_type(torch.zeros(2, dtype=tdt[a]), number)
            assert tdt[ng.result_type(t, number)] == want, (a, number)


@pytest.mark.parametrize("dtype, tdt", HALVES)
def test_creation_casts_and_numpy(dev, dtype, tdt):
    x = np.float32([[1.0, -2.5, 1e-3], [7000.0, 0.1, -0.0]])
    t = dev.tensor(x).to(dtype)
    assert t.dtype == dtype and t.device == dev.name and t.is_floating_point()
    host = t.numpy()
    assert host.dtype == dtype and np.array_equal(host, x.astype(dtype))
    assert np.array_equal(dev.tensor(x.astype(dtype)).numpy(), host)
    assert np.array_equal(t.to(ng.float64).numpy(), x.astype(dtype).astype(np.float64))
    assert np.array_equal(t.astype(ng.int64).numpy(), _t(x.astype(dtype)).long().numpy())
    other = ng.float16 if dtype != ng.float16 else ng.bfloat16
    assert np.array_equal(_f32(t.to(other).numpy()), _t(host).to(
        torch.float16 if other == ng.float16 else torch.bfloat16).float().numpy(),
        equal_nan=True)
    assert dev.param(x, dtype=dtype).dtype == dtype


@pytest.mark.parametrize("dtype, tdt", HALVES)
def test_matmul_and_linear_accumulate_in_float32(dtype, tdt):
    # k = 512 terms of 1 + tiny: a half accumulator would stall at 256/512
    # where float32 accumulation gives the exact sum, rounded once
    rng = np.random.default_rng(1)
    a = (1 + rng.random((3, 512)) * 2 ** -6).astype(dtype)
    b = np.ones((512, 2), dtype)
    w = rng.normal(size=(4, 512)).astype(dtype)
    want = (_f32(a).astype(np.float64) @ _f32(b)).astype(np.float32).astype(dtype)
    assert np.array_equal(ng.matmul(ng.tensor(a), ng.tensor(b)).numpy(), want)
    got = ng.linear(ng.tensor(a), ng.tensor(w)).numpy()
    _close(got, torch.nn.functional.linear(_t(a), _t(w)), tdt, ulps=1)
    stack = ng.tensor(a.reshape(3, 1, 1, 512)) @ ng.tensor(np.ones((2, 512, 3), dtype))
    assert stack.dtype == dtype and stack.shape == (3, 2, 1, 3)
    _close(stack.numpy(), _t(a.reshape(3, 1, 1, 512)) @ torch.ones(2, 512, 3, dtype=tdt), tdt,
           1)


def test_a_bfloat16_forward_matches_torch_autocast():
    # torch.autocast(bfloat16) on the CPU: float32 weights, linear layers fed
    # bfloat16 (their outputs bfloat16), the loss in float32; here the same casts
    # written out: values and the float32 weights' gradients
    rng = np.random.default_rng(3)
    x0 = rng.normal(size=(8, 16)).astype(np.float32)
    w1, w2 = (rng.normal(size=s).astype(np.float32) * 0.3 for s in ((32, 16), (4, 32)))
    tw1, tw2 = (torch.tensor(w, requires_grad=True) for w in (w1, w2))
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        th = torch.nn.functional.linear(torch.tensor(x0), tw1).relu()
        tout = torch.nn.functional.linear(th, tw2)
    assert tout.dtype == torch.bfloat16
    (tout.float() ** 2).mean().backward()
    W1, W2 = ng.param(w1), ng.param(w2)
    bf = ng.bfloat16
    with ng.grad_tape():
        x = ng.tensor(x0).to(bf)
        h = ng.relu(ng.linear(x, W1.to(bf)))
        out = ng.linear(h, W2.to(bf))
        loss = (out.float() ** 2).mean()
    loss.backward()
    assert out.dtype == bf
    _close(out.numpy(), tout, torch.bfloat16, ulps=2)
    for got, want in ((W1.grad, tw1.grad), (W2.grad, tw2.grad)):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want.numpy(), rtol=0.05, atol=0.02 * np.abs(
            want.numpy()).max())


@pytest.mark.parametrize("dtype, tdt", HALVES)
def test_ops_and_gradients_against_torch(dtype, tdt):
    # a small network in halves: values against torch's half ops, gradients
    # (halves, as torch's) against the float32 gradients of the same values
    rng = np.random.default_rng(2)
    x = rng.normal(size=(4, 6)).astype(dtype)
    w = (rng.normal(size=(5, 6)) * 0.5).astype(dtype)
    b = rng.normal(size=(5,)).astype(dtype)
    g = rng.normal(size=(5,)).astype(dtype)
    labels = np.array([0, 3, 4, 1])

    def run(lib, X, W, B, G):
        if lib is ng:
            h = ng.linear(X, W, B, activation="gelu")
            h = ng.layer_norm(h, (5,), G) * 2.0 - ng.softmax(h, -1)
            return h, ng.cross_entropy(h, labels) + ng.mean(ng.exp(h) / 4)
        F = torch.nn.functional
        h = F.gelu(F.linear(X, W, B))
        h = F.layer_norm(h, (5,), G) * 2.0 - torch.softmax(h, -1)
        return h, F.cross_entropy(h, torch.tensor(labels)) + torch.mean(torch.exp(h) / 4)

    params = [ng.param(v) for v in (x, w, b, g)]
    with ng.grad_tape():
        h, loss = run(ng, *params)
    loss.backward()
    assert h.dtype == dtype and loss.dtype == dtype
    th = [_t(v).requires_grad_() for v in (x, w, b, g)]
    th_h, th_loss = run(torch, *th)
    _close(h.numpy(), th_h, tdt, ulps=4)
    _close(loss.numpy(), th_loss, tdt, ulps=4)
    # float32 reference on the same (half) values: the half gradient is its rounding
    ref = [torch.tensor(_f32(v), requires_grad=True) for v in (x, w, b, g)]
    run(torch, *ref)[1].backward()
    for p, r in zip(params, ref):
        assert p.grad.dtype == dtype
        _close(p.grad, r.grad, tdt, ulps=8)


def test_reductions_compute_in_float32():
    # 4096 ones summed: a float16 accumulator would stop at 2048
    x = ng.tensor(np.ones(4096, np.float16))
    assert ng.sum(x).item() == 4096.0 and ng.sum(x).dtype == np.float16
    assert np.float32(ng.mean(x).item()) == 1.0
    v = ng.tensor((np.arange(8) % 3).astype(np.float16))
    assert np.array_equal(ng.max(v, axis=0).values.numpy(), np.float16(2))
    assert v.argmax().item() == 2


@pytest.mark.parametrize("dtype, tdt", HALVES)
def test_mixed_operands_promote(dtype, tdt):
    h = ng.tensor(np.float32([1.5, 2.0])).to(dtype)
    f = ng.tensor(np.float32([0.25, 1.0]))
    assert (h + f).dtype == np.float32 and (h + 1).dtype == dtype
    assert (h * ng.tensor([2, 3])).dtype == dtype
    with pytest.raises(TypeError, match="dtypes differ"):
        ng.matmul(h, f)


@pytest.mark.parametrize("dtype, tdt", HALVES)
def test_cuda_matches_cpu(dtype, tdt):
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    rng = np.random.default_rng(3)
    a = rng.normal(size=(2, 3)).astype(dtype)
    b = rng.normal(size=(3, 2)).astype(dtype)
    out = {}
    for device in ("cpu", "cuda"):
        A, B = ng.param(a, device=device), ng.param(b, device=device)
        with ng.grad_tape():
            y = ng.relu(A @ B) + ng.sum(A * A, axis=1, keepdims=True)
            loss = ng.sum(y)
        ng.backward(loss)
        out[device] = (y.numpy(), kernels.to_host(A._kern, A.grad),
                       kernels.to_host(B._kern, B.grad))
    for c, g in zip(out["cpu"], out["cuda"]):
        assert c.dtype == dtype and np.array_equal(c, g)
    _close(out["cpu"][0], torch.relu(_t(a) @ _t(b)) + (_t(a) * _t(a)).sum(1, keepdim=True),
           tdt, ulps=2)


def test_grad_scaler_matches_torchs():
    # windows of 2 micro-steps; an inf in some micro-steps: the same skips,
    # scales and params as torch.amp.GradScaler stepping at each boundary
    bad = {3, 6, 7, 12}
    x0 = np.float32([0.5, -1.0, 2.0])
    W = ng.param(x0.copy())
    opt = ng.optim.SGD([W], lr=0.1, accumulate_steps=2, average=False)   # torch sums
    scaler = ng.amp.GradScaler(init_scale=2.0 ** 4, growth_interval=2)
    tw = torch.tensor(x0.copy(), requires_grad=True)
    topt = torch.optim.SGD([tw], lr=0.1)
    tscaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 4, growth_interval=2)
    for i in range(16):
        x = np.float32([1.0, np.inf if i in bad else 2.0, -1.0])
        with ng.grad_tape():
            loss = scaler.scale(ng.sum(W * ng.tensor(x)) / 2)
        loss.backward()
        stepped = scaler.step(opt)
        scaler.update()
        tscaler.scale((tw * torch.tensor(x)).sum() / 2).backward()
        if i % 2 == 1:
            before = tw.detach().clone()
            tscaler.step(topt)
            tscaler.update()
            topt.zero_grad()
            assert stepped == (not torch.equal(before, tw.detach())), i
        else:
            assert not stepped
        assert scaler.get_scale() == tscaler.get_scale(), i
        np.testing.assert_allclose(W.numpy(), tw.detach().numpy(), rtol=1e-6)
    state = scaler.state_dict()
    assert state == {k: v for k, v in tscaler.state_dict().items() if k in state}
    again = ng.amp.GradScaler()
    again.load_state_dict(state)
    assert again.get_scale() == scaler.get_scale()
    assert ng.amp.GradScaler(enabled=False).get_scale() == 1.0


def test_master_weights_keep_small_updates():
    # lr * grad = 1e-3 is below bfloat16's resolution at 1.0: lost in place
    # (with a warning), kept by the float32 master and seen once it adds up
    def train(master):
        W = ng.param(np.ones(3, ml_dtypes.bfloat16))
        opt = ng.optim.SGD([W], lr=1e-3, master_weights=master)
        for _ in range(10):
            with ng.grad_tape():
                loss = ng.sum(W)
            loss.backward()
            opt.step()
        return W, opt

    with pytest.warns(RuntimeWarning, match="master_weights=True"):
        W, _ = train(False)
    assert W.dtype == ml_dtypes.bfloat16 and np.all(_f32(W.numpy()) == 1.0)
    W, opt = train(True)
    assert W.dtype == ml_dtypes.bfloat16
    assert np.array_equal(W.numpy(), np.full(3, 0.99, np.float32).astype(ml_dtypes.bfloat16))
    assert opt.params[0].dtype == np.float32
    np.testing.assert_allclose(opt.params[0].numpy(), 0.99, rtol=1e-6)


@pytest.mark.parametrize("dtype, tdt", HALVES)
def test_master_weights_against_torch(dev, dtype, tdt):
    # torch's recipe: float32 params, the forward on their half casts; Adam and
    # AdamW on the float32 masters, windows of 2 micro-steps summed in float32.
    # Inputs of quarters keep every gradient exact in the half format.
    rng = np.random.default_rng(4)
    w0 = rng.normal(size=(3, 2)).astype(np.float32)
    xs = [(rng.integers(-4, 5, size=(4, 3)) / 4).astype(dtype) for _ in range(4)]
    W = dev.param(w0.astype(dtype))
    V = dev.param(w0.astype(dtype))
    opt = ng.optim.Adam([W], lr=0.05, accumulate_steps=2, master_weights=True)
    opt_w = ng.optim.AdamW([V], lr=0.05, accumulate_steps=2, master_weights=True)
    tw = torch.tensor(_f32(w0.astype(dtype)), requires_grad=True)
    tv = torch.tensor(_f32(w0.astype(dtype)), requires_grad=True)
    topt = torch.optim.Adam([tw], lr=0.05)
    topt_w = torch.optim.AdamW([tv], lr=0.05)
    for i, x in enumerate(xs):
        for P, o in ((W, opt), (V, opt_w)):
            with ng.grad_tape():
                loss = ng.sum(dev.tensor(x) @ P)
            loss.backward()
            o.step()
        for tp in (tw, tv):
            ((_t(x) @ tp.to(tdt)).sum() / 2).backward()
        if i % 2:
            for o in (topt, topt_w):
                o.step()
                o.zero_grad()
    for P, o, tp in ((W, opt, tw), (V, opt_w, tv)):
        np.testing.assert_allclose(o.params[0].numpy(), tp.detach().numpy(), rtol=1e-5)
        _close(P.numpy(), tp.detach().numpy(), tdt, ulps=1)
        assert np.array_equal(P.numpy(), o.params[0].numpy().astype(dtype))


def test_the_gpt_trains_in_bfloat16_within_2_percent_of_float32():
    # scripts/train_gpt.py, shortened: the same init, batches and schedule;
    # bfloat16 params with float32 master weights end within 2% of float32
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import train_gpt
    args = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16",
            "--batch-size", "4", "--max-iters", "40", "--eval-every", "20", "--eval-batches", "4",
            "--warmup", "5", "--lr", "3e-3", "--no-progress", "--checkpoint", "", "--no-compile"]
    runs = {dt: train_gpt.main(args + ["--dtype", dt]) for dt in ("float32", "bfloat16")}
    assert runs["bfloat16"]["weights"]["lm_head.weight"].dtype == ml_dtypes.bfloat16
    f32, bf16 = (runs[dt]["history"]["val_loss"] for dt in ("float32", "bfloat16"))
    assert bf16[-1] < bf16[0] - 0.1 and f32[-1] < f32[0] - 0.1   # both learn
    assert abs(bf16[-1] / f32[-1] - 1) < 0.02, (bf16, f32)


def test_module_to_casts_params_and_keeps_ties():
    a = ng.nn.Linear(3, 3, dtype=np.float32, rng=np.random.default_rng(0))
    b = ng.nn.Linear(3, 3, dtype=np.float32)
    b.weight = a.weight
    model = ng.nn.Sequential(a, b)
    host = model.state_dict()
    assert model.to(dtype=ng.bfloat16) is model
    assert {p.dtype for p in model.parameters()} == {ng.bfloat16}
    assert len(model.parameters()) == 3 and model[0].weight is model[1].weight
    assert all(p.is_param for p in model.parameters())
    for k, v in model.state_dict().items():
        assert np.array_equal(v, host[k].astype(ml_dtypes.bfloat16))
    with pytest.raises(TypeError, match="Module.to: dtype must be a float dtype"):
        model.to(dtype=np.int32)


def test_views_joins_and_in_place(dev):
    rng = np.random.default_rng(5)
    a = rng.normal(size=(3, 4)).astype(ml_dtypes.bfloat16)
    b = rng.normal(size=(3, 2)).astype(ml_dtypes.bfloat16)
    A, B = dev.param(a), dev.param(b)
    with ng.grad_tape():
        y = A.T @ B + ng.cat([A[1:, ::2], A[:2, 1::2]], axis=0).mT.sum()
        loss = ng.sum(y * y)
    loss.backward()
    ta, tb = _t(a).requires_grad_(), _t(b).requires_grad_()
    ty = ta.T @ tb + torch.cat([ta[1:, ::2], ta[:2, 1::2]], 0).mT.sum()
    (ty * ty).sum().backward()
    assert y.dtype == ml_dtypes.bfloat16
    _close(y.numpy(), ty, torch.bfloat16, ulps=4)
    _close(kernels.to_host(A._kern, A.grad), ta.grad, torch.bfloat16, ulps=16)
    assert np.array_equal(ng.stack([A, A]).numpy()[1], a) and A.clone().dtype == A.dtype
    with pytest.raises(TypeError, match="in-place writes into a bfloat16 tensor"):
        A.detach().mul_(2.0)


def test_compile_refuses_half_tensors():
    W = ng.param(np.ones((2, 2), np.float16))

    def f(x):
        return ng.sum(W @ x)
    step = ng.compile(f)
    with pytest.raises(RuntimeError, match="half-precision tensors run eagerly"):
        step(ng.tensor(np.ones((2, 1), np.float16)))


def test_ops_outside_the_table_refuse_halves_clearly():
    # a layer with kernels of its own (LSTM), a user's elementwise function and
    # custom op: a TypeError that names the half dtype, not Numba's NotImplementedError
    x = ng.tensor(np.ones((2, 1, 4), np.float16))
    lstm = ng.nn.LSTM(4, 3, dtype=np.float32).to(dtype=ng.float16)
    with pytest.raises(TypeError, match="lstm_layer: got float16 data"):
        lstm(x)
    twice = ng.elementwise(_twice)
    with pytest.raises(TypeError, match="got float16 data"):
        twice(x)
    # an op fetched before the first half tensor existed: the error says so
    code = ("import numpy as np, numbagrad as ng\n"
            "try:\n"
            "    ng.linear(ng.tensor(np.ones((2, 3), np.float32)).to(ng.float16),\n"
            "              ng.tensor(np.ones((4, 3), np.float16)))\n"
            "except TypeError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert "a reference to an op taken before then" in out.stdout, out.stdout + out.stderr


def _twice(a):
    return 2.0 * a


@pytest.mark.parametrize("dtype, tdt", HALVES)
def test_factories_make_halves(dev, dtype, tdt):
    assert np.array_equal(ng.full((2, 3), 0.1, dtype=dtype, device=dev.name).numpy(),
                          torch.full((2, 3), 0.1, dtype=tdt).float().numpy().astype(dtype))
    z = ng.zeros(2, 2, dtype=dtype, device=dev.name, requires_grad=True)
    assert z.dtype == dtype and z.is_param and not np.any(_f32(z.numpy()))
    assert np.array_equal(ng.ones_like(z).numpy(), np.ones((2, 2), dtype))
    assert np.array_equal(ng.arange(5, dtype=dtype, device=dev.name).numpy(),
                          np.arange(5).astype(dtype))


def test_numbagrad_works_without_ml_dtypes():
    import subprocess
    import sys
    code = ("import sys; sys.modules['ml_dtypes'] = None\n"
            "import numpy as np, numbagrad as ng\n"
            "x = ng.tensor(np.ones(3, np.float32)).to(ng.float16)\n"
            "assert (x + x).dtype == np.float16 and not hasattr(ng, 'bfloat16')\n"
            "try:\n    ng.bfloat16\nexcept AttributeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "ng.bfloat16 needs the ml_dtypes package" in out.stdout


@pytest.mark.parametrize("master", [True, False])
@pytest.mark.parametrize("dtype", [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)])
def test_grad_scaler_unscales_half_params(dtype, master, recwarn):
    """The scaler looked for gradients on the float32 masters, whose flags
    only an optimizer step sets: nothing was unscaled or checked, so the
    update was 1024 times too large and an overflowing window was applied."""
    W = ng.param(np.ones(3), dtype=dtype)
    opt = ng.optim.SGD([W], lr=0.01, master_weights=master)
    scaler = ng.amp.GradScaler(init_scale=1024.0)
    with ng.grad_tape():
        loss = scaler.scale(ng.sum(W * np.array([1.0, 2.0, 3.0], dtype)))
    loss.backward()
    assert scaler.step(opt) is True
    want = (np.ones(3, np.float32) - np.float32(0.01) * np.array([1, 2, 3], np.float32))
    np.testing.assert_array_equal(_f32(W.numpy()), _f32(want.astype(dtype)))
    with ng.grad_tape():     # a nan gradient: the window is skipped, the scale halved
        loss = scaler.scale(ng.sum(W * np.array([np.nan, 1.0, 1.0], dtype)))
    loss.backward()
    before = W.numpy().copy()
    assert scaler.step(opt) is False
    scaler.update()
    assert scaler.get_scale() == 512.0 and W.grad is None
    assert np.array_equal(W.numpy().view(np.uint16), before.view(np.uint16))


def test_master_weights_follow_loaded_params_and_are_saved():
    """The float32 master overwrote weights loaded into the half params (its
    stale copy was written back), and the optimizer's state dict did not
    save it, so a resumed run drifted from the uninterrupted one."""
    def build():
        m = ng.nn.Linear(3, 2, rng=np.random.default_rng(0)).to(dtype=ml_dtypes.bfloat16)
        return m, ng.optim.AdamW(m.parameters(), lr=1e-3, master_weights=True)

    def train(m, opt, steps, seed):
        rng = np.random.default_rng(seed)
        for _ in range(steps):
            x = ng.tensor(rng.normal(size=(4, 3)).astype(ml_dtypes.bfloat16))
            with ng.grad_tape():
                loss = ng.sum(m(x))
            loss.backward()
            opt.step()

    m, opt = build()
    m.load_state_dict({k: np.full(v.shape, 7, v.dtype) for k, v in m.state_dict().items()})
    opt_lr, opt.lr = opt.lr, 0.0
    train(m, opt, 1, 0)
    assert np.all(_f32(m.weight.numpy()) == 7.0)     # not the stale master's weights
    opt.lr = opt_lr
    a, oa = build()
    train(a, oa, 3, 1)
    saved_m, saved_o = a.state_dict(), oa.state_dict()
    assert [x.dtype for x in saved_o["masters"]] == [np.float32] * 2
    b, ob = build()
    b.load_state_dict(saved_m)
    ob.load_state_dict(saved_o)
    train(a, oa, 3, 2)
    train(b, ob, 3, 2)
    for k in saved_m:
        assert np.array_equal(a.state_dict()[k].view(np.uint16), b.state_dict()[k].view(np.uint16))
    with pytest.raises(ValueError, match="master weight"):
        ob.load_state_dict(dict(saved_o, masters=[np.zeros((1,), np.float32)] * 2))


def test_grad_scaler_checks_float64_grads_in_float64_and_keeps_its_growth_count():
    """A float64 gradient past float32's range counted as inf (the check cast
    to float32); update(new_scale) reset the growth count, which PyTorch's
    keeps."""
    W = ng.param(np.array([1.0]))
    opt = ng.optim.SGD([W], lr=1e-40)
    scaler = ng.amp.GradScaler(init_scale=2.0 ** 16)
    with ng.grad_tape():
        loss = scaler.scale(ng.sum(W * 1e36))
    loss.backward()
    assert scaler.step(opt) is True
    scaler.update()
    assert scaler.get_scale() == 2.0 ** 16
    ours = ng.amp.GradScaler(init_scale=4.0, growth_interval=3)
    theirs = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=3)
    tp = torch.zeros(1, requires_grad=True)
    topt = torch.optim.SGD([tp], lr=0.0)
    P = ng.param(np.zeros(1))
    popt = ng.optim.SGD([P], lr=0.0)
    for i in range(5):
        with ng.grad_tape():
            loss = ours.scale(ng.sum(P))
        loss.backward()
        ours.step(popt)
        theirs.scale(tp.sum()).backward()
        theirs.step(topt)
        topt.zero_grad()
        ours.update(8.0 if i == 1 else None)
        theirs.update(8.0 if i == 1 else None)
        assert ours.get_scale() == theirs.get_scale(), i


def test_a_0d_half_params_master_round_trips_its_state_dict():
    s = ng.param(np.full((), 1.5), dtype=np.float16)
    opt = ng.optim.SGD([s], lr=0.1, master_weights=True)
    with ng.grad_tape():
        loss = s * 2.0
    loss.backward()
    opt.step()
    saved = opt.state_dict()
    assert saved["masters"][0].shape == ()
    other = ng.optim.SGD([ng.param(np.ones(()), dtype=np.float16)], lr=0.1, master_weights=True)
    other.load_state_dict(saved)
    assert other.params[0].numpy() == opt.params[0].numpy()
