"""PyTorch's loss options on the older losses: cross_entropy's ignore_index,
label_smoothing and reduction="none", and reduction="none" for mse_loss and
binary_cross_entropy_with_logits, on both devices against PyTorch."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import numbagrad as ng

CE_CASES = [((6, 4), None), ((3, 4, 2, 3), None)]


def _labels(shape, rng, ignore=None):
    n, c, rest = shape[0], shape[1], shape[2:]
    y = rng.integers(0, c, (n, *rest))
    if ignore is not None:
        y.reshape(-1)[::3] = ignore
    return y


def _run(dev, fn, x, *args, **kw):
    """fn's value and the gradient of sum(value) with respect to x."""
    X = dev.param(x)
    with ng.grad_tape():
        out = fn(X, *args, **kw)
        total = ng.sum(out) if out.ndim else out
    total.backward()
    return out.numpy(), dev.host(X.grad)


def _torch(fn, x, *args, **kw):
    T = torch.tensor(x, requires_grad=True)
    out = fn(T, *args, **kw)
    (out.sum() if out.ndim else out).backward()
    return out.detach().numpy(), T.grad.numpy()


@pytest.mark.parametrize("shape", [(6, 4), (3, 4, 2, 3)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.25])
@pytest.mark.parametrize("ignore", [None, -100, 2])
def test_cross_entropy_options_match_torch(dev, shape, reduction, smoothing, ignore):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape)
    y = _labels(shape, rng, ignore)
    kw = {"reduction": reduction, "label_smoothing": smoothing}
    if ignore is not None:
        kw["ignore_index"] = ignore
    got, grad = _run(dev, ng.cross_entropy, x, y, **kw)
    want, want_grad = _torch(F.cross_entropy, x, torch.tensor(y), **kw)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-9, atol=1e-12)


def test_cross_entropy_all_ignored_mean_is_nan():
    x = np.ones((3, 2))
    out = ng.cross_entropy(ng.tensor(x), np.full(3, -100))
    assert np.isnan(out.item())
    assert np.isnan(F.cross_entropy(torch.tensor(x), torch.full((3,), -100)).item())


def test_cross_entropy_options_gradcheck():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3))
    y = np.array([0, -100, 2, 1])
    W = ng.param(x)

    def loss():
        return ng.cross_entropy(W, y, label_smoothing=0.1)
    ng.gradcheck(loss, [W])   # raises on a mismatch


def test_cross_entropy_option_errors_change_nothing():
    W = ng.param(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="label_smoothing"):
        ng.cross_entropy(W, np.array([0, 1]), label_smoothing=1.5)
    with pytest.raises(TypeError, match="ignore_index"):
        ng.cross_entropy(W, np.array([0, 1]), ignore_index=1.0)
    with pytest.raises(ValueError, match="reduction"):
        ng.cross_entropy(W, np.array([0, 1]), reduction="avg")
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):   # not the ignored value
        ng.cross_entropy(W, np.array([0, -1]), ignore_index=-100)
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        ng.cross_entropy(W, np.array([0, 7]), reduction="none")
    assert W.grad is None


@pytest.mark.parametrize("shape", [(5,), (2, 3, 4), ()])
def test_mse_and_bce_logits_reduction_none_match_torch(dev, shape):
    rng = np.random.default_rng(3)
    x, t = rng.standard_normal(shape), rng.uniform(0, 1, shape)
    for ng_fn, torch_fn in ((ng.mse_loss, F.mse_loss),
                            (ng.binary_cross_entropy_with_logits,
                             F.binary_cross_entropy_with_logits)):
        got, grad = _run(dev, ng_fn, x, dev.tensor(t), reduction="none")
        want, want_grad = _torch(torch_fn, x, torch.tensor(t), reduction="none")
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(grad, want_grad, rtol=1e-9, atol=1e-12)


def test_nll_loss_over_positions_names_the_callers_position_of_a_bad_label():
    """(N, C, d1) log-probabilities were flattened before the label check, so
    its error named target[2] of a (8, 3) input for target[0, 2] of (2, 3, 4)."""
    with pytest.raises(ValueError, match=r"target\[0, 2\] is class 5, outside \[0, 3\) for "
                                         r"log_probs of shape \(2, 3, 4\)"):
        ng.nll_loss(ng.tensor(np.zeros((2, 3, 4))), np.array([[0, 1, 5, 0], [0, 0, 0, 0]]))
