"""Gradient accumulation, ported from ggmlR's tests/testthat/test-ag-grad-accum.R.

Two places hold a gradient and they do not agree: ``param.grad`` accumulates
across backward calls, while ``ng.backward``'s return value holds only that
call's gradients. The seed recorded ``optimizer$step(env)`` missing the
window's sum as a known gap; here ``step(grads)`` adds every passed mapping
into the optimizer's own window buffer, so the gap is fixed and tested.
Every test runs once per device.
"""
import numpy as np
import pytest
from conftest import mse_loss_of

import numbagrad as ng


def rnorm(seed, *shape):
    return np.random.default_rng(seed).normal(size=shape)


# ----------------------------------------------------- what accumulation does
def test_backward_accumulates_into_grad_across_calls(dev):
    W = dev.param(rnorm(101, 2, 3))
    y = np.zeros((2, 1))
    x1, x2 = rnorm(1, 3, 1), rnorm(2, 3, 1)

    def single(x):
        W.grad = None
        mse_loss_of(dev, W, x, y).backward()
        return dev.host(W.grad).copy()   # .grad is the reused accumulator

    g1, g2 = single(x1), single(x2)
    assert not np.allclose(g1, g2)

    W.grad = None
    mse_loss_of(dev, W, x1, y).backward()
    np.testing.assert_allclose(dev.host(W.grad), g1, rtol=0, atol=1e-12)
    mse_loss_of(dev, W, x2, y).backward()
    np.testing.assert_allclose(dev.host(W.grad), g1 + g2, rtol=0, atol=1e-12)


def test_zero_grad_clears_the_accumulator(dev):
    W = dev.param(rnorm(102, 2, 3))
    opt = ng.optim.SGD({"W": W}, lr=0.01)
    mse_loss_of(dev, W, rnorm(3, 3, 1), np.zeros((2, 1))).backward()
    assert W.grad is not None
    opt.zero_grad()
    assert W.grad is None


def test_k_micro_batches_accumulate_to_the_full_batch_gradient(dev):
    # Summing the per-example gradients of a mean loss over k single-column
    # micro-batches gives k times the full-batch gradient: the 1/k the
    # optimizer's averaging applies.
    d_in, d_out, k = 3, 2, 4
    W = dev.param(rnorm(103, d_out, d_in))
    X, Y = rnorm(4, d_in, k), np.zeros((d_out, k))

    mse_loss_of(dev, W, X, Y).backward()
    g_full = dev.host(W.grad).copy()

    W.grad = None
    for i in range(k):
        mse_loss_of(dev, W, X[:, i:i + 1], Y[:, i:i + 1]).backward()
    np.testing.assert_allclose(dev.host(W.grad) / k, g_full, rtol=1e-10, atol=1e-12)


# ------------------------------------------- .grad and the return value differ
def test_backward_returns_only_this_calls_gradients(dev):
    # If the return value ever began accumulating too, step(grads) would
    # count the same gradients twice.
    W = dev.param(rnorm(104, 2, 3))
    y = np.zeros((2, 1))
    x1, x2 = rnorm(5, 3, 1), rnorm(6, 3, 1)
    g1 = dev.host(ng.backward(mse_loss_of(dev, W, x1, y))[W.id]).copy()
    g2 = ng.backward(mse_loss_of(dev, W, x2, y))
    from_call = dev.host(g2[W.id])
    assert not np.allclose(dev.host(W.grad), from_call)
    np.testing.assert_allclose(dev.host(W.grad), g1 + from_call, rtol=0, atol=1e-12)


def test_returned_gradients_are_read_only_and_never_mutated(dev):
    W = dev.param(rnorm(7, 2, 3))
    y = np.zeros((2, 1))
    grads = ng.backward(mse_loss_of(dev, W, rnorm(8, 3, 1), y))
    before = dev.host(grads[W.id]).copy()
    with pytest.raises(TypeError):
        grads[W.id] = None
    ng.backward(mse_loss_of(dev, W, rnorm(9, 3, 1), y))
    mse_loss_of(dev, W, rnorm(10, 3, 1), y).backward()
    np.testing.assert_array_equal(dev.host(grads[W.id]), before)
    if dev.name == "cpu":
        assert not grads[W.id].flags.writeable


def test_step_with_grads_applies_the_window_sum_not_the_last(dev):
    # The seed's known gap, fixed: the naive loop (step(ng.backward(l)) on
    # every micro-step) now applies the mean of the window, not the last.
    x1, x2, y, W0 = rnorm(11, 3, 1), rnorm(12, 3, 1), np.zeros((2, 1)), rnorm(105, 2, 3)

    def grads_at(x):
        W = dev.param(W0)
        return dev.host(ng.backward(mse_loss_of(dev, W, x, y))[W.id])

    g1, g2 = grads_at(x1), grads_at(x2)
    W = dev.param(W0)
    opt = ng.optim.SGD([W], lr=0.1, accumulate_steps=2)
    assert opt.step(ng.backward(mse_loss_of(dev, W, x1, y))) is False
    assert opt.step(ng.backward(mse_loss_of(dev, W, x2, y))) is True
    np.testing.assert_allclose(W.numpy(), W0 - 0.1 * (g1 + g2) / 2, rtol=1e-12, atol=1e-14)
    assert not np.allclose(W.numpy(), W0 - 0.1 * g2)


# --------------------------------------- accumulate_steps: optimizer bookkeeping
def test_step_without_argument_reads_the_accumulated_grad(dev):
    x, y, W0 = rnorm(13, 3, 1), np.zeros((2, 1)), rnorm(106, 2, 3)

    W = dev.param(W0)
    opt = ng.optim.SGD([W], lr=0.1)
    ng.backward(mse_loss_of(dev, W, x, y))
    assert opt.step() is True

    W2 = dev.param(W0)
    opt2 = ng.optim.SGD([W2], lr=0.1)
    g2 = ng.backward(mse_loss_of(dev, W2, x, y))
    W2.grad = None     # only the mapping carries the gradient now
    assert opt2.step(g2) is True

    np.testing.assert_allclose(W.numpy(), W2.numpy(), rtol=0, atol=1e-12)
    assert not np.allclose(W.numpy(), W0)


def test_accumulate_steps_delays_the_update_until_the_kth_step(dev):
    W = dev.param(rnorm(107, 2, 3))
    opt = ng.optim.SGD([W], lr=0.1, accumulate_steps=3)
    x, y = rnorm(14, 3, 1), np.zeros((2, 1))
    before = W.numpy()
    for _ in range(2):
        mse_loss_of(dev, W, x, y).backward()
        assert opt.step() is False
        np.testing.assert_array_equal(W.numpy(), before)
    mse_loss_of(dev, W, x, y).backward()
    assert opt.step() is True
    assert not np.allclose(W.numpy(), before)


def test_an_applied_step_clears_grad_and_the_next_window_starts_at_zero(dev):
    W0, x, y = rnorm(21, 2, 3), rnorm(22, 3, 1), np.zeros((2, 1))
    W = dev.param(W0)
    opt = ng.optim.SGD([W], lr=0.1, accumulate_steps=2)
    for _ in range(2):
        mse_loss_of(dev, W, x, y).backward()
        opt.step()
    assert W.grad is None
    w_mid = W.numpy()
    mse_loss_of(dev, W, x, y).backward()
    # Exactly one micro-batch's gradient at the new weights, nothing stale.
    ref = dev.param(w_mid)
    mse_loss_of(dev, ref, x, y).backward()
    np.testing.assert_allclose(dev.host(W.grad), dev.host(ref.grad), rtol=0, atol=1e-14)


def test_k_accumulated_micro_batches_equal_one_full_batch(dev):
    d_in, d_out, k = 3, 2, 4
    W0, X, Y = rnorm(108, d_out, d_in), rnorm(15, d_in, k), np.zeros((d_out, k))

    W_full = dev.param(W0)
    opt_full = ng.optim.SGD([W_full], lr=0.1)
    mse_loss_of(dev, W_full, X, Y).backward()
    opt_full.step()

    W_acc = dev.param(W0)
    opt_acc = ng.optim.SGD([W_acc], lr=0.1, accumulate_steps=k)
    for i in range(k):
        mse_loss_of(dev, W_acc, X[:, i:i + 1], Y[:, i:i + 1]).backward()
        opt_acc.step()

    np.testing.assert_allclose(W_acc.numpy(), W_full.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("average", [True, False])
def test_average_false_applies_the_plain_sum(dev, average):
    W0, x, y, k = rnorm(109, 2, 3), rnorm(16, 3, 1), np.zeros((2, 1)), 2
    W_ref = dev.param(W0)
    mse_loss_of(dev, W_ref, x, y).backward()
    g_one = dev.host(W_ref.grad)

    W = dev.param(W0)
    opt = ng.optim.SGD([W], lr=0.1, accumulate_steps=k, average=average)
    for _ in range(k):
        mse_loss_of(dev, W, x, y).backward()
        opt.step()
    # identical micro-batches: the summed update moves exactly k times as far
    factor = 1 if average else k
    np.testing.assert_allclose(W.numpy(), W0 - 0.1 * factor * g_one, rtol=1e-10, atol=1e-12)


def test_adam_counts_real_updates_not_step_calls(dev):
    W = dev.param(rnorm(110, 2, 3))
    opt = ng.optim.Adam([W], lr=1e-2, accumulate_steps=3)
    x, y = rnorm(17, 3, 1), np.zeros((2, 1))
    for expected_t in (1, 2):
        for _ in range(3):
            mse_loss_of(dev, W, x, y).backward()
            opt.step()
        assert opt.t == expected_t


def test_accumulate_steps_one_is_unchanged_and_step_grads_works(dev):
    W0, x, y = rnorm(111, 2, 3), rnorm(18, 3, 1), np.zeros((2, 1))
    W = dev.param(W0)
    opt = ng.optim.Adam([W], lr=1e-2)
    g = ng.backward(mse_loss_of(dev, W, x, y))
    assert opt.step(g) is True
    assert opt.t == 1
    assert not np.allclose(W.numpy(), W0)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "3", None])
def test_accumulate_steps_rejects_anything_but_a_positive_integer(bad):
    w = ng.param(np.ones((2, 2)))
    with pytest.raises(ValueError, match="positive integer"):
        ng.optim.SGD({"w": w}, lr=0.1, accumulate_steps=bad)
    with pytest.raises(ValueError, match="positive integer"):
        ng.optim.Adam({"w": w}, accumulate_steps=bad)
    assert w._owner is None   # nothing was built


# ---------------------------------------------------- window rules of the issue
def test_zero_grad_mid_window_warns_with_the_discarded_count(dev):
    W = dev.param(rnorm(23, 2, 3))
    opt = ng.optim.SGD([W], lr=0.1, accumulate_steps=4)
    x, y = rnorm(24, 3, 1), np.zeros((2, 1))
    for _ in range(3):
        mse_loss_of(dev, W, x, y).backward()
        opt.step()
    with pytest.warns(RuntimeWarning, match="discarded 3 accumulated micro-batch"):
        opt.zero_grad()
    assert W.grad is None and opt.pending_steps == 0


def test_zero_grad_between_windows_does_not_warn(dev, recwarn):
    W = dev.param(rnorm(25, 2, 3))
    opt = ng.optim.SGD([W], lr=0.1, accumulate_steps=1)
    x, y = rnorm(26, 3, 1), np.zeros((2, 1))
    for _ in range(2):
        opt.zero_grad()
        mse_loss_of(dev, W, x, y).backward()
        opt.step()
    opt.zero_grad()
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_mixing_the_two_spellings_inside_a_window_is_an_error(dev):
    W = dev.param(rnorm(27, 2, 3))
    x, y = rnorm(28, 3, 1), np.zeros((2, 1))
    opt = ng.optim.SGD([W], lr=0.1, accumulate_steps=3)
    mse_loss_of(dev, W, x, y).backward()
    opt.step()
    g = ng.backward(mse_loss_of(dev, W, x, y))
    before = W.numpy()
    with pytest.raises(RuntimeError, match="one spelling per window"):
        opt.step(g)
    assert opt.pending_steps == 1
    np.testing.assert_array_equal(W.numpy(), before)

    opt2 = ng.optim.SGD([dev.param(W0 := rnorm(29, 2, 3))], lr=0.1, accumulate_steps=2)
    W2 = opt2.params[0]
    opt2.step(ng.backward(mse_loss_of(dev, W2, x, y)))
    with pytest.raises(RuntimeError, match="one spelling per window"):
        opt2.step()
    np.testing.assert_array_equal(W2.numpy(), W0)


def test_backward_twice_over_one_recorded_loss_is_an_error(dev):
    W = dev.param(rnorm(30, 2, 3))
    loss = mse_loss_of(dev, W, rnorm(31, 3, 1), np.zeros((2, 1)))
    loss.backward()
    once = dev.host(W.grad).copy()
    with pytest.raises(RuntimeError, match="already run"):
        loss.backward()
    with pytest.raises(RuntimeError, match="already run"):
        ng.backward(loss)
    np.testing.assert_array_equal(dev.host(W.grad), once)


def test_ops_outside_a_tape_record_nothing(dev):
    W = dev.param(rnorm(32, 2, 3))
    loss = ng.mse_loss(ng.matmul(W, dev.tensor(rnorm(33, 3, 1))), dev.tensor(np.zeros((2, 1))))
    assert loss.item() > 0
    with pytest.raises(ValueError, match="not recorded on a tape"):
        loss.backward()
    assert W.grad is None


def test_accumulators_are_reused_across_windows(dev):
    W, b = dev.param(rnorm(34, 2, 3)), dev.param(rnorm(35, 2, 1))
    opt = ng.optim.Adam([W, b], lr=1e-2, accumulate_steps=2)
    x, y = rnorm(36, 3, 1), np.zeros((2, 1))

    def micro_step():
        with ng.grad_tape():
            loss = ng.mse_loss(ng.matmul(W, dev.tensor(x)), dev.tensor(y))
        loss.backward()
        # b is reached through no op here; only W gets a gradient
        return opt.step()

    micro_step()
    first = dev.address(W.grad)
    for _ in range(5):
        micro_step()
        if W.grad is not None:
            assert dev.address(W.grad) == first
    micro_step()
    assert dev.address(W.grad) == first
    flat = opt._groups[0].g
    assert dev.address(flat) == first   # a view into the optimizer's one flat buffer
    # b was never reached: Adam skipped it, as PyTorch skips grad-less params
    np.testing.assert_array_equal(b.numpy(), rnorm(35, 2, 1))
