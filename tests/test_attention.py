"""scaled_dot_product_attention and nn.MultiheadAttention against PyTorch:
values and q, k, v gradients (causal, boolean and float masks, scale, L != S,
broadcast batch dims) on both devices; gradcheck; dropout (p = 0, seeds, the
mask's fraction, the backward's regenerated mask); O(T * d) memory; ng.compile;
CUDA launches; PTX for the new kernel sources; bad input."""
import subprocess
import sys

import numpy as np
import pytest

import numbagrad as ng
from conftest import (compiled_matches_eager, cuda_dev, cuda_launches, inputs, matches_torch,
                      weighted_sum)

torch = pytest.importorskip("torch")
F = torch.nn.functional
sdpa = ng.scaled_dot_product_attention

_MASK_RNG = np.random.default_rng(11)
BOOL_MASK = _MASK_RNG.random((3, 5)) > 0.4
BOOL_MASK[1] = False                     # a query row that sees no key: zeros, as PyTorch
FLOAT_MASK = _MASK_RNG.normal(size=(2, 1, 5))

# (q, k, v shapes, keyword arguments)
CASES = [
    ((2, 3, 4), (2, 5, 4), (2, 5, 6), {}),                              # L != S, E != Ev
    ((2, 4, 3), (2, 4, 3), (2, 4, 2), dict(is_causal=True)),
    ((2, 3, 4), (2, 5, 4), (2, 5, 3), dict(is_causal=True)),           # top-left, L < S
    ((2, 5, 2), (2, 3, 2), (2, 3, 3), dict(is_causal=True, scale=0.7)),  # L > S
    ((2, 1, 3, 4), (3, 5, 4), (1, 5, 2), dict(scale=0.3)),             # broadcast batch dims
    ((2, 3, 4), (2, 5, 4), (2, 5, 6), dict(attn_mask=BOOL_MASK)),
    ((2, 3, 4), (1, 5, 4), (2, 5, 6), dict(attn_mask=FLOAT_MASK)),
    ((3, 4), (5, 4), (5, 2), {}),                                       # no batch dims
    ((2, 0, 4), (2, 5, 4), (2, 5, 3), dict(is_causal=True)),           # size 0: as PyTorch
    ((2, 3, 4), (2, 0, 4), (2, 0, 3), {}),                              # no keys: zeros
]
IDS = ["plain", "causal", "causal-L<S", "causal-L>S-scale", "broadcast", "bool-mask",
       "float-mask", "2d", "L0", "S0"]


def _torch_kw(kw, dtype=np.float64):
    out = dict(kw)
    if "attn_mask" in kw:
        m = kw["attn_mask"]
        out["attn_mask"] = torch.tensor(m if m.dtype == np.bool_ else m.astype(dtype))
    return out


def _ng_kw(kw, dev, dtype=np.float64):
    out = dict(kw)
    if "attn_mask" in kw:
        m = kw["attn_mask"]
        # a boolean tensor comes from a comparison
        out["attn_mask"] = dev.tensor(m.astype(dtype)) > 0.5 if m.dtype == np.bool_ \
            else dev.tensor(m.astype(dtype))
    return out


@pytest.mark.parametrize("qs, ks, vs, kw", CASES, ids=IDS)
def test_float64_matches_torch(dev, qs, ks, vs, kw):
    arrays = inputs([qs, ks, vs], seed=3)
    matches_torch(lambda q, k, v: sdpa(q, k, v, **_ng_kw(kw, dev)),
                  lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **_torch_kw(kw)),
                  arrays, dev=dev, name=str(kw))


@pytest.mark.parametrize("qs, ks, vs, kw", CASES[1::2], ids=IDS[1::2])
def test_float32_matches_torch(dev, qs, ks, vs, kw):
    arrays = [a.astype(np.float32) for a in inputs([qs, ks, vs], seed=4)]
    ps = [dev.param(a) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    want = F.scaled_dot_product_attention(*ts, **_torch_kw(kw, np.float32))
    w = np.random.default_rng(1).normal(size=tuple(want.shape)).astype(np.float32)
    with ng.grad_tape():
        out = sdpa(*ps, **_ng_kw(kw, dev, np.float32))
        loss = weighted_sum(out, dev.tensor(w))
    grads = ng.backward(loss)
    (want * torch.tensor(w)).sum().backward()
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    for p, t in zip(ps, ts):
        np.testing.assert_allclose(dev.host(grads[p.id]), t.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kw", [dict(is_causal=True), dict(attn_mask=BOOL_MASK, scale=0.5)],
                         ids=["causal", "mask"])
def test_gradcheck(dev, kw):
    ps = [dev.param(a) for a in inputs([(2, 3, 4), (2, 5, 4), (2, 5, 3)], seed=5)]
    weights = dev.tensor(np.random.default_rng(6).normal(size=(2, 3, 3)))
    ng.gradcheck(lambda: weighted_sum(sdpa(*ps, **_ng_kw(kw, dev)), weights), ps,
                 directions=None if dev.name == "cpu" else 2)


def test_gradients_add_into_accumulators_and_repeated_inputs(dev):
    """sdpa(x, x, x): the three gradients go to one array, in turn; a second
    backward adds to a param's accumulator (beta = 1)."""
    (x0,) = inputs([(2, 4, 3)], seed=7)
    x = dev.param(x0)
    w = np.random.default_rng(2).normal(size=(2, 4, 3))
    for _ in range(2):
        with ng.grad_tape():
            loss = weighted_sum(sdpa(x, x, x, is_causal=True), dev.tensor(w))
        loss.backward()
    xt = torch.tensor(x0, requires_grad=True)
    (F.scaled_dot_product_attention(xt, xt, xt, is_causal=True) * torch.tensor(w)).sum() \
        .backward()
    np.testing.assert_allclose(dev.host(x.grad), 2 * xt.grad.numpy(), rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------ dropout
def test_dropout_zero_is_the_plain_attention_and_draws_nothing(dev):
    q, k, v = (dev.tensor(a) for a in inputs([(2, 3, 4), (2, 5, 4), (2, 5, 3)], seed=8))
    before = ng.random.get_state()
    plain = sdpa(q, k, v).numpy()
    assert sdpa(q, k, v, dropout_p=0.0).numpy().tobytes() == plain.tobytes()
    assert ng.random.get_state() == before


def _probabilities(q, k, scale):
    return torch.softmax(torch.tensor(q) @ torch.tensor(k).transpose(-1, -2) * scale, -1)


def test_dropout_seeds_fraction_and_regenerated_mask(dev):
    """Same seed, same output; a fresh draw per call; about p of the
    probabilities dropped; the backward uses the forward's mask."""
    p, L, S, E = 0.25, 16, 16, 4
    q0, k0, v0 = inputs([(2, L, E), (2, S, E), (2, S, 3)], seed=9)
    q, k, v = dev.param(q0), dev.param(k0), dev.param(v0)
    eye = dev.tensor(np.broadcast_to(np.eye(S), (2, S, S)).copy())
    ng.manual_seed(5)
    first = sdpa(q, k, eye, dropout_p=p).numpy()       # out = P * Z: the mask itself
    second = sdpa(q, k, eye, dropout_p=p).numpy()
    ng.manual_seed(5)
    again = sdpa(q, k, eye, dropout_p=p).numpy()
    assert first.tobytes() == again.tobytes() and first.tobytes() != second.tobytes()
    keep = first != 0
    assert abs(1 - keep.mean() - p) < 0.08      # 512 draws: 3.5 standard deviations
    probs = _probabilities(q0, k0, 1 / np.sqrt(E)).numpy()
    np.testing.assert_allclose(first[keep], probs[keep] / (1 - p), rtol=1e-9)
    # the same counter again, with the real values: PyTorch's formula for this mask
    ng.manual_seed(5)
    w = np.random.default_rng(3).normal(size=(2, L, 3))
    with ng.grad_tape():
        out = sdpa(q, k, v, dropout_p=p)
        loss = weighted_sum(out, dev.tensor(w))
    grads = ng.backward(loss)
    ts = [torch.tensor(a, requires_grad=True) for a in (q0, k0, v0)]
    z = torch.tensor(keep / (1 - p))
    want = (torch.softmax(ts[0] @ ts[1].transpose(-1, -2) / np.sqrt(E), -1) * z) @ ts[2]
    (want * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12)
    for param, t in zip((q, k, v), ts):
        np.testing.assert_allclose(dev.host(grads[param.id]), t.grad.numpy(), rtol=1e-9,
                                   atol=1e-12)


# ------------------------------------------------------------ memory
# Run in a process of its own: tracemalloc sees every thread's allocations,
# and in a pytest worker that has run other files they can add megabytes (a
# CI run once measured 4.0 MiB here against 1.5 MiB alone).
_MEMORY_RUN = """
import tracemalloc
import numpy as np
import numbagrad as ng
T, d = 1024, 64
rng = np.random.default_rng(10)
q, k, v = (ng.param(rng.normal(size=(1, T, d))) for _ in range(3))
w = ng.tensor(np.random.default_rng(4).normal(size=(1, T, d)))
for traced in (False, True):      # the first run compiles outside the measurement
    if traced:
        tracemalloc.start()
    try:
        with ng.grad_tape():
            loss = (ng.scaled_dot_product_attention(q, k, v, is_causal=True) * w).sum()
        grads = ng.backward(loss)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
print(len(grads), peak)
"""


def test_memory_is_linear_in_T():
    """T = 1024, d = 64, forward and backward in float64: one (T, T) score matrix
    is 8 MiB, so an O(T**2) implementation exceeds a 4 MiB peak; the output,
    the three gradients (0.5 MiB each), the row statistics and the (32, T)
    per-thread scratch stay well under it."""
    T = 1024
    run = subprocess.run([sys.executable, "-c", _MEMORY_RUN], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    count, peak = (int(v) for v in run.stdout.split()[-2:])
    assert count == 3
    assert peak < 4 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    assert T * T * np.dtype(np.float64).itemsize > 4 * 2**20   # what O(T**2) would break


# ------------------------------------------------------------ MultiheadAttention
def _torch_mha(seed=0, dtype=torch.float64, **kw):
    torch.manual_seed(seed)
    return torch.nn.MultiheadAttention(8, 2, batch_first=True, dtype=dtype, **kw)


def _loaded(t, dev, dtype=np.float64):
    m = ng.nn.MultiheadAttention(8, 2, dtype=dtype, device=dev.name,
                                 rng=np.random.default_rng(0))
    m.load_state_dict({k: v.detach().numpy() for k, v in t.state_dict().items()})
    return m


@pytest.mark.parametrize("mask", [None, "bool", "float", "causal"])
def test_mha_loads_a_torch_state_dict_and_matches(dev, mask):
    t = _torch_mha()
    m = _loaded(t, dev)
    assert list(m.state_dict()) == list(t.state_dict())
    x0, y0 = inputs([(2, 3, 8), (2, 4, 8)], seed=12)
    kw, tkw = {}, {}
    if mask == "bool":
        am = np.triu(np.ones((3, 4), bool), 1)          # True: may NOT attend (PyTorch's MHA)
        kw, tkw = dict(attn_mask=dev.tensor(am * 1.0) > 0.5), dict(attn_mask=torch.tensor(am))
    elif mask == "float":
        am = np.random.default_rng(1).normal(size=(4, 3, 4))   # (N * heads, L, S)
        kw, tkw = dict(attn_mask=dev.tensor(am)), dict(attn_mask=torch.tensor(am))
    elif mask == "causal":
        am = torch.nn.Transformer.generate_square_subsequent_mask(3, dtype=torch.float64)
        kw = dict(is_causal=True)
        tkw = dict(attn_mask=am[:, :3], is_causal=True)
        y0 = x0
    x, y = dev.param(x0), dev.param(y0)
    xt, yt = (torch.tensor(a, requires_grad=True) for a in (x0, y0))
    want, _ = t(xt, yt, yt, need_weights=False, **tkw)
    w = np.random.default_rng(2).normal(size=tuple(want.shape))
    with ng.grad_tape():
        out, weights = m(x, y, y, **kw)
        loss = weighted_sum(out, dev.tensor(w))
    grads = ng.backward(loss)
    (want * torch.tensor(w)).sum().backward()
    assert weights is None
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dev.host(grads[x.id]), xt.grad.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dev.host(grads[m.in_proj_weight.id]),
                               t.in_proj_weight.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_mha_init_is_torchs_and_bad_arguments_raise():
    m = ng.nn.MultiheadAttention(8, 2, rng=np.random.default_rng(3), dtype=np.float32)
    w = m.in_proj_weight.numpy()
    bound = np.sqrt(6 / (8 + 24))                       # xavier_uniform_ on (3E, E)
    assert w.shape == (24, 8) and w.dtype == np.float32
    assert bound * 0.8 < np.abs(w).max() <= bound
    assert not m.in_proj_bias.numpy().any() and not m.out_proj.bias.numpy().any()
    assert np.abs(m.out_proj.weight.numpy()).max() <= 1 / np.sqrt(8)
    torch_names = [n for n, _ in _torch_mha().named_parameters()]
    assert [n for n, _ in m.named_parameters()] == torch_names
    assert ng.nn.MultiheadAttention(8, 2, bias=False).in_proj_bias is None
    with pytest.raises(ValueError, match="divisible by num_heads"):
        ng.nn.MultiheadAttention(8, 3)
    x = ng.tensor(np.ones((1, 2, 8), np.float32))
    with pytest.raises(TypeError, match="need_weights"):
        m(x, x, x, need_weights="yes")
    with pytest.raises(ValueError, match=r"attn_mask must be \(L, S\)"):
        m(x, x, x, attn_mask=np.ones((3, 3), bool))


def test_mha_batch_first_false_and_unbatched():
    t = torch.nn.MultiheadAttention(8, 2, dtype=torch.float64)
    (x0,) = inputs([(3, 2, 8)], seed=13)                # (L, N, E)
    m = ng.nn.MultiheadAttention(8, 2, batch_first=False)
    m.load_state_dict({k: v.detach().numpy() for k, v in t.state_dict().items()})
    want = t(*[torch.tensor(x0)] * 3, need_weights=False)[0].detach().numpy()
    np.testing.assert_allclose(m(x0, x0, x0)[0].numpy(), want, rtol=1e-9, atol=1e-12)
    want = t(*[torch.tensor(x0[:, 0])] * 3, need_weights=False)[0].detach().numpy()
    np.testing.assert_allclose(m(x0[:, 0], x0[:, 0], x0[:, 0])[0].numpy(), want, rtol=1e-9,
                               atol=1e-12)


# ------------------------------------------------------------ ng.compile
def _block(seed=0):
    rng = np.random.default_rng(seed)
    mha = ng.nn.MultiheadAttention(8, 2, dropout=0.1, dtype=np.float32, rng=rng)
    head = ng.nn.Linear(8, 3, dtype=np.float32, rng=rng)

    def loss_fn(x, y):
        h = x + mha(x, x, x, is_causal=True)[0]          # attention + residual
        return ng.mse_loss(head(h), y)
    return mha.parameters() + head.parameters(), loss_fn


def test_compiled_block_is_bit_identical_to_eager(tmp_path):
    def make():
        params, loss_fn = _block()
        return params, loss_fn, ng.optim.Adam(params, lr=0.01, accumulate_steps=2)
    rng = np.random.default_rng(2)
    batches = [(ng.tensor(rng.normal(size=(2, 4, 8)).astype(np.float32)),
                ng.tensor(rng.normal(size=(2, 4, 3)).astype(np.float32))) for _ in range(2)]
    step = compiled_matches_eager(make, [batches[i % 2] for i in range(6)], tmp_path, same_random=True)
    assert step.stats[-1]["mode"] == "njit"


# ------------------------------------------------------------ CUDA launches
def test_cuda_launch_bound():
    """One launch forward, one backward for all three gradients (a bool mask
    adds its conversion to the forward: where and astype)."""
    dev = cuda_dev()
    q, k, v = inputs([(2, 3, 4), (2, 5, 4), (2, 5, 3)], seed=14)
    kp, vp = dev.param(k), dev.param(v)
    fwd, bwd = cuda_launches(lambda t: sdpa(t, kp, vp, is_causal=True, dropout_p=0.2),
                             dev.param(q))
    assert (fwd, bwd) == (1, 1)
    fwd, bwd = cuda_launches(lambda t: sdpa(t, t, t), dev.param(k))   # one array, three writes
    assert (fwd, bwd) == (1, 3)


# ------------------------------------------------------------ PTX


# ------------------------------------------------------------ bad input
BAD = [
    (((2, 3, 4), (2, 5, 3), (2, 5, 6)), {}, ValueError, "same embedding size E"),
    (((2, 3, 4), (2, 5, 4), (2, 4, 6)), {}, ValueError, "same length S"),
    (((2, 3, 4), (3, 5, 4), (3, 5, 6)), {}, ValueError, "do not broadcast"),
    (((4,), (5, 4), (5, 6)), {}, ValueError, "at least 2 dims"),
    (((2, 3, 4), (2, 5, 4), (2, 5, 6)), dict(attn_mask=np.ones((4, 5), bool)), ValueError,
     r"attn_mask of shape \(4, 5\) does not broadcast to \(..., L, S\) = \(2, 3, 5\)"),
    (((2, 3, 4), (2, 5, 4), (2, 5, 6)), dict(attn_mask=np.ones((3, 5), np.int64)), TypeError,
     "attn_mask must be boolean or of the query.s dtype float64, got .*int64"),
    (((2, 3, 4), (2, 5, 4), (2, 5, 6)), dict(attn_mask=np.ones((3, 5), bool), is_causal=True),
     ValueError, "should not be set when is_causal=True"),
    (((2, 3, 4), (2, 5, 4), (2, 5, 6)), dict(dropout_p=1.5), ValueError, "dropout_p must be"),
    (((2, 3, 4), (2, 5, 4), (2, 5, 6)), dict(is_causal=1), TypeError, "is_causal must be a bool"),
]


@pytest.mark.parametrize("shapes, kw, exc, match", BAD, ids=[b[3][:20] for b in BAD])
def test_bad_input_raises_clearly_and_changes_nothing(shapes, kw, exc, match):
    ps = [ng.param(a) for a in inputs(shapes, seed=15)]
    before = [p.numpy().copy() for p in ps]
    state = ng.random.get_state()
    with ng.grad_tape():
        with pytest.raises(exc, match=match):
            sdpa(*ps, dropout_p=0.5, **kw) if "dropout_p" not in kw else sdpa(*ps, **kw)
    assert ng.random.get_state() == state
    for p, b in zip(ps, before):
        assert p.grad is None and p.numpy().tobytes() == b.tobytes()


def test_mismatched_dtypes_and_devices_raise():
    q, k, v = inputs([(2, 3, 4), (2, 5, 4), (2, 5, 6)], seed=16)
    with pytest.raises(TypeError, match="dtypes differ"):
        sdpa(ng.tensor(q), ng.tensor(k.astype(np.float32)), ng.tensor(v))
    with pytest.raises(TypeError, match="attn_mask must be boolean or of the query's dtype"):
        sdpa(ng.tensor(q), ng.tensor(k), ng.tensor(v),
             attn_mask=ng.tensor(np.zeros((3, 5), np.float32)))
    if ng.cuda_available():
        with pytest.raises(ValueError, match="query is on cpu but key on cuda"):
            sdpa(ng.tensor(q), ng.tensor(k, device="cuda"), ng.tensor(v))


def test_threaded_cpu_kernels_give_the_serial_bits():
    from numbagrad.kernels import cpu
    from numbagrad.ops.attention import BLOCK
    rng = np.random.default_rng(17)
    B, L, S, E = 3, 40, 37, 5                  # two blocks of rows, the second partial
    q, k, v, g = (rng.normal(size=(B, n, E)) for n in (L, S, S, L))
    mask = rng.normal(size=(1, L, S))
    maps = np.tile(np.arange(B), (4, 1)).astype(np.int64)
    maps[3] = 0
    runs = []
    for fwd, bwd, slots in ((cpu.attention, cpu.attention_backward, 1),
                            (cpu.attention_mt, cpu.attention_backward_mt, 3)):
        state = np.array([7, 3, 0], np.uint64)
        seeds, out, lse = np.empty(2, np.uint64), np.empty((B, L, E)), np.empty((B, L))
        args = (q, k, v, mask, maps, True, 0.4, 0.3, 1 / 0.7)
        fwd(*args, state, seeds, out, lse, np.empty((slots, BLOCK * S)), BLOCK)
        grads = [np.ones_like(q), np.ones_like(k), np.ones_like(v)]
        bwd(*args, seeds, out, lse, g, *grads, 0.0, 1.0, 0.5, True, True, True,
            np.empty((2 * slots, BLOCK * S)), BLOCK)
        assert state[1] == 4 and list(seeds) == [7, 3]
        runs.append([a.tobytes() for a in (out, lse, *grads)])
    assert runs[0] == runs[1]
