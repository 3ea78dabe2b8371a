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

__all__ = ["ReLU", "LeakyReLU", "Tanh", "Sigmoid", "GELU", "SiLU", "Softplus"]


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
