"""Gradient utilities in ``torch.nn.utils``' style (``clip_grad_norm_``, ``clip_grad_value_``)."""
from __future__ import annotations

__all__: list[str] = []
