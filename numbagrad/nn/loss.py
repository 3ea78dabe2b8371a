"""Loss modules with PyTorch's names and arguments: each holds its options
and calls its op (``ng.mse_loss``, ``ng.cross_entropy``, ...) in
``forward(input, target)``. Options are checked when the module is built.
PyTorch's deprecated ``size_average``/``reduce`` are not taken; its per-class
``weight=`` (and BCE's ``pos_weight=``) is refused, as the ops have none yet.
"""
from __future__ import annotations

from typing import Any

from .. import ops
from ..tensor import Tensor
from .module import Module

__all__ = ["MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "BCELoss", "BCEWithLogitsLoss",
           "CrossEntropyLoss", "NLLLoss"]

_REDUCTIONS = ("mean", "sum", "none")


class _Loss(Module):
    """A loss of ``_op`` with ``reduction`` and the options named in ``_options``."""

    _op = ""
    _options: tuple[str, ...] = ()

    def __init__(self, reduction: str = "mean", weight: Any = None, **options: Any) -> None:
        super().__init__()
        name = type(self).__name__
        if reduction not in _REDUCTIONS:
            raise ValueError(f"{name}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
        if weight is not None:
            raise ValueError(f"{name}: weight= (a weight per class or element) is not "
                             f"supported; weigh the per-element losses of reduction='none'")
        self.reduction = reduction
        for key, value in options.items():
            setattr(self, key, value)

    def forward(self, input: Any, target: Any) -> Tensor:  # noqa: A002 (PyTorch's name)
        return getattr(ops, self._op)(input, target, self.reduction,
                                      *(getattr(self, k) for k in self._options))


class MSELoss(_Loss):
    """``ng.mse_loss``, as ``torch.nn.MSELoss(reduction=)``."""
    _op = "mse_loss"

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__(reduction)


class L1Loss(_Loss):
    """``ng.l1_loss``, as ``torch.nn.L1Loss(reduction=)``."""
    _op = "l1_loss"

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__(reduction)


class SmoothL1Loss(_Loss):
    """``ng.smooth_l1_loss``, as ``torch.nn.SmoothL1Loss(reduction=, beta=)``."""
    _op, _options = "smooth_l1_loss", ("beta",)

    def __init__(self, reduction: str = "mean", beta: float = 1.0) -> None:
        if not beta >= 0:
            raise ValueError(f"SmoothL1Loss: beta must be >= 0, got {beta!r}")
        super().__init__(reduction, beta=float(beta))


class HuberLoss(_Loss):
    """``ng.huber_loss``, as ``torch.nn.HuberLoss(reduction=, delta=)``."""
    _op, _options = "huber_loss", ("delta",)

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        if not delta > 0:
            raise ValueError(f"HuberLoss: delta must be > 0, got {delta!r}")
        super().__init__(reduction, delta=float(delta))


class BCELoss(_Loss):
    """``ng.binary_cross_entropy``, as ``torch.nn.BCELoss(reduction=)``."""
    _op = "binary_cross_entropy"

    def __init__(self, weight: Any = None, reduction: str = "mean") -> None:
        super().__init__(reduction, weight)


class BCEWithLogitsLoss(_Loss):
    """``ng.binary_cross_entropy_with_logits``, as ``torch.nn.BCEWithLogitsLoss``."""
    _op = "binary_cross_entropy_with_logits"

    def __init__(self, weight: Any = None, reduction: str = "mean",
                 pos_weight: Any = None) -> None:
        if pos_weight is not None:
            raise ValueError("BCEWithLogitsLoss: pos_weight= is not supported; weigh the "
                             "per-element losses of reduction='none'")
        super().__init__(reduction, weight)


class CrossEntropyLoss(_Loss):
    """``ng.cross_entropy``, as ``torch.nn.CrossEntropyLoss(ignore_index=,
    reduction=, label_smoothing=)``."""
    _op, _options = "cross_entropy", ("ignore_index", "label_smoothing")

    def __init__(self, weight: Any = None, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0) -> None:
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"CrossEntropyLoss: label_smoothing must lie in [0, 1], got "
                             f"{label_smoothing!r}")
        super().__init__(reduction, weight, ignore_index=int(ignore_index),
                         label_smoothing=float(label_smoothing))


class NLLLoss(_Loss):
    """``ng.nll_loss``, as ``torch.nn.NLLLoss(ignore_index=, reduction=)``."""
    _op, _options = "nll_loss", ("ignore_index",)

    def __init__(self, weight: Any = None, ignore_index: int = -100,
                 reduction: str = "mean") -> None:
        super().__init__(reduction, weight, ignore_index=int(ignore_index))
