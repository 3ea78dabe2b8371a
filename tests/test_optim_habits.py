"""PyTorch optimizer habits: step() without backward, param_groups, clip_grad_*_."""
import math

import numpy as np
import pytest
import torch

import numbagrad as ng

RNG = np.random.default_rng(7)


def data(*shape):
    return RNG.standard_normal(shape)


def loss_of(ws, x):
    """sum((x @ w0) * w1-ish): a loss touching every param in ``ws``, in ng."""
    with ng.grad_tape():
        h = ng.tensor(x, device=ws[0].device) @ ws[0]
        total = (h * h).sum()
        for w in ws[1:]:
            total = total + (w * w).sum()
    return total


def torch_loss(ws, x):
    h = torch.tensor(x) @ ws[0]
    total = (h * h).sum()
    for w in ws[1:]:
        total = total + (w * w).sum()
    return total


# --------------------------------------------- step() with no backward
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_step_without_backward_is_not_counted(device):
    if device == "cuda" and not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    x, w0 = data(3, 2), data(2, 2)
    W = ng.param(w0, device=device)
    opt = ng.optim.SGD([W], lr=0.5, accumulate_steps=2)
    with pytest.warns(RuntimeWarning, match=r"SGD.step\(\) was called with no gradient"):
        assert opt.step() is False
    assert (opt.pending_steps, opt.t) == (0, 0)
    for _ in range(2):   # two real micro-steps close the window: the mean of two equal grads
        loss_of([W], x).backward()
        opt.step()
    assert opt.t == 1
    ref = torch.tensor(w0, requires_grad=True)
    torch_loss([ref], x).backward()
    np.testing.assert_allclose(W.numpy(), (ref - 0.5 * ref.grad).detach().numpy(), rtol=1e-6)


def test_the_issue_case_k2_step_then_one_micro_step():
    """k=2: step() with no backward, then backward+step: w where one micro-step puts it
    (nothing applied yet, pending 1), not halfway through an averaged update."""
    W = ng.param(np.zeros(1))
    opt = ng.optim.SGD([W], lr=1.0, accumulate_steps=2)
    with pytest.warns(RuntimeWarning):
        opt.step()
    with ng.grad_tape():
        loss = (W * ng.tensor(np.array([-1.0]))).sum()
    loss.backward()
    assert opt.step() is False and opt.pending_steps == 1
    assert opt.flush() is True   # the window holds one micro-step: its mean is that grad
    np.testing.assert_allclose(W.numpy(), [1.0])   # the old counting gave 0.5


def test_grad_setter_and_mapping_feed_a_step():
    W = ng.param(np.ones(2))
    opt = ng.optim.SGD([W], lr=0.1)
    W.grad = ng.tensor(np.ones(2))
    assert opt.step() is True
    np.testing.assert_allclose(W.numpy(), [0.9, 0.9])
    other = ng.optim.SGD([ng.param(np.ones(2))], lr=0.1)
    assert other.step({other.params[0].id: np.ones(2)}) is True


def test_zero_grad_after_backward_unfeeds_and_samples_mode():
    x = data(3, 2)
    W = ng.param(data(2, 2))
    opt = ng.optim.SGD([W], lr=0.1, accumulate_steps=2, average="samples")
    loss_of([W], x).backward()
    opt.zero_grad()
    with pytest.warns(RuntimeWarning, match="no gradient reaching"):
        assert opt.step(samples=3) is False
    assert opt.pending_samples == 0
    loss_of([W], x).backward()
    assert opt.step(samples=3) is False and opt.pending_samples == 3


def test_compiled_steps_still_count():
    x = data(3, 2)
    W = ng.param(data(2, 2))
    opt = ng.optim.SGD([W], lr=0.1, accumulate_steps=2)
    step = ng.compile(lambda a: loss_of([W], a.numpy()), optimizer=opt)
    for _ in range(4):
        step(ng.tensor(x))
    assert opt.t == 2 and opt.pending_steps == 0


# ------------------------------------------------------- param_groups
def _pair(kind, lrs, extra=None):
    a0, b0 = data(2, 2), data(3)
    A, B = ng.param(a0), ng.param(b0)
    tA = torch.tensor(a0, requires_grad=True)
    tB = torch.tensor(b0, requires_grad=True)
    extra = extra or [{}, {}]
    ours = [{"params": [A], "lr": lrs[0], **extra[0]}, {"params": [B], "lr": lrs[1], **extra[1]}]
    theirs = [{"params": [tA], "lr": lrs[0], **extra[0]},
              {"params": [tB], "lr": lrs[1], **extra[1]}]
    if kind == "sgd":
        return (ng.optim.SGD(ours, lr=9.0, momentum=0.9),
                torch.optim.SGD(theirs, lr=9.0, momentum=0.9), (A, B), (tA, tB))
    if kind == "adam":
        return ng.optim.Adam(ours), torch.optim.Adam(theirs), (A, B), (tA, tB)
    return (ng.optim.AdamW(ours, weight_decay=0.1), torch.optim.AdamW(theirs, weight_decay=0.1),
            (A, B), (tA, tB))


def _train(opt, topt, ours, theirs, steps, x, mutate=None):
    for i in range(steps):
        if mutate is not None and i == mutate:
            opt.param_groups[0]["lr"] *= 0.1
            topt.param_groups[0]["lr"] *= 0.1
        h = ng.tensor(x) @ ours[0]
        with ng.grad_tape():
            h = ng.tensor(x) @ ours[0]
            loss = (h * h).sum() + (ours[1] * ours[1] * ours[1]).sum()
        loss.backward()
        opt.step()
        topt.zero_grad()
        th = torch.tensor(x) @ theirs[0]
        ((th * th).sum() + (theirs[1] ** 3).sum()).backward()
        topt.step()
    for p, t in zip(ours, theirs):
        np.testing.assert_allclose(p.numpy(), t.detach().numpy(), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("kind,extra", [("sgd", [{"weight_decay": 0.2}, {}]),
                                        ("adam", [{}, {"betas": (0.8, 0.99)}]),
                                        ("adamw", [{"weight_decay": 0.0}, {"eps": 1e-6}])])
def test_two_groups_match_torch(kind, extra):
    opt, topt, ours, theirs = _pair(kind, (0.05, 0.01), extra)
    _train(opt, topt, ours, theirs, 4, data(4, 2), mutate=2)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.005)


def test_one_group_lr_mutation_on_the_fused_path():
    opt, topt, ours, theirs = _pair("sgd", (0.05, 0.05))
    merged = ng.optim.SGD(list(ours), lr=0.05, momentum=0.9)   # one group: boundary kernel
    assert len(merged.param_groups) == 1
    topt = torch.optim.SGD(theirs, lr=0.05, momentum=0.9)
    _train(merged, topt, ours, theirs, 4, data(4, 2), mutate=2)


def test_param_group_errors():
    A, B = ng.param(np.ones(2)), ng.param(np.ones(3))
    with pytest.raises(ValueError, match=r"param_groups\[1\].params\[0\] is also "
                                         r"param_groups\[0\].params\[0\]"):
        ng.optim.SGD([{"params": [A]}, {"params": [A, B]}], lr=0.1)
    with pytest.raises(ValueError, match="no per-group hyper-parameter 'betas'"):
        ng.optim.SGD([{"params": [A], "betas": (0.9, 0.9)}], lr=0.1)
    with pytest.raises(ValueError, match="'momentum' is shared"):
        ng.optim.SGD([{"params": [A], "momentum": 0.5}], lr=0.1)
    opt = ng.optim.SGD([{"params": [A]}, {"params": [B], "lr": 0.2}], lr=0.1)
    assert A._owner is opt
    with pytest.raises(ValueError, match="lr must be >= 0"):
        opt.param_groups[0]["lr"] = -1.0
    assert opt.param_groups[0]["lr"] == 0.1
    with pytest.raises(ValueError, match="lr differs between the param groups"):
        _ = opt.lr
    with pytest.raises(KeyError):
        del opt.param_groups[0]["lr"]


def test_state_dict_keeps_group_hypers_and_schedules():
    A, B = ng.param(np.ones(2)), ng.param(np.ones(3))
    sched = ng.optim.schedules.step(0.1, every=1, gamma=0.5)
    opt = ng.optim.AdamW([{"params": [A], "lr": sched}, {"params": [B], "weight_decay": 0.3}])
    for _ in range(2):
        with ng.grad_tape():
            loss = (A * A).sum() + (B * B).sum()
        loss.backward()
        opt.step()
    state = opt.state_dict()
    A2, B2 = ng.param(np.ones(2)), ng.param(np.ones(3))
    again = ng.optim.AdamW([{"params": [A2]}, {"params": [B2]}])
    again.load_state_dict(state)
    assert again.param_groups[0]["lr"] == sched and again.param_groups[1]["weight_decay"] == 0.3
    assert again._lr_for(again.t)[0] == pytest.approx(0.025)   # the schedule at t=2
    with pytest.raises(ValueError, match="2 param groups"):
        ng.optim.AdamW([ng.param(np.ones(2)), ng.param(np.ones(3))]).load_state_dict(state)


# ------------------------------------------------------ clip_grad_*_
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf, -math.inf])   # (-inf: the smallest)
@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_grad_norm_matches_torch(norm_type, max_norm):
    grads = [data(2, 3), data(4)]
    ps = [ng.param(np.zeros_like(g)) for g in grads] + [ng.param(np.zeros(2))]   # last: no grad
    for p, g in zip(ps, grads):
        p.grad = ng.tensor(g)
    ts = [torch.zeros(g.shape, dtype=torch.float64, requires_grad=True) for g in grads]
    for t, g in zip(ts, grads):
        t.grad = torch.tensor(g)
    total = ng.nn.utils.clip_grad_norm_(ps, max_norm, norm_type)
    ttotal = torch.nn.utils.clip_grad_norm_(ts, max_norm, norm_type)
    assert total.shape == () and float(total.numpy()) == pytest.approx(float(ttotal))
    for p, t in zip(ps, ts):
        np.testing.assert_allclose(p.grad, t.grad.numpy(), rtol=1e-12)
    assert ps[2].grad is None


def test_clip_grad_norm_nonfinite_and_value():
    p = ng.param(np.zeros(3))
    p.grad = ng.tensor(np.array([1.0, np.inf, 0.0]))
    with pytest.raises(RuntimeError, match="non-finite"):
        ng.nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    assert np.isinf(p.grad[1])   # unchanged
    g = data(5)
    q = ng.param(np.zeros(5))
    q.grad = ng.tensor(g)
    t = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    t.grad = torch.tensor(g)
    ng.nn.utils.clip_grad_value_(q, 0.3)
    torch.nn.utils.clip_grad_value_(t, 0.3)
    np.testing.assert_allclose(q.grad, t.grad.numpy())


def test_clip_grad_norm_on_cuda():
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    g = data(2, 3)
    p = ng.param(np.zeros((2, 3)), device="cuda")
    p.grad = ng.tensor(g, device="cuda")
    total = ng.nn.utils.clip_grad_norm_([p], 0.5)
    assert float(total.numpy()) == pytest.approx(np.linalg.norm(g))
    np.testing.assert_allclose(p.grad.copy_to_host(), g * 0.5 / (np.linalg.norm(g) + 1e-6))
