"""numbagrad: reverse-mode autograd for NumPy arrays on Numba kernels.

    import numbagrad as ng
    W = ng.param(w0)
    opt = ng.optim.SGD([W], lr=0.1, accumulate_steps=4)
    with ng.grad_tape():
        loss = ng.mse_loss(W @ ng.as_tensor(x), y)
    loss.backward()
    opt.step()          # True on every 4th call, when the update is applied
"""
from . import cuda, optim
from .kernels import cuda_available
from .ops import matmul, mse_loss
from .tape import backward, grad_tape
from .tensor import Tensor, as_tensor, param, tensor
from .testing import gradcheck

__version__ = "0.1.0"

__all__ = ["Tensor", "tensor", "param", "as_tensor", "grad_tape", "backward",
           "matmul", "mse_loss", "optim", "cuda", "cuda_available", "gradcheck", "__version__"]
