"""Issue 17's losses (nll_loss, l1_loss, smooth_l1_loss, huber_loss,
binary_cross_entropy) with reduction "mean", "sum" and "none" against
PyTorch on both devices; ignore_index, the log clamp, bad input, CUDA launch
bounds, and ng.compile bit-identical to eager for a graph of issue 17's ops."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import numbagrad as ng
from conftest import cuda_dev, cuda_launches, inputs, matches_torch
from numbagrad.compile import compile as ng_compile

REDUCTIONS = ["mean", "sum", "none"]
PROBS = np.random.default_rng(3).uniform(0.05, 0.95, size=(2, 3, 2))
TARGET = np.random.default_rng(4).normal(size=(2, 3, 2))
POINTWISE = [
    ("l1_loss", lambda x, t, r: ng.l1_loss(x, t, r), lambda x, t, r: F.l1_loss(x, t, reduction=r)),
    ("smooth_l1_loss", lambda x, t, r: ng.smooth_l1_loss(x, t, r, beta=0.6),
     lambda x, t, r: F.smooth_l1_loss(x, t, reduction=r, beta=0.6)),
    ("smooth_l1_loss_beta0", lambda x, t, r: ng.smooth_l1_loss(x, t, r, beta=0.0),
     lambda x, t, r: F.smooth_l1_loss(x, t, reduction=r, beta=0.0)),
    ("huber_loss", lambda x, t, r: ng.huber_loss(x, t, r, delta=0.8),
     lambda x, t, r: F.huber_loss(x, t, reduction=r, delta=0.8)),
]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name, f, g", POINTWISE, ids=[c[0] for c in POINTWISE])
def test_pointwise_losses_match_torch(dev, name, f, g, reduction):
    for shape in [(), (5,), (2, 3, 2)]:
        target = TARGET.ravel()[:int(np.prod(shape))].reshape(shape)
        matches_torch(lambda x: f(x, dev.tensor(target), reduction),
                      lambda x: g(x, torch.tensor(target), reduction), inputs([shape]), dev,
                      name=f"{name}{shape}")


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy_matches_torch(dev, reduction):
    target = np.random.default_rng(5).uniform(size=PROBS.shape)
    matches_torch(lambda x: ng.binary_cross_entropy(x, dev.tensor(target), reduction),
                  lambda x: F.binary_cross_entropy(x, torch.tensor(target), reduction=reduction),
                  [PROBS], dev)


def test_binary_cross_entropy_clamps_its_logs_at_minus_100(dev):
    x = np.array([0.0, 1.0, 0.0, 1.0, 1e-60])
    t = np.array([0.0, 1.0, 1.0, 0.0, 0.5])
    p, tt = dev.param(x), torch.tensor(x, requires_grad=True)
    with ng.grad_tape():
        loss = ng.binary_cross_entropy(p, dev.tensor(t), "sum")
    want = F.binary_cross_entropy(tt, torch.tensor(t), reduction="sum")
    np.testing.assert_allclose(loss.numpy(), want.item(), rtol=1e-12)
    want.backward()
    np.testing.assert_allclose(dev.host(ng.backward(loss)[p.id]), tt.grad.numpy(), rtol=1e-12)


LABELS = np.array([2, -100, 0, 3, 2])


# (the CUDA simulator's NumPy scalars warn about the nan they compute)
@pytest.mark.filterwarnings("ignore:.*encountered in scalar:RuntimeWarning")
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss_matches_torch_with_ignore_index(dev, reduction):
    for labels, ignore in [(LABELS, -100), (LABELS.clip(0, 3), 2), (np.array([1, 1]), 1)]:
        x = inputs([(labels.size, 4)], seed=labels.size)[0]
        matches_torch(lambda t: ng.nll_loss(ng.log_softmax(t), labels, reduction, ignore),
                      lambda t: F.nll_loss(torch.log_softmax(t, -1), torch.tensor(labels),
                                           reduction=reduction, ignore_index=ignore),
                      [x], dev, name=f"nll {labels} {ignore}")


# (the CUDA simulator's NumPy scalars warn about the nan they compute)
@pytest.mark.filterwarnings("ignore:.*encountered in scalar:RuntimeWarning")
def test_nll_loss_with_every_target_ignored_is_nan(dev):
    x = dev.param(np.zeros((2, 3)))
    assert np.isnan(ng.nll_loss(x, np.array([1, 1]), ignore_index=1).numpy())
    assert ng.nll_loss(x, np.array([1, 1]), "sum", ignore_index=1).numpy() == 0


def test_float32_within_1e5(dev):
    x = inputs([(4, 3)])[0].astype(np.float32)
    t = TARGET.ravel()[:12].reshape(4, 3).astype(np.float32)
    probs = PROBS.reshape(4, 3).astype(np.float32)
    for f, g, data in [
            (lambda a: ng.huber_loss(a, dev.tensor(t)), lambda a: F.huber_loss(a, torch.tensor(t)),
             x),
            (lambda a: ng.l1_loss(a, dev.tensor(t), "sum"),
             lambda a: F.l1_loss(a, torch.tensor(t), reduction="sum"), x),
            (lambda a: ng.binary_cross_entropy(a, dev.tensor(t.clip(0, 1))),
             lambda a: F.binary_cross_entropy(a, torch.tensor(t.clip(0, 1))), probs),
            (lambda a: ng.nll_loss(a, np.array([0, 2, 1, 1])),
             lambda a: F.nll_loss(a, torch.tensor([0, 2, 1, 1])), x)]:
        p, tt = dev.param(data), torch.tensor(data, requires_grad=True)
        with ng.grad_tape():
            loss = f(p)
        assert loss.dtype == np.float32
        want = g(tt)
        np.testing.assert_allclose(loss.numpy(), want.item(), rtol=1e-5)
        want.backward()
        np.testing.assert_allclose(dev.host(ng.backward(loss)[p.id]), tt.grad.numpy(),
                                   rtol=1e-5, atol=1e-7)


def test_gradcheck(dev):
    x = dev.param(inputs([(3, 4)], seed=6)[0])
    t = dev.tensor(inputs([(3, 4)], seed=7)[0])
    probs = dev.param(PROBS.reshape(3, 4))
    w = dev.tensor(inputs([(3, 4)], seed=8)[0])
    directions = None if dev.name == "cpu" else 2
    for loss in [lambda: ng.smooth_l1_loss(x, t, beta=0.5), lambda: ng.huber_loss(x, t, "sum"),
                 lambda: (ng.l1_loss(x, t, "none") * w).sum(),
                 lambda: ng.nll_loss(x, np.array([1, 0, 3]))]:
        ng.gradcheck(loss, [x], directions=directions)
    ng.gradcheck(lambda: ng.binary_cross_entropy(probs, t * 0 + 0.3), [probs],
                 directions=directions)


def test_bad_input_is_refused_before_anything_runs():
    x = ng.param(np.zeros((3, 4)))
    t = ng.tensor(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="l1_loss: reduction must be 'mean', 'sum' or 'none'"):
        ng.l1_loss(x, t, "max")
    with pytest.raises(ValueError, match=r"huber_loss: input shape \(3, 4\) and target shape"):
        ng.huber_loss(x, ng.tensor(np.zeros(4)))
    with pytest.raises(ValueError, match="huber_loss: delta must be a real number > 0"):
        ng.huber_loss(x, t, delta=0.0)
    with pytest.raises(ValueError, match="smooth_l1_loss: beta must be a real number >= 0"):
        ng.smooth_l1_loss(x, t, beta=-1.0)
    with pytest.raises(ValueError, match=r"binary_cross_entropy: every input element must be "
                                         r"a probability in \[0, 1\]"):
        ng.binary_cross_entropy(x - 0.5, t)
    with pytest.raises(ValueError, match=r"nll_loss: target\[1\] is class 4, outside \[0, 4\)"):
        ng.nll_loss(x, np.array([0, 4, 1]))
    with pytest.raises(ValueError, match=r"nll_loss: target has shape \(2,\)"):
        ng.nll_loss(x, np.array([0, 1]))
    with pytest.raises(TypeError, match="nll_loss: target must be a NumPy integer array"):
        ng.nll_loss(x, np.array([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match=r"nll_loss: log_probs must be \(N, C\)"):
        ng.nll_loss(ng.tensor(np.zeros(4)), np.array([0]))
    with pytest.raises(TypeError, match="nll_loss: ignore_index must be an int"):
        ng.nll_loss(x, np.array([0, 1, 2]), ignore_index=1.5)
    np.testing.assert_array_equal(x.numpy(), np.zeros((3, 4)))
    assert x.grad is None


def test_cuda_launch_bounds():
    dev = cuda_dev()
    x = dev.param(PROBS.reshape(3, 4))
    t = dev.tensor(np.full((3, 4), 0.25))
    for f in [lambda a: ng.l1_loss(a, t), lambda a: ng.huber_loss(a, t, "none"),
              lambda a: ng.smooth_l1_loss(a, t, "sum"), lambda a: ng.binary_cross_entropy(a, t),
              lambda a: ng.nll_loss(a, np.array([0, 3, -100]), "none")]:
        assert cuda_launches(f, x) == (1, 1)
    before, transfers = ng.cuda.launch_count(), ng.cuda.transfer_count()
    ng.nll_loss(x, np.array([0, 3, -100]))
    assert (ng.cuda.launch_count() - before, ng.cuda.transfer_count() - transfers) == (1, 1)


def test_compile_is_bit_identical_to_eager(tmp_path):
    """One graph through issue 17's ops: activations, reductions and losses."""
    def make():
        rng = np.random.default_rng(0)
        w = ng.param(rng.normal(size=(4, 3)))
        b = ng.param(rng.normal(size=(4,)))

        def loss_fn(x, labels, y):
            h = ng.linear(x, w, b, activation="gelu")
            h = ng.maximum(ng.silu(h), ng.clamp(h, -0.5, 0.5)) + ng.abs(h) * 0.1
            z = ng.softplus(h) - ng.logsumexp(h, 1, keepdims=True) + ng.cumsum(h, 1) * 0.01
            return (ng.nll_loss(z, labels) + ng.huber_loss(ng.amax(h, 1), y)
                    + ng.var(h, 0).sum() * 0.1 + ng.l1_loss(ng.std(h, 1), y, "sum"))
        return [w, b], loss_fn
    rng = np.random.default_rng(1)
    batches = [(ng.tensor(rng.normal(size=(5, 3))), rng.integers(0, 4, 5),
                ng.tensor(rng.normal(size=5))) for _ in range(2)]
    (pa, fa), (pb, fb) = make(), make()
    step = ng_compile(fb, cache_dir=str(tmp_path))
    for i in range(4):
        args = batches[i % 2]
        with ng.grad_tape():
            la = fa(*args)
        la.backward()
        lb = step(*args)
        assert la.numpy() == lb.numpy(), i
        for a, b in zip(pa, pb):
            np.testing.assert_array_equal(a.grad, b.grad)
    assert [s["mode"] for s in step.stats] == ["njit"]


def test_an_unknown_loss_code_is_an_error():
    from numbagrad.kernels import codes
    with pytest.raises(ValueError, match="unknown loss code"):
        codes.loss_term(codes.N_LOSS, 1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="unknown loss code"):
        codes.loss_term_grad(codes.N_LOSS, 1.0, 0.0, 1.0)
    dev = cuda_dev()
    kern = ng.kernels.get("cuda")
    x, out = kern.from_host(np.ones(3)), kern.from_host(np.zeros(3))
    with pytest.raises(ValueError, match=f"loss_terms: unknown op code {codes.N_LOSS}"):
        ng.kernels.call(kern, "loss_terms", 0, codes.N_LOSS, x, x, out, False, 1.0, 0.0)
    assert not dev.host(out).any()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_issue30_nll_loss_with_positions_and_probability_targets(dev, reduction):
    """nll_loss on (N, C, d1, d2) and cross_entropy with class probabilities
    (smoothed too), values and gradients (the target's included) as torch."""
    import torch
    from conftest import matches_torch as match
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 3, 4, 2))
    labels = rng.integers(0, 3, size=(2, 4, 2))
    labels[0, 1, 1] = -100
    match(lambda a: ng.nll_loss(ng.log_softmax(a, 1), labels, reduction),
          lambda a: torch.nn.functional.nll_loss(torch.log_softmax(a, 1), torch.tensor(labels),
                                                 reduction=reduction), [x], dev=dev,
          name="nll positions")
    probs = rng.uniform(size=x.shape)
    for smoothing in (0.0, 0.2):
        match(lambda a, t: ng.cross_entropy(a, t, reduction, label_smoothing=smoothing),
              lambda a, t: torch.nn.functional.cross_entropy(a, t, reduction=reduction,
                                                             label_smoothing=smoothing),
              [x, probs], dev=dev, name=f"soft targets {smoothing}")
