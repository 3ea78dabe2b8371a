"""Eager ``opt.step()`` closes a window through the boundary kernel that
``ng.compile`` runs (one call) where it applies; ``Window.close`` (Python,
several kernels) is the reference: the same bits, window after window."""
import numpy as np
import pytest

import numbagrad as ng
from numbagrad.kernels.cpu.boundary import clip_scale
from numbagrad.optim.fused import FusedUpdate

RULES = {
    "sgd": lambda ps, **kw: ng.optim.SGD(ps, lr=0.05, **kw),
    "sgd-momentum-wd": lambda ps, **kw: ng.optim.SGD(ps, lr=0.05, momentum=0.9,
                                                      weight_decay=0.01, **kw),
    "adam": lambda ps, **kw: ng.optim.Adam(ps, lr=0.01, **kw),
    "adamw": lambda ps, **kw: ng.optim.AdamW(ps, lr=0.01, weight_decay=0.1, **kw),
}
WINDOWS = {"plain": {}, "clipped": {"max_grad_norm": 0.3}, "sum": {"average": False},
           "unchecked": {"nonfinite": "ignore"}, "k1": {"accumulate_steps": 1}}


def train(rule: str, dtype, fused: bool, options: dict, windows: int = 6):
    rng = np.random.default_rng(0)
    W = ng.param(rng.normal(size=(3, 4)).astype(dtype))
    b = ng.param(rng.normal(size=(3, 1)).astype(dtype))
    unused = ng.param(rng.normal(size=(2,)).astype(dtype))    # never reached
    kw = {"accumulate_steps": 3, **options}
    opt = RULES[rule]([W, b, unused], **kw)
    if not fused:
        opt._window.boundary = False     # Window.close's Python path only
    norms = []
    for i in range(windows * kw["accumulate_steps"]):
        x = rng.normal(size=(4, 5)).astype(dtype)
        y = rng.normal(size=(3, 5)).astype(dtype)
        with ng.grad_tape():
            loss = ng.mse_loss(W @ ng.as_tensor(x) + b, ng.as_tensor(y))
        loss.backward()
        if opt.step():
            norms.append(opt.last_grad_norm)
    return [p.numpy() for p in (W, b, unused)], norms, opt


@pytest.mark.parametrize("window", list(WINDOWS))
@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_eager_boundary_kernel_gives_window_closes_bits(rule, dtype, window):
    got, got_norms, opt = train(rule, dtype, True, WINDOWS[window])
    assert opt._window.boundary, "the boundary kernel should apply to a small CPU group"
    want, want_norms, ref = train(rule, dtype, False, WINDOWS[window])
    for g, w in zip(got, want):
        assert g.tobytes() == w.tobytes()
    assert got_norms == want_norms and opt.t == ref.t == len(want_norms)


def test_a_nonfinite_window_still_raises_and_names_the_param():
    W = ng.param(np.ones((2, 2)))
    opt = ng.optim.SGD([W], lr=0.1, accumulate_steps=2)
    for value in (1.0, np.inf):
        with ng.grad_tape():
            loss = ng.sum(W * value)
        loss.backward()
        if value == 1.0:
            assert not opt.step()
    with pytest.raises(FloatingPointError, match="non-finite"):
        opt.step()
    assert opt.t == 0 and (W.numpy() == 1.0).all()


def test_a_skipped_window_warns_at_the_callers_line_and_counts():
    W = ng.param(np.ones((2, 2)))
    opt = ng.optim.SGD([W], lr=0.1, accumulate_steps=1, nonfinite="skip")
    with ng.grad_tape():
        loss = ng.sum(W * np.inf)
    loss.backward()
    with pytest.warns(RuntimeWarning, match="nonfinite='skip'") as caught:
        assert not opt.step()
    assert caught[0].filename == __file__
    assert (opt.t, opt.skipped) == (0, 1) and (W.numpy() == 1.0).all()


@pytest.mark.parametrize("rule", ["sgd-momentum-wd", "adamw"])
def test_flush_closes_through_the_boundary_kernel_with_the_same_bits(rule):
    def run(fused):
        rng = np.random.default_rng(1)
        W = ng.param(rng.normal(size=(3, 4)))
        opt = RULES[rule]([W], accumulate_steps=4, max_grad_norm=0.5)
        if not fused:
            opt._window.boundary = False
        norms = []
        for i in range(9):
            with ng.grad_tape():
                loss = ng.sum(W * ng.as_tensor(rng.normal(size=(3, 4))))
            loss.backward()
            opt.step()
            if i % 3 == 1:
                assert opt.flush()
                norms.append(opt.last_grad_norm)
        return W.numpy(), norms, opt
    got, got_norms, opt = run(True)
    want, want_norms, ref = run(False)
    assert opt._window.boundary and not ref._window.boundary
    assert got.tobytes() == want.tobytes() and got_norms == want_norms
    assert opt.t == ref.t == 3


def test_the_compiled_step_and_eager_step_share_one_boundary():
    W = ng.param(np.ones((2, 3)))
    opt = ng.optim.Adam([W], lr=0.1)
    fused = FusedUpdate.build(opt, [W])
    assert fused is not None and fused.boundary is opt._window.boundary
    assert (fused.kernel, fused.args, fused.ctl) == (
        fused.boundary.kernel, fused.boundary.args, fused.boundary.ctl)
    assert FusedUpdate.build(opt, []) is None        # a param the step does not reach


@pytest.mark.parametrize("max_norm", [0.1, 1.0, 100.0])
def test_clip_scale_clips_as_torch(max_norm):
    torch = pytest.importorskip("torch")
    g = np.random.default_rng(2).normal(size=7)
    scale = 0.25
    got, norm, ok = clip_scale(scale, float(np.sum(g * g)), max_norm, True)
    p = torch.zeros(7, dtype=torch.float64, requires_grad=True)
    p.grad = torch.tensor(g * scale)        # the window's averaged total
    want_norm = float(torch.nn.utils.clip_grad_norm_([p], max_norm))
    assert ok and norm == pytest.approx(want_norm, rel=1e-14)
    np.testing.assert_allclose(got * g, p.grad.numpy(), rtol=1e-14)


def test_clip_scale_flags_a_nonfinite_total_only_when_checking():
    for total in (np.inf, np.nan):
        assert clip_scale(0.5, total, -1.0, True)[2] is False
        scale, norm, ok = clip_scale(0.5, total, 1.0, False)
        assert ok and np.isnan(scale) == np.isnan(total) and not np.isfinite(norm)
    assert clip_scale(0.5, np.nan, -1.0, False) == (0.5, -1.0, True)   # norm not needed
