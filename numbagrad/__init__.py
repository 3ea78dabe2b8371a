"""numbagrad: reverse-mode autograd for NumPy arrays on Numba kernels.

    import numbagrad as ng
    W = ng.param(w0)
    opt = ng.optim.SGD([W], lr=0.1, accumulate_steps=4)
    with ng.grad_tape():
        loss = ng.mse_loss(W @ ng.as_tensor(x), y)
    loss.backward()
    opt.step()          # True on every 4th call, when the update is applied
"""
from . import _cache  # noqa: F401 (first: settles where Numba caches, before any @njit)

from typing import Any

import numpy as np

from . import cuda, nn, optim, random
from ._defaults import get_default_dtype, set_default_dtype
from .compile import compile
from .interop import from_dlpack
from .kernels import cuda_available
from .ops import *  # noqa: F401,F403 (every op in the op table, ops/table.py)
from .ops import __all__ as _op_names
from .tape import backward, grad_tape, is_grad_enabled, no_grad
from .random import manual_seed
from .tensor import Tensor, as_tensor, param, tensor
from .serialization import load, save
from ._dtypes import promote_types, result_type
from .testing import gradcheck
from .custom import custom_op
from .elementwise_fn import elementwise
from . import _dtypes, amp
from .functional import grad, value_and_grad, vjp
from .checkpointing import checkpoint

__version__ = "0.2.0"

# the dtypes a tensor holds, by PyTorch's names (``x.to(ng.int64)``)
float32, float64 = np.dtype(np.float32), np.dtype(np.float64)
int8, int16, int32, int64 = (np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64))
uint8, bool = np.dtype(np.uint8), np.dtype(np.bool_)  # noqa: A001 (ng.bool, as torch.bool)
# the half formats (ops/_half.py); bfloat16 needs the optional ml_dtypes package
float16 = _dtypes.FLOAT16
if _dtypes.BFLOAT16 is not None:
    bfloat16 = _dtypes.BFLOAT16


def __getattr__(name: str) -> Any:
    if name == "bfloat16":   # (an AttributeError, so hasattr(ng, "bfloat16") is False)
        raise AttributeError("ng.bfloat16 needs the ml_dtypes package: pip install ml_dtypes "
                             "(or the numbagrad[half] extra)")
    raise AttributeError(f"module 'numbagrad' has no attribute {name!r}")


__all__ = ["Tensor", "tensor", "param", "as_tensor", "from_dlpack", "grad_tape", "no_grad",
           "is_grad_enabled", "backward",
           *_op_names, "nn", "optim", "cuda", "cuda_available", "gradcheck", "save", "load",
           "compile", "manual_seed", "random", "set_default_dtype", "get_default_dtype",
           "promote_types", "result_type", "float32", "float64", "int8", "int16", "int32",
           "int64", "uint8", "bool", "float16", "custom_op", "elementwise", "amp", "grad",
           "value_and_grad", "vjp", "checkpoint", "__version__"]
if _dtypes.BFLOAT16 is not None:
    __all__.append("bfloat16")
