"""Bad input raises a clear error before anything changes."""
import numpy as np
import pytest
import torch
from conftest import Dev, mse_loss_of

import numbagrad as ng
from numbagrad import kernels


# ----------------------------------------------------------------- tensors
@pytest.mark.parametrize("data, match", [
    (np.ones((2, 2), complex), "real numbers"),
    (np.array(["a", "b"]), "real numbers"),
    (np.array([1, 2], np.uint64), "real numbers"),
])
def test_tensor_rejects_bad_data(data, match):
    with pytest.raises((TypeError, ValueError), match=match):
        ng.tensor(data)
    with pytest.raises((TypeError, ValueError), match=match):
        ng.param(data)


def test_tensor_rejects_a_bad_dtype_or_device():
    with pytest.raises(TypeError, match="tensors hold float32, .* not complex64"):
        ng.tensor([1, 2], dtype=np.complex64)
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        ng.tensor([1.0], device="tpu")


def test_as_tensor_refuses_what_it_cannot_share():
    with pytest.raises(TypeError, match="float16, bfloat16, integer or bool data, got complex64"):
        ng.as_tensor(np.arange(3, dtype=np.complex64))
    with pytest.raises(ValueError, match="C-contiguous"):
        ng.as_tensor(np.ones((3, 4))[:, ::2])
    with pytest.raises(TypeError, match="a numpy array, a Numba CUDA array or a "
                       r"__cuda_array_interface__ object, got list"):
        ng.as_tensor([1.0, 2.0])


def test_cuda_that_is_not_usable_says_why(monkeypatch):
    monkeypatch.setattr(kernels._registry, "_loaded", {"cpu": kernels.get("cpu")})
    monkeypatch.setattr(kernels._diagnose, "cuda_unavailable_reason",
                        lambda: "no usable CUDA GPU or driver")
    with pytest.raises(RuntimeError, match='"cuda" requested but not usable: no usable CUDA'):
        ng.param(np.ones(2), device="cuda")
    with pytest.raises(RuntimeError, match="not usable"):
        ng.tensor(np.ones(2)).to("cuda")
    assert not kernels.cuda_available()


# --------------------------------------------------------------------- ops
def test_matmul_names_both_shapes():
    with pytest.raises(ValueError, match=r"shapes \(2, 3\) and \(4, 1\) are not aligned"):
        ng.matmul(ng.tensor(np.ones((2, 3))), ng.tensor(np.ones((4, 1))))
    with pytest.raises(ValueError, match=r"shapes \(3,\) and \(2,\)"):
        ng.matmul(ng.tensor(np.ones(3)), ng.tensor(np.ones(2)))


def test_ops_name_both_dtypes():
    a32, b64 = ng.tensor(np.ones((2, 2)), dtype=np.float32), ng.tensor(np.ones((2, 2)))
    with pytest.raises(TypeError, match=r"first operand float32 \(shape \(2, 2\)\), "
                                        r"second operand float64"):
        ng.matmul(a32, b64)
    with pytest.raises(TypeError, match="pred float32 .*target float64"):
        ng.mse_loss(a32, b64)


def test_ops_name_both_devices():
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    a, b = ng.tensor(np.ones((2, 2))), ng.tensor(np.ones((2, 2)), device="cuda")
    with pytest.raises(ValueError, match=r"different devices: first operand on cpu .* "
                                         r"second operand on cuda"):
        ng.matmul(a, b)
    with pytest.raises(ValueError, match="pred on cuda .* target on cpu"):
        ng.mse_loss(b, a)
    with pytest.raises(ValueError, match="host but the op runs on cuda"):
        ng.mse_loss(b, np.ones((2, 2)))


def test_mse_loss_rejects_mismatched_shapes_and_reductions():
    p = ng.tensor(np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"pred shape \(2, 3\) and target shape \(3, 2\)"):
        ng.mse_loss(p, np.ones((3, 2)))
    with pytest.raises(ValueError, match="reduction must be 'mean', 'sum' or 'none', got 'max'"):
        ng.mse_loss(p, np.ones((2, 3)), reduction="max")


def test_backward_rejects_a_non_scalar_or_unrecorded_loss():
    W = ng.param(np.ones((2, 3)))
    with ng.grad_tape():
        pred = W @ ng.tensor(np.ones((3, 2)))
    with pytest.raises(ValueError, match=r"one-element loss, got shape \(2, 2\)"):
        ng.backward(pred)
    with pytest.raises(TypeError, match="Tensor loss"):
        ng.backward(np.float64(1.0))
    assert W.grad is None


def test_grad_assignment_is_checked():
    W = ng.param(np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"shape \(3, 2\) and dtype float64 does not match "
                                         r"param of shape \(2, 3\)"):
        W.grad = np.ones((3, 2))
    with pytest.raises(AttributeError, match="only a param"):
        ng.tensor(np.ones(2)).grad = np.ones(2)
    assert W.grad is None
    W.grad = np.full((2, 3), 2.0)
    np.testing.assert_array_equal(W.grad, np.full((2, 3), 2.0))


# -------------------------------------------------------------- optimizers
@pytest.mark.parametrize("make, match", [
    (lambda p: ng.optim.SGD(p, lr=-0.1), "lr must be >= 0"),
    (lambda p: ng.optim.SGD(p, lr=float("nan")), "lr must be a finite"),
    (lambda p: ng.optim.Adam(p, lr=float("inf")), "lr must be a finite"),
    (lambda p: ng.optim.SGD(p, lr=True), "lr must be a finite"),
    (lambda p: ng.optim.SGD(p, lr=0.1, momentum=1.0), r"momentum must be in \[0, 1\)"),
    (lambda p: ng.optim.SGD(p, lr=0.1, momentum=-0.5), r"momentum must be in \[0, 1\)"),
    (lambda p: ng.optim.Adam(p, betas=(0.9, 1.0)), r"betas\[1\] must be in \[0, 1\)"),
    (lambda p: ng.optim.Adam(p, betas=(-0.1, 0.9)), r"betas\[0\] must be in \[0, 1\)"),
    (lambda p: ng.optim.Adam(p, betas=0.9), "betas must be a pair"),
    (lambda p: ng.optim.Adam(p, eps=0.0), "eps must be > 0"),
    (lambda p: ng.optim.SGD(p, lr=0.1, average="yes"), "average must be True or False"),
    (lambda p: ng.optim.SGD(p, lr=0.1, accumulate_steps=0), "positive integer"),
])
def test_bad_hyper_parameters_raise_before_anything_is_built(make, match):
    W = ng.param(np.ones((2, 2)))
    data = W.data
    with pytest.raises((ValueError, TypeError), match=match):
        make([W])
    assert W._owner is None and W.data is data


@pytest.mark.parametrize("params, match", [
    ([ng.tensor(np.ones(2))], r"params\[0\] is a Tensor that is not a param"),
    ({"w": np.ones(2)}, "w is ndarray"),
    ([], "empty parameter list"),
    (ng.param(np.ones(2)), "not a single Tensor"),
    (3, "got int"),
])
def test_bad_param_lists_are_rejected(params, match):
    with pytest.raises((TypeError, ValueError), match=match):
        ng.optim.SGD(params, lr=0.1)


def test_duplicate_params_are_ignored():
    W = ng.param(np.ones((2, 2)))
    opt = ng.optim.SGD([W, W, W], lr=0.1)
    assert opt.params == (W,)


def snapshot(dev, opt, params):
    state = opt.state_dict()
    return ([dev.host(p.data).copy() for p in params],
            [None if p.grad is None else dev.host(p.grad).copy() for p in params], state)


def assert_unchanged(before, after):
    for a, b in zip(before[0], after[0]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(before[1], after[1]):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_array_equal(a, b)
    sa, sb = before[2], after[2]
    assert (sa["t"], sa["pos"], sa["mode"]) == (sb["t"], sb["pos"], sb["mode"])
    for ga, gb in zip(sa["groups"], sb["groups"]):
        for key in ("grad", "live", "seen"):
            np.testing.assert_array_equal(ga[key], gb[key])
        assert (ga["window"] is None) == (gb["window"] is None)
        if ga["window"] is not None:
            np.testing.assert_array_equal(ga["window"], gb["window"])


def test_a_rejected_step_changes_nothing(dev):
    W, b = dev.param(np.ones((2, 3))), dev.param(np.ones((2, 1)))
    opt = ng.optim.Adam([W, b], lr=0.1, accumulate_steps=2)
    x, y = np.ones((3, 1)), np.zeros((2, 1))
    good = ng.backward(mse_loss_of(dev, W, x, y))
    opt.step(good)
    before = snapshot(dev, opt, [W, b])
    other = Dev("cuda" if dev.name == "cpu" else "cpu")
    bad_device = other.tensor(np.ones((2, 3))).data if ng.cuda_available() else None
    wrong = [
        ({W.id: good[W.id], b.id: dev.tensor(np.ones((1, 2))).data},
         ValueError, r"has shape \(1, 2\) and dtype float64; the param has shape \(2, 1\)"),
        ({W.id: dev.tensor(np.ones((2, 3)), dtype=np.float32).data},
         ValueError, "dtype float32; the param has .* dtype float64"),
        ({W.id: "nope"}, TypeError, "is str"),
        ([good[W.id]], TypeError, "takes a mapping"),
    ]
    if bad_device is not None:
        wrong.append(({W.id: bad_device}, TypeError, f"param is on {dev.name}"))
    for grads, exc, match in wrong:
        with pytest.raises(exc, match=match):
            opt.step(grads)
        assert_unchanged(before, snapshot(dev, opt, [W, b]))


def test_a_rejected_state_dict_changes_nothing(dev):
    W = dev.param(np.ones((2, 3)))
    opt = ng.optim.SGD([W], lr=0.1, momentum=0.9, accumulate_steps=3)
    mse_loss_of(dev, W, np.ones((3, 1)), np.zeros((2, 1))).backward()
    opt.step()
    before = snapshot(dev, opt, [W])
    other = ng.optim.SGD([dev.param(np.ones((3, 2)))], lr=0.1, momentum=0.9).state_dict()
    no_momentum = ng.optim.SGD([dev.param(np.ones((2, 3)))], lr=0.1).state_dict()
    adam = ng.optim.Adam([dev.param(np.ones((2, 3)))]).state_dict()
    late = dict(before[2], pos=5)
    bad_lr = dict(before[2], hyper=dict(before[2]["hyper"], lr=-1.0))
    group = before[2]["groups"][0]

    def with_group(**change):   # a new lr and t too: neither may land when the rest fails
        return dict(before[2], t=7, hyper=dict(before[2]["hyper"], lr=0.5),
                    groups=[dict(group, **change)])
    nan_slot = np.full(6, 0.5)
    nan_slot[4] = np.nan
    for state, match in [(other, r"shapes \[\(3, 2\)\]"), (no_momentum, "momentum"),
                         (adam, "for Adam, not SGD"), (late, "position 5"),
                         (bad_lr, "lr must be >= 0"), ({"type": "SGD"}, "malformed"),
                         (with_group(grad=np.array(list("abcdef"))), "'grad' holds <U1"),
                         (with_group(grad=[object()] * 6), "'grad' holds object"),
                         (with_group(live=np.array([0.5])), "'live' holds float64"),
                         (with_group(slots={"momentum_buffer": nan_slot}),
                          "'momentum_buffer' holds the non-finite nan at index 4")]:
        with pytest.raises(ValueError, match=match):
            opt.load_state_dict(state)
        assert_unchanged(before, snapshot(dev, opt, [W]))


def test_a_state_dict_with_a_negative_second_moment_or_step_is_refused(dev):
    W = dev.param(np.ones((2, 3)))
    opt = ng.optim.Adam([W], lr=0.1)
    mse_loss_of(dev, W, np.ones((3, 1)), np.zeros((2, 1))).backward()
    opt.step()
    before = snapshot(dev, opt, [W])
    group = before[2]["groups"][0]
    for name, match in [("exp_avg_sq", "'exp_avg_sq' holds the negative"),
                        ("step", "'step' holds the negative")]:
        slots = dict(group["slots"], **{name: -np.ones_like(group["slots"][name])})
        with pytest.raises(ValueError, match=match):
            opt.load_state_dict(dict(before[2], groups=[dict(group, slots=slots)]))
        assert_unchanged(before, snapshot(dev, opt, [W]))
    opt.load_state_dict(before[2])   # the good one still loads
    assert_unchanged(before, snapshot(dev, opt, [W]))


def test_a_non_finite_state_of_nonfinite_ignore_round_trips(dev):
    """nonfinite="ignore" applies a nan window, so its own state holds nan: it loads."""
    W = dev.param(np.ones(3))
    opt = ng.optim.Adam([W], lr=0.1, nonfinite="ignore")
    opt.step({W.id: dev.tensor(np.array([np.nan, 1.0, 2.0])).data})
    state = opt.state_dict()
    assert np.isnan(state["groups"][0]["slots"]["exp_avg"]).any()
    opt.load_state_dict(state)
    assert opt.t == 1


def test_an_optimizer_whose_param_was_adopted_elsewhere_refuses_to_step():
    W = ng.param(np.ones((2, 2)))
    first = ng.optim.SGD([W], lr=0.1)
    second = ng.optim.SGD([W], lr=0.1)
    with pytest.raises(RuntimeError, match="adopted by another optimizer"):
        first.step()
    with pytest.warns(RuntimeWarning, match=r"no gradient reaching its params \(params\[0\]\)"):
        assert second.step() is False   # usable, but no backward since: not counted
    W.grad = ng.tensor(np.ones((2, 2)))
    assert second.step() is True


def test_setting_lr_is_validated():
    opt = ng.optim.SGD([ng.param(np.ones(2))], lr=0.1)
    opt.lr = 0.5
    assert opt.lr == 0.5
    with pytest.raises(ValueError, match="lr must be >= 0"):
        opt.lr = -1
    assert opt.lr == 0.5


# ------------------------------------------------------- the full op set
def test_elementwise_errors_name_op_shapes_dtypes_and_devices(dev):
    a = dev.tensor(np.ones((3, 4)))
    with pytest.raises(ValueError, match=r"add: shapes \(3, 4\) and \(3,\) cannot be broadcast"):
        a + dev.tensor(np.ones(3))
    # mixed float widths promote, as PyTorch's (matmul and conv refuse them)
    assert (a * dev.tensor(np.ones(4), dtype=np.float32)).dtype == np.float64
    assert (a ** dev.tensor(np.ones(4), dtype=np.float32)).dtype == np.float64
    with pytest.raises(TypeError, match=r"matmul: dtypes differ: first operand float64 \(shape "
                                        r"\(3, 4\)\), second operand float32"):
        a @ dev.tensor(np.ones(4), dtype=np.float32)
    with pytest.raises(ValueError, match=r"sum: axis 2 is out of range for a tensor of shape "
                                         rf"\(3, 4\), float64, on {dev.name}"):
        a.sum(axis=2)
    with pytest.raises(ValueError, match=r"softmax: needs a tensor of at least 1 dim, got shape \(\)"):
        ng.softmax(a.sum())
    with pytest.raises(ValueError, match=r"reshape: cannot reshape a tensor of shape \(3, 4\)"):
        a.reshape(5, 2)


def test_device_mismatch_is_named():
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    with pytest.raises(ValueError, match=r"sub: operands are on different devices: first "
                                         r"operand on cpu \(shape \(2,\)\), second operand "
                                         r"on cuda"):
        ng.tensor(np.ones(2)) - ng.tensor(np.ones(2), device="cuda")
    with pytest.raises(ValueError, match="host but the op runs on cuda"):
        ng.tensor(np.ones(2), device="cuda") + np.ones(2)


def test_loss_and_linear_errors(dev):
    logits = dev.param(np.zeros((3, 4)))
    for labels, kind, match in [
            (np.array([0, 4, 1]), ValueError, r"target\[1\] is class 4, outside \[0, 4\)"),
            (np.array([0, -1, 1]), ValueError, r"target\[1\] is class -1, outside \[0, 4\)"),
            (np.array([0, 1]), ValueError,
             r"target has shape \(2,\) but logits of shape \(3, 4\) need \(3,\)"),
            (np.array([0.0, 1.0, 2.0]), TypeError, "integer class indices, got dtype float64")]:
        with pytest.raises(kind, match=match):
            ng.cross_entropy(logits, labels)
    with pytest.raises(ValueError, match="reduction must be 'mean', 'sum' or 'none', got 'max'"):
        ng.cross_entropy(logits, np.zeros(3, int), reduction="max")
    nd = dev.param(np.zeros((2, 4, 3)))
    with pytest.raises(ValueError, match=r"target\[1, 2\] is class 7, outside \[0, 4\)"):
        ng.cross_entropy(nd, np.array([[0, 1, 2], [3, 0, 7]]))
    with pytest.raises(ValueError, match=r"logits of shape \(2, 4, 3\) need \(2, 3\)"):
        ng.cross_entropy(nd, np.zeros((2, 4), int))
    with pytest.raises(ValueError, match=r"logits must be \(N, C\) or \(N, C, d1, ...\)"):
        ng.cross_entropy(dev.param(np.zeros(3)), np.zeros(1, int))
    with pytest.raises(ValueError, match=r"logits shape \(3, 4\) and target shape \(4,\) differ"):
        ng.binary_cross_entropy_with_logits(logits, dev.tensor(np.zeros(4)))
    x, w = dev.tensor(np.ones((2, 5))), dev.param(np.ones((3, 4)))
    with pytest.raises(ValueError, match=r"linear: input shape \(2, 5\), float64, on "
                                         rf"{dev.name} has 5 features but weight shape \(3, 4\)"):
        ng.linear(x, w)
    with pytest.raises(ValueError, match=r"bias shape \(4,\), float64, .* expected shape \(3,\)"):
        ng.linear(dev.tensor(np.ones((2, 4))), w, dev.param(np.ones(4)))


def test_a_failed_op_records_nothing_and_changes_no_gradient():
    W = ng.param(np.ones((2, 3)))
    with ng.grad_tape():
        loss = (W * 2.0).sum()
        with pytest.raises(ValueError):
            W + ng.tensor(np.ones(4))
    loss.backward()
    np.testing.assert_array_equal(W.grad, np.full((2, 3), 2.0))


def test_numpy_functions_never_silently_leave_the_graph():
    W = ng.param(np.array([[0.5, -1.0]]))
    with ng.grad_tape():
        y = np.tanh(W)                     # dispatches to ng.tanh and is recorded
        z = np.exp(np.multiply(y, 2.0)) + np.sqrt(W * W) - np.log(W * W + 1.0)
        loss = np.negative(z).sum() / np.float64(2.0)
    assert isinstance(y, ng.Tensor) and isinstance(z, ng.Tensor)
    loss.backward()
    tw = torch.tensor([[0.5, -1.0]], dtype=torch.float64, requires_grad=True)
    (-(torch.exp(torch.tanh(tw) * 2.0) + torch.sqrt(tw * tw) - torch.log(tw * tw + 1))
     ).sum().div(2.0).backward()
    np.testing.assert_allclose(W.grad, tw.grad.numpy(), rtol=1e-12)
    with ng.grad_tape():
        assert isinstance(np.maximum(W, 0.0), ng.Tensor)   # ng.maximum, recorded
    with pytest.raises(TypeError, match=r"numpy.fmax .* not differentiable .* use ng.maximum"):
        np.fmax(W, 0.0)
    with pytest.raises(TypeError, match="numpy.cbrt"):
        np.cbrt(W)
    np.testing.assert_array_equal(np.asarray(W), [[0.5, -1.0]])   # still gives the data


def test_a_failed_selection_records_nothing_and_changes_no_gradient():
    W = ng.param(np.array([[0.5, -1.0]]))
    with ng.grad_tape():
        loss = (W * 2.0).sum()
        with pytest.raises(TypeError, match="sub: subtracting a bool tensor"):
            (W > 0) - 1.0
        with pytest.raises(ValueError, match=r"where: shapes \(1, 2\) and \(3,\)"):
            ng.where(W > 0, W, ng.tensor(np.ones(3)))
        with pytest.raises(TypeError, match="numpy.max .* would leave the graph"):
            np.max(W)
        with pytest.raises(TypeError, match=r"numpy.fmax .* use ng.maximum"):
            np.fmax(W, W)
    loss.backward()
    np.testing.assert_array_equal(W.grad, np.full((1, 2), 2.0))
