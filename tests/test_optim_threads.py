"""One optimizer, several threads: a window belongs to one thread at a time.

Another thread's backward into the optimizer's params, step, flush,
zero_grad, state_dict or load_state_dict while a window is open raises a
RuntimeError naming the optimizer and both threads, and changes nothing.
"""
import threading

import numpy as np
import pytest

import numbagrad as ng
from conftest import run_threads

X = np.linspace(-1.0, 1.0, 12).reshape(3, 4)
Y = np.zeros((2, 4))
C = np.ascontiguousarray(X[:2, :3])


def micro_step(W, b, opt, linear=False):
    with ng.grad_tape():
        if linear:   # a gradient that does not depend on W, b: what a thread's forward
            # read while another thread updated them cannot change the window's total
            loss = (W * ng.as_tensor(C)).sum() + (b * 0.5).sum()
        else:
            loss = ng.mse_loss(W @ ng.as_tensor(X) + b, Y)
    loss.backward()
    return opt.step()


def model(linear=False):
    W = ng.param(np.arange(6.0).reshape(2, 3) / 10)
    b = ng.param(np.ones((2, 1)))
    if linear:
        return W, b, ng.optim.SGD({"W": W, "b": b}, lr=0.01, momentum=0.9, accumulate_steps=2)
    return W, b, ng.optim.Adam({"W": W, "b": b}, lr=0.01, accumulate_steps=2)


def serial(micro_steps, linear=False):
    W, b, opt = model(linear)
    for _ in range(micro_steps):
        micro_step(W, b, opt, linear)
    return W.numpy(), b.numpy(), opt.t


def run_threads_on(target, n=2):
    """``target()`` in n threads; the exceptions they raised."""
    return [exc for _, exc in run_threads(lambda i: target(), n)]


def test_two_threads_on_one_optimizer_keep_every_micro_step_whole():
    # The probe: two threads, 1000 micro-steps each, accumulate_steps=2.
    # A refused micro-step changed nothing, so a thread that retries it lands
    # every micro-step in a window of its own thread: t == 1000, bits as serial
    # (a merged or torn window would apply another total than two gradients).
    W, b, opt = model(linear=True)
    refused = []

    def trainer():
        for _ in range(1000):
            while True:
                try:
                    micro_step(W, b, opt, linear=True)
                    break
                except RuntimeError as exc:
                    refused.append(str(exc))

    errors = run_threads_on(trainer)
    assert not errors, errors
    assert (opt.t, opt.pending_steps) == (1000, 0)
    want_W, want_b, _ = serial(2000, linear=True)
    np.testing.assert_array_equal(W.numpy(), want_W)
    np.testing.assert_array_equal(b.numpy(), want_b)
    # refused by the window's owner, or because the other thread's update
    # wrote W or b after this thread's forward read them (the version check)
    for message in refused:
        if message.startswith("backward: "):
            assert "modified in place after it was recorded" in message
            continue
        assert message.startswith("SGD over W, b: backward() in thread 'trainer-")
        assert "but thread 'trainer-" in message


def test_a_thread_that_stops_at_the_refusal_leaves_whole_windows():
    # The probe without retries: whoever is refused stops; every micro-step
    # that returned is in the optimizer, none twice, none merged.
    W, b, opt = model(linear=True)
    done = []

    def trainer():
        for _ in range(1000):
            micro_step(W, b, opt, linear=True)
            done.append(1)

    errors = run_threads_on(trainer)
    # refused by the window's owner, or by the version check (the other thread's
    # update wrote W or b after this thread's forward read them)
    assert all(isinstance(e, RuntimeError) and (
        "SGD over W, b" in str(e) or "modified in place after it was recorded" in str(e))
        for e in errors), errors
    assert len(done) == 2 * opt.t + opt.pending_steps
    want_W, want_b, t = serial(len(done), linear=True)
    assert opt.t == t
    np.testing.assert_array_equal(W.numpy(), want_W)
    np.testing.assert_array_equal(b.numpy(), want_b)


def test_every_entry_point_is_refused_while_another_thread_holds_the_window():
    W, b, opt = model()
    opened, checked = threading.Event(), threading.Event()
    other_state = model()[2].state_dict()

    def holder():
        micro_step(W, b, opt)          # the window holds one micro-step and .grad
        opened.set()
        checked.wait(30)
        micro_step(W, b, opt)          # ... and closes it

    t = threading.Thread(target=holder, name="holder")
    t.start()
    try:
        assert opened.wait(30)
        grad = W.grad.copy()
        calls = {
            "backward()": lambda: micro_step(W, b, opt),
            "step()": opt.step,
            "flush()": opt.flush,
            "zero_grad()": opt.zero_grad,
            "state_dict()": opt.state_dict,
            "load_state_dict()": lambda: opt.load_state_dict(other_state),
            ".grad = ...": lambda: setattr(W, "grad", None),
        }
        for what, call in calls.items():
            with pytest.raises(RuntimeError) as info:
                call()
            message = str(info.value)
            assert message.startswith(f"Adam over W, b: {what} in thread 'MainThread', but "
                                      f"thread 'holder' holds this optimizer's open "
                                      f"accumulation window"), message
            assert "this optimizer is unchanged" in message
        with ng.grad_tape():             # ng.backward too, before adding into .grad
            loss = ng.mse_loss(W @ ng.as_tensor(X) + b, Y)
        with pytest.raises(RuntimeError, match="backward"):
            ng.backward(loss)
        np.testing.assert_array_equal(W.grad, grad)
        assert (opt.pending_steps, opt.t) == (1, 0)
    finally:
        checked.set()
        t.join()
    assert opt.t == 1
    assert opt.state_dict()["t"] == 1  # the window closed: any thread may use it now
    want_W, want_b, _ = serial(2)
    np.testing.assert_array_equal(W.numpy(), want_W)
    np.testing.assert_array_equal(b.numpy(), want_b)


def test_threads_take_turns_between_windows_and_take_up_an_ended_threads_window():
    W, b, opt = model()
    opt.state_dict()                   # reading it holds nothing afterwards
    for name in ("first", "second"):   # one whole window each, one thread after the other
        t = threading.Thread(target=lambda: [micro_step(W, b, opt) for _ in range(2)],
                             name=name)
        t.start()
        t.join()
    t = threading.Thread(target=micro_step, args=(W, b, opt))   # ends mid-window
    t.start()
    t.join()
    assert opt.pending_steps == 1
    assert opt.flush() is True         # this thread takes the ended thread's window up
    assert (opt.t, opt.pending_steps) == (3, 0)
    micro_step(W, b, opt)              # this thread holds a window again ...
    opt.load_state_dict(opt.state_dict())   # ... which, loaded, is no thread's
    t = threading.Thread(target=micro_step, args=(W, b, opt))
    t.start()
    t.join()
    assert (opt.t, opt.pending_steps) == (4, 0)


def test_a_compiled_step_is_refused_too():
    W, b, opt = model()
    step = ng.compile(lambda x: ng.mse_loss(W @ x + b, Y), optimizer=opt)
    x = ng.tensor(X)
    step(x)
    step(x)                            # one whole window from this thread
    opened, checked = threading.Event(), threading.Event()

    def holder():
        step(x)
        opened.set()
        checked.wait(30)
        step(x)

    t = threading.Thread(target=holder, name="holder")
    t.start()
    try:
        assert opened.wait(30)
        with pytest.raises(RuntimeError, match=r"Adam over W, b: a compiled step \(ng.compile\) "
                                               r"in thread 'MainThread', but thread 'holder'"):
            step(x)
        assert (opt.pending_steps, opt.t) == (1, 1)
    finally:
        checked.set()
        t.join()
    assert opt.t == 2


def test_a_refused_load_state_dict_keeps_the_callers_window():
    W, b, opt = model()
    micro_step(W, b, opt)                      # this thread holds the window
    with pytest.raises(ValueError, match="malformed optimizer state dict"):
        opt.load_state_dict({"type": "Adam"})
    errors = run_threads_on(lambda: micro_step(W, b, opt), n=1)
    assert len(errors) == 1 and "holds this optimizer's open" in str(errors[0])
    assert opt.pending_steps == 1


def test_state_dict_and_a_refused_grad_take_no_window():
    # A loaded window is no thread's; a thread that only reads the state, or
    # whose .grad = ... is refused for its shape, must not become its holder.
    W, b, opt = model()
    micro_step(W, b, opt)
    opt.load_state_dict(opt.state_dict())
    done, release = threading.Event(), threading.Event()
    failures = []

    def reader():
        try:
            opt.state_dict()
            with pytest.raises(ValueError, match="does not match"):
                W.grad = np.zeros((5, 5))
        except BaseException as exc:   # reported below
            failures.append(exc)
        done.set()
        release.wait(30)               # alive while the main thread goes on

    t = threading.Thread(target=reader, name="reader")
    t.start()
    try:
        assert done.wait(30)
        assert micro_step(W, b, opt)   # this thread takes the window and closes it
    finally:
        release.set()
        t.join()
    assert not failures, failures
    assert opt.t == 1
