"""Non-finite windows (nonfinite="raise" | "skip" | "ignore") and windows that add nothing."""
import numpy as np
import pytest
from conftest import mse_loss_of

import numbagrad as ng

NAN, INF = float("nan"), float("inf")


def rnorm(seed, *shape):
    return np.random.default_rng(seed).normal(size=shape)


def build(dev, kind="adam", nonfinite="raise", k=2, **kw):
    A, B = dev.param(rnorm(1, 2, 3)), dev.param(rnorm(2, 2, 3))
    if kind == "adam":
        opt = ng.optim.Adam({"A": A, "B": B}, lr=0.01, accumulate_steps=k, nonfinite=nonfinite,
                            **kw)
    else:
        opt = ng.optim.SGD({"A": A, "B": B}, lr=0.1, momentum=0.9, accumulate_steps=k,
                           nonfinite=nonfinite, **kw)
    return A, B, opt


def micro_step(dev, A, B, opt, bad=None, spelling="grad", seed=3):
    """One micro-step where both params get a gradient; ``bad`` poisons A's.

    NaN enters through the data; infinity replaces A's gradient directly
    (through the data it would make the simulator's GEMM warn about inf * 0).
    """
    x, y = rnorm(seed, 3, 1), np.zeros((2, 1))
    if bad is not None and np.isnan(bad):
        x = x.copy()
        x[1, 0] = bad
    la, lb = mse_loss_of(dev, A, x, y), mse_loss_of(dev, B, rnorm(seed + 1, 3, 1), y)
    poison = dev.tensor(np.full(A.shape, bad)) if bad is not None and np.isinf(bad) else None
    if spelling == "grad":
        la.backward()
        lb.backward()
        if poison is not None:
            A.grad = poison
        return opt.step()
    grads = {**ng.backward(la), **ng.backward(lb)}
    if poison is not None:
        grads[A.id] = poison.data
    A.grad = None
    B.grad = None
    return opt.step(grads)


def state_of(dev, opt):
    state = opt.state_dict()
    return [dev.host(p.data).copy() for p in opt.params], state["t"], state["groups"][0]["slots"]


def assert_untouched(dev, opt, before):
    after = state_of(dev, opt)
    for a, b in zip(before[0], after[0]):
        np.testing.assert_array_equal(a, b)
    assert before[1] == after[1]
    for name in before[2]:
        np.testing.assert_array_equal(before[2][name], after[2][name])


def assert_discarded(opt, A, B):
    assert opt.pending_steps == 0 and A.grad is None and B.grad is None
    for g in opt._groups:
        assert not any(g.seen)


@pytest.mark.parametrize("spelling", ["grad", "mapping"])
@pytest.mark.parametrize("bad", [NAN, INF])
def test_raise_discards_the_window_and_names_the_params(dev, spelling, bad):
    A, B, opt = build(dev)
    micro_step(dev, A, B, opt, spelling=spelling)
    micro_step(dev, A, B, opt, spelling=spelling)     # one good update first
    before = state_of(dev, opt)
    micro_step(dev, A, B, opt, bad=bad, spelling=spelling)
    with pytest.raises(FloatingPointError, match=r"in A; nothing was applied") as info:
        micro_step(dev, A, B, opt, spelling=spelling)
    assert "B" not in str(info.value).split(" in ")[-1].split(";")[0]
    assert_untouched(dev, opt, before)
    assert_discarded(opt, A, B)
    assert opt.t == 1 and opt.skipped == 0
    # the next window starts from scratch and applies normally
    micro_step(dev, A, B, opt, spelling=spelling)
    assert micro_step(dev, A, B, opt, spelling=spelling) is True and opt.t == 2


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_skip_warns_counts_and_leaves_the_run_as_if_the_window_never_was(dev, kind):
    A, B, opt = build(dev, kind, nonfinite="skip")
    A2, B2, clean = build(dev, kind, nonfinite="skip")
    for o, a, b in ((opt, A, B), (clean, A2, B2)):
        micro_step(dev, a, b, o)
        micro_step(dev, a, b, o)
    before = state_of(dev, opt)
    micro_step(dev, A, B, opt, bad=NAN)
    with pytest.warns(RuntimeWarning, match=r"in A; nothing was applied .*1 skipped so far"):
        assert micro_step(dev, A, B, opt) is False
    assert_untouched(dev, opt, before)
    assert_discarded(opt, A, B)
    assert (opt.skipped, opt.t) == (1, 1)
    for o, a, b in ((opt, A, B), (clean, A2, B2)):
        micro_step(dev, a, b, o, seed=7)
        assert micro_step(dev, a, b, o, seed=8) is True
    np.testing.assert_array_equal(A.numpy(), A2.numpy())
    np.testing.assert_array_equal(B.numpy(), B2.numpy())
    assert opt.t == clean.t == 2


def test_ignore_applies_the_window_as_before(dev):
    A, B, opt = build(dev, "sgd", nonfinite="ignore")
    micro_step(dev, A, B, opt, bad=NAN)
    assert micro_step(dev, A, B, opt) is True
    assert np.isnan(A.numpy()).any() and np.isfinite(B.numpy()).all()
    assert opt.t == 1 and opt.skipped == 0


def test_both_params_are_named_and_flush_checks_too(dev):
    A, B, opt = build(dev, "sgd", k=3)
    A.grad = dev.tensor(np.full((2, 3), NAN))
    B.grad = dev.tensor(np.full((2, 3), -INF))
    opt.step()
    with pytest.raises(FloatingPointError, match="in A, B;"):
        opt.flush()
    assert_discarded(opt, A, B)
    assert opt.flush() is False


def test_clipping_with_a_non_finite_window_is_still_caught(dev):
    A, B, opt = build(dev, nonfinite="skip", max_grad_norm=1.0)
    micro_step(dev, A, B, opt)
    micro_step(dev, A, B, opt)
    norm = opt.last_grad_norm
    micro_step(dev, A, B, opt, bad=INF)
    with pytest.warns(RuntimeWarning, match="non-finite"):
        micro_step(dev, A, B, opt)
    assert opt.last_grad_norm == norm   # the norm of the last *applied* window
    assert np.isfinite(A.numpy()).all()


def test_skip_count_and_last_norm_survive_a_state_dict(dev):
    A, B, opt = build(dev, nonfinite="skip")
    micro_step(dev, A, B, opt)
    micro_step(dev, A, B, opt)
    micro_step(dev, A, B, opt, bad=NAN)
    with pytest.warns(RuntimeWarning):
        micro_step(dev, A, B, opt)
    *_, again = build(dev, nonfinite="skip")
    again.load_state_dict(opt.state_dict())
    assert (again.skipped, again.last_grad_norm, again.t) == (1, opt.last_grad_norm, 1)


@pytest.mark.parametrize("bad", ["warn", None, True])
def test_nonfinite_must_be_one_of_the_three(bad):
    W = ng.param(np.ones(2))
    with pytest.raises(ValueError, match=r"nonfinite must be one of \('raise', 'skip', "):
        ng.optim.Adam([W], nonfinite=bad)
    assert W._owner is None


# ------------------------------------------------- windows that add nothing
def test_a_window_without_any_gradient_warns_naming_the_params(dev):
    A, B, opt = build(dev, "sgd", k=2)
    with pytest.warns(RuntimeWarning, match=r"SGD.step\(\) was called with no gradient "
                                            r"reaching its params \(A, B\)"):
        assert opt.step() is False   # no backward since the last step: not counted
    assert (opt.pending_steps, opt.t) == (0, 0)
    A.grad = dev.tensor(np.ones((2, 3)), dtype=A.dtype)   # fed, then cleared: counted,
    A.grad = None                                          # but the window stays empty
    assert opt.step() is False and opt.pending_steps == 1
    A.grad = dev.tensor(np.ones((2, 3)), dtype=A.dtype)
    A.grad = None
    with pytest.warns(RuntimeWarning, match=r"window of 2 micro-step\(s\) .* no gradient for "
                                            r"any of this optimizer's params \(A, B\)"):
        assert opt.step() is True
    assert opt.t == 1   # as before: the (empty) update counts


def test_a_mapping_holding_none_of_the_params_warns(dev):
    *_, opt = build(dev, "sgd", k=2)
    other = dev.param(np.ones((2, 3)))
    grads = ng.backward(mse_loss_of(dev, other, np.ones((3, 1)), np.zeros((2, 1))))
    with pytest.warns(RuntimeWarning, match=r"mapping holds a gradient for none of this "
                                            r"optimizer's params \(A, B\)"):
        assert opt.step(grads) is False
    assert opt.pending_steps == 1
    with pytest.warns(RuntimeWarning) as record:
        opt.step({})
    messages = [str(w.message) for w in record]
    assert any("mapping holds" in m for m in messages)
    assert any("window of 2 micro-step(s)" in m for m in messages)


def test_a_window_where_some_params_got_gradients_does_not_warn(dev, recwarn):
    A, _, opt = build(dev, "sgd", k=2)
    for _ in range(2):
        mse_loss_of(dev, A, np.ones((3, 1)), np.zeros((2, 1))).backward()
        opt.step()
    assert opt.t == 1
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
