"""Zero-copy interop: ng.from_dlpack, Tensor.__dlpack__ and the CUDA Array
Interface. CPU: with PyTorch tensors both ways, memory sharing checked by
address and by writes; "cuda": on the simulator, through the interface."""
import numpy as np
import pytest
import torch

import numbagrad as ng
from conftest import SIMULATED, Dev

X0 = np.arange(6.0).reshape(2, 3)


def address(t: ng.Tensor) -> int:
    return Dev.address(t.data)


# ---------------------------------------------------------------- cpu, with PyTorch
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(), (3,), (2, 3)])
def test_a_torch_tensor_comes_in_without_a_copy(dtype, shape):
    x = torch.arange(6, dtype=dtype)[:int(np.prod(shape))].reshape(shape)
    t = ng.from_dlpack(x)
    assert t.device == "cpu" and t.shape == shape and t.dtype == np.dtype(str(dtype)[6:])
    assert address(t) == x.data_ptr() and not t.requires_grad
    x.add_(1.0)                                  # a write by torch is seen by numbagrad
    np.testing.assert_array_equal(t.numpy(), x.numpy())
    np.testing.assert_array_equal((t * 2.0).numpy(), (x * 2.0).numpy())


def test_a_tensor_goes_out_to_torch_without_a_copy():
    t = ng.tensor(X0)
    out = ng.exp(t)                              # a pooled op output: handed out, not reused
    assert t.__dlpack_device__() == (1, 0)
    for src in (t, out):
        y = torch.from_dlpack(src)
        assert y.data_ptr() == address(src) and tuple(y.shape) == src.shape
        y.mul_(-1.0)                             # a write by torch is seen by numbagrad
        np.testing.assert_array_equal(src.numpy(), y.numpy())
    np.testing.assert_array_equal(ng.from_dlpack(torch.from_dlpack(t)).numpy(), -X0)


def test_dlpack_keywords_reach_numpy():
    t = ng.tensor(X0)
    assert np.shares_memory(np.from_dlpack(t), t.data)
    assert np.shares_memory(np.from_dlpack(t, copy=False), t.data)
    assert not np.shares_memory(np.from_dlpack(t, copy=True), t.data)
    assert np.shares_memory(np.from_dlpack(t, device="cpu"), t.data)
    assert type(t.__dlpack__(max_version=(1, 0))).__name__ == "PyCapsule"
    with pytest.raises((BufferError, ValueError, RuntimeError)):
        t.__dlpack__(stream=1)                   # CPU data has no stream


def test_gradients_through_a_torch_input_match_torch():
    rng = np.random.default_rng(1)
    w0, x0 = rng.normal(size=(2, 3)), rng.normal(size=(3, 4))
    W = ng.param(w0)
    with ng.grad_tape():
        loss = ng.mse_loss(W @ ng.from_dlpack(torch.tensor(x0)), np.zeros((2, 4)))
    loss.backward()
    w = torch.tensor(w0, requires_grad=True)
    torch.nn.functional.mse_loss(w @ torch.tensor(x0), torch.zeros(2, 4)).backward()
    np.testing.assert_allclose(W.grad, w.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("make, error, words", [
    (lambda: torch.zeros(2, 3).T, ValueError, ["torch.Tensor", "(3, 2)", "C-contiguous"]),
    (lambda: torch.zeros(3, dtype=torch.complex64), TypeError,
     ["complex64", "float32, float64, float16, bfloat16, integer or bool"]),
    (lambda: _read_only(), ValueError, ["numpy.ndarray is read-only", "ng.tensor"]),
    (lambda: [1.0, 2.0], TypeError, ["__dlpack__", "list"]),
    (lambda: _OtherDevice(), ValueError, ["device type 8"]),
])
def test_from_dlpack_refuses_what_a_tensor_cannot_share(make, error, words):
    with pytest.raises(error) as info:
        ng.from_dlpack(make())
    for word in words:
        assert word in str(info.value)


def _read_only() -> np.ndarray:
    array = np.zeros(3)
    array.flags.writeable = False
    return array


class _OtherDevice:
    def __dlpack_device__(self):
        return (8, 0)                            # kDLMetal

    def __dlpack__(self, **kwargs):
        raise AssertionError("not to be called")


def test_a_tensor_that_requires_grad_is_not_shared():
    W = ng.param(X0)
    with ng.grad_tape():
        y = W * 2.0                              # a recorded op output
    for t in (W, y):
        with pytest.raises(BufferError, match="requires grad"):
            torch.from_dlpack(t)
        with pytest.raises(BufferError, match="requires grad"):
            ng.from_dlpack(t)
    assert address(ng.from_dlpack(ng.as_tensor(W.data))) == address(W)
    assert not hasattr(ng.tensor(X0), "__cuda_array_interface__")


@pytest.mark.parametrize("how", ["array", "tensor"])
def test_from_dlpack_of_a_grad_is_tracked_as_as_tensor_is(dev, how):
    W0 = np.random.default_rng(0).normal(size=(3, 3))
    W = dev.param(W0)
    with ng.grad_tape():
        loss = ng.sum(W * W)
    loss.backward()
    g0 = dev.host(W.grad).copy()
    with ng.grad_tape():
        G = ng.from_dlpack(W.grad if how == "array" else ng.as_tensor(W.grad))
        assert address(G) == Dev.address(W.grad)
        loss = ng.sum(W @ G) + ng.sum(W * G)     # each adds into the array G reads
    loss.backward()
    w, g = torch.tensor(W0, requires_grad=True), torch.tensor(g0)
    ((w @ g).sum() + (w * g).sum()).backward()
    np.testing.assert_allclose(dev.host(W.grad), g0 + w.grad.numpy(), rtol=1e-12)


# ---------------------------------------------------------------- cuda (the simulator)
class _Producer:
    """Any library's device array, as the CUDA Array Interface shows it."""

    def __init__(self, iface: dict) -> None:
        self.__cuda_array_interface__ = iface


@pytest.fixture
def cuda() -> Dev:
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here: " + str(ng.kernels.cuda_unavailable_reason()))
    return Dev("cuda")


def test_a_cuda_tensor_shares_through_the_cuda_array_interface(cuda):
    t = cuda.tensor(X0)
    iface = t.__cuda_array_interface__
    assert iface["data"][0] == address(t) and tuple(iface["shape"]) == (2, 3)
    assert iface["typestr"] == "<f8" and t.__dlpack_device__()[0] == 2
    for wrap in (ng.as_tensor, ng.from_dlpack):
        u = wrap(_Producer(iface))
        assert u.device == "cuda" and address(u) == address(t) and u.shape == (2, 3)
        u.data[0, 0] = 7.0                       # a write through the other is seen
        assert t.numpy()[0, 0] == 7.0
    np.testing.assert_array_equal((ng.from_dlpack(t) + 1.0).numpy(), t.numpy() + 1.0)
    assert ng.from_dlpack(t.data).data is t.data


def test_a_cuda_tensor_has_no_dlpack_producer_and_a_cuda_param_no_interface(cuda):
    with pytest.raises(BufferError, match="__cuda_array_interface__"):
        cuda.tensor(X0).__dlpack__()
    with pytest.raises(BufferError, match="requires grad"):
        cuda.param(X0).__cuda_array_interface__
    with pytest.raises(TypeError, match="got Tensor"):
        ng.as_tensor(cuda.tensor(X0))            # as before: a tensor is not an array


def test_the_cuda_array_interface_path_refuses_what_a_tensor_cannot_share(cuda):
    t = cuda.tensor(np.arange(8.0).reshape(2, 4))
    iface = t.__cuda_array_interface__
    strided = ng.interop.cuda_array_interface(t.data[:, ::2])
    with pytest.raises(ValueError, match="C-contiguous"):
        ng.as_tensor(_Producer(strided))
    with pytest.raises(ValueError, match="from_dlpack: .*_Producer is read-only"):
        ng.from_dlpack(_Producer(dict(iface, data=(iface["data"][0], True))))
    with pytest.raises(ValueError, match="masked"):
        ng.as_tensor(_Producer(dict(iface, mask=_Producer(iface))))
    with pytest.raises(TypeError, match="complex64"):
        ng.as_tensor(_Producer(dict(iface, typestr="<c8")))


@pytest.mark.skipif(not SIMULATED, reason="the simulator's limit")
def test_the_simulator_cannot_import_a_cuda_dlpack_capsule(cuda):
    class CudaCapsule:
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kwargs):
            raise AssertionError("not to be called")

    with pytest.raises(TypeError, match="simulator"):
        ng.from_dlpack(CudaCapsule())
