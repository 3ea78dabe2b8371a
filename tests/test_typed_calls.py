"""kernels.call_typed: the CPU runs a keyed call site's compiled specialisation
directly; the result is the dispatched kernel's, and a site that passes other
types under one key is caught (NUMBAGRAD_CHECK_TYPED, on in the suite)."""
import numpy as np
import pytest

import numbagrad as ng
from numbagrad import kernels
from numbagrad.kernels import _typed_calls


cpu = kernels.get("cpu")


def test_typed_gemm_runs_the_compiled_specialisation(typed_unchecked):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    outs = [np.empty((3, 2)) for _ in range(3)]
    for out in outs:
        kernels.call_typed(cpu, "gemm", 0, "test-key", a, b, out, 0, 0, 1.0, 0.0)
    entry = _typed_calls._typed[(cpu, "gemm", "test-key")]
    assert entry is not cpu.KERNEL_FNS[0]["gemm"]   # not the dispatcher
    for out in outs:
        np.testing.assert_allclose(out, a @ b, rtol=1e-12)


def test_a_site_passing_other_types_under_its_key_is_caught():
    a, b = np.ones((2, 2)), np.ones((2, 2))
    out = np.empty((2, 2))
    key = "test-mismatch"
    kernels.call_typed(cpu, "gemm", 0, key, a, b, out, 0, 0, 1.0, 0.0)
    assert _typed_calls.CHECK_TYPED
    with pytest.raises(TypeError, match="differ from the first call"):
        kernels.call_typed(cpu, "gemm", 0, key, a.astype(np.float32), b.astype(np.float32),
                           out.astype(np.float32), 0, 0, 1.0, 0.0)
    with pytest.raises(TypeError, match="differ from the first call"):   # a bool flag
        kernels.call_typed(cpu, "gemm", 0, key, a, b, out, False, 0, 1.0, 0.0)


def test_readonly_inputs_share_the_key():
    a, b = np.ones((2, 3)), np.ones((3, 2))
    a.flags.writeable = False
    out = np.empty((2, 2))
    kernels.call_typed(cpu, "gemm", 0, "test-readonly", a, b, out, 0, 0, 1.0, 0.0)
    kernels.call_typed(cpu, "gemm", 0, "test-readonly", np.ones((2, 3)), b, out, 0, 0, 1.0, 0.0)
    np.testing.assert_array_equal(out, np.full((2, 2), 3.0))


def test_training_is_bit_identical_with_and_without_the_typed_path(monkeypatch, typed_unchecked):
    def train(check: bool):
        monkeypatch.setattr(_typed_calls, "CHECK_TYPED", check)
        monkeypatch.setattr(_typed_calls, "_typed", {})
        monkeypatch.setattr(_typed_calls, "_typed_signature", {})
        kernels.clear_hot_tables()
        rng = np.random.default_rng(3)
        w = ng.param(rng.standard_normal((2, 3)))
        x, y = ng.tensor(rng.standard_normal((3, 5))), ng.tensor(rng.standard_normal((2, 5)))
        opt = ng.optim.SGD([w], lr=0.1, momentum=0.9, accumulate_steps=2)
        for _ in range(8):
            with ng.grad_tape():
                loss = ng.mse_loss(w @ x, y)
            loss.backward()
            opt.step()
        model = ng.nn.Sequential(ng.nn.Linear(4, 6, rng=np.random.default_rng(1)), ng.nn.ReLU(),
                                 ng.nn.Linear(6, 3, rng=np.random.default_rng(2)))
        opt2 = ng.optim.Adam(model.parameters(), lr=0.01, accumulate_steps=2)
        xs, labels = rng.standard_normal((5, 4)), rng.integers(0, 3, 5)
        for _ in range(4):
            with ng.grad_tape():
                loss2 = ng.cross_entropy(model(ng.tensor(xs)), labels)
            loss2.backward()
            opt2.step()
        return [w.numpy()] + [p.numpy() for p in model.parameters()]

    checked, fast = train(True), train(False)
    for u, v in zip(checked, fast):
        np.testing.assert_array_equal(u, v)
