"""Element math written once: both devices compile ``kernels/bodies.py``'s functions.

The kernels' results are checked elsewhere (``test_cuda.py`` against the CPU,
``test_threaded.py`` and ``test_compile.py`` bit for bit); this checks that
neither device has grown its own copy of the shared element math again.
"""
import pytest

import numbagrad as ng
from numbagrad.kernels import bodies

# (kernel module, its compiled element function, the shared Python function)
SHARED = [("elementwise", "_reduced_grad", bodies.reduced_grad(None, None)),
          ("reductions", "_softmax_backward_lane", bodies.softmax_backward_lane),
          ("optim", "_adam_element", bodies.adam_element)]


def _compiled_from(device, module, name):
    mod = __import__(f"numbagrad.kernels.{device}.{module}", fromlist=[name])
    return getattr(mod, name).py_func


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("module, name, shared", SHARED, ids=[s[1] for s in SHARED])
def test_each_device_compiles_the_shared_element_function(device, module, name, shared):
    if device == "cuda" and not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    assert _compiled_from(device, module, name).__code__ is shared.__code__


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_broadcast_gradient_sum_calls_its_devices_own_derivatives(device):
    from numbagrad.kernels import codes
    if device == "cuda" and not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    module = __import__(f"numbagrad.kernels.{device}.elementwise", fromlist=["_reduced_grad"])
    cells = {c.cell_contents for c in module._reduced_grad.py_func.__closure__}
    assert cells == {module._binary_grad_a, module._binary_grad_b}
    assert not cells & {codes.binary_grad_a, codes.binary_grad_b}
