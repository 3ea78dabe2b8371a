"""The activation layers: each runs its op from ``ng.ops``.

``_linear_activation`` names the op that ``Sequential`` may apply in the
epilogue of the ``Linear`` before it (``fusion.py`` says when).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import ops
from ..tensor import Tensor
from ..tensor import tensor as _tensor
from .module import Module

__all__ = ["ReLU", "LeakyReLU", "Tanh", "Sigmoid", "GELU", "SiLU", "Softplus", "ELU", "SELU",
           "CELU", "Hardtanh", "ReLU6", "Hardsigmoid", "Hardswish", "Mish", "Softsign",
           "LogSigmoid", "QuickGELU"]


class ReLU(Module):
    _linear_activation = "relu"   # see fusion._epilogue

    def forward(self, x: Any) -> Tensor:
        return ops.relu(x)


class LeakyReLU(Module):
    _linear_activation = "leaky_relu"

    def __init__(self, negative_slope: float = 0.01) -> None:
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: Any) -> Tensor:
        return ops.leaky_relu(x, self.negative_slope)


class Tanh(Module):
    _linear_activation = "tanh"

    def forward(self, x: Any) -> Tensor:
        return ops.tanh(x)


class Sigmoid(Module):
    _linear_activation = "sigmoid"

    def forward(self, x: Any) -> Tensor:
        return ops.sigmoid(x)


class GELU(Module):
    """``ng.gelu`` (``approximate="none"`` or ``"tanh"``), as ``torch.nn.GELU``."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        ops.gelu(_tensor(np.zeros(1)), approximate)   # a bad value raises here, not later
        self.approximate = approximate

    def forward(self, x: Any) -> Tensor:
        return ops.gelu(x, self.approximate)


class SiLU(Module):
    _linear_activation = "silu"

    def forward(self, x: Any) -> Tensor:
        return ops.silu(x)


class Softplus(Module):
    """``ng.softplus``, as ``torch.nn.Softplus(beta, threshold)``."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        ops.softplus(_tensor(np.zeros(1)), beta, threshold)   # bad values raise here
        self.beta, self.threshold = beta, threshold

    def forward(self, x: Any) -> Tensor:
        return ops.softplus(x, self.beta, self.threshold)


class _Unary(Module):
    """A parameterless activation: ``_op`` names its op in ``ng.ops``."""

    _op = ""

    def forward(self, x: Any) -> Tensor:
        return getattr(ops, self._op)(x)


class SELU(_Unary):
    """``ng.selu``, as ``torch.nn.SELU``."""
    _op = "selu"


class ReLU6(_Unary):
    """``ng.relu6``, as ``torch.nn.ReLU6``."""
    _op = "relu6"


class Hardsigmoid(_Unary):
    """``ng.hardsigmoid``, as ``torch.nn.Hardsigmoid``."""
    _op = "hardsigmoid"


class Hardswish(_Unary):
    """``ng.hardswish``, as ``torch.nn.Hardswish``."""
    _op = "hardswish"


class Mish(_Unary):
    """``ng.mish``, as ``torch.nn.Mish``."""
    _op = "mish"


class Softsign(_Unary):
    """``ng.softsign``, as ``torch.nn.Softsign``."""
    _op = "softsign"


class LogSigmoid(_Unary):
    """``ng.logsigmoid``, as ``torch.nn.LogSigmoid``."""
    _op = "logsigmoid"


class QuickGELU(_Unary):
    """``ng.quick_gelu`` (x sigmoid(1.702 x)), as OpenCLIP's ``QuickGELU``."""
    _op = "quick_gelu"


class ELU(Module):
    """``ng.elu``, as ``torch.nn.ELU(alpha)``."""

    def __init__(self, alpha: float = 1.0) -> None:
        super().__init__()
        ops.elu(_tensor(np.zeros(1)), alpha)   # a bad value raises here, not later
        self.alpha = alpha

    def forward(self, x: Any) -> Tensor:
        return ops.elu(x, self.alpha)


class CELU(Module):
    """``ng.celu``, as ``torch.nn.CELU(alpha)``."""

    def __init__(self, alpha: float = 1.0) -> None:
        super().__init__()
        ops.celu(_tensor(np.zeros(1)), alpha)
        self.alpha = alpha

    def forward(self, x: Any) -> Tensor:
        return ops.celu(x, self.alpha)


class Hardtanh(Module):
    """``ng.hardtanh``, as ``torch.nn.Hardtanh(min_val, max_val)``."""

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0) -> None:
        super().__init__()
        ops.hardtanh(_tensor(np.zeros(1)), min_val, max_val)
        self.min_val, self.max_val = min_val, max_val

    def forward(self, x: Any) -> Tensor:
        return ops.hardtanh(x, self.min_val, self.max_val)
