"""The basic layers: ``Linear``, ``Identity``, ``Flatten``, ``Dropout`` and
``Embedding``, with PyTorch's parameters, state-dict keys and default init.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import ops
from ..ops._common import is_scalar
from ..tensor import Tensor, param
from .module import Module, _allocating, _dtype

__all__ = ["Linear", "Identity", "Flatten", "Dropout", "Embedding"]


class Linear(Module):
    """``y = x @ weight.T + bias`` with weight (out, in), bias (out,), PyTorch's
    default init: uniform in +-1/sqrt(in_features) for both, drawn from
    ``rng`` (a NumPy Generator; a fresh one when None). ``dtype=None`` (every
    layer's default) is ``ng.get_default_dtype()`` when the layer is built:
    float64, NumPy's, until ``ng.set_default_dtype(np.float32)`` (faster)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 dtype: Any = None, device: str = "cpu",
                 rng: np.random.Generator | None = None) -> None:
        for what, n in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
                raise ValueError(f"Linear: {what} must be a positive integer, got {n!r}")
        super().__init__()
        dtype = _dtype(dtype)
        rng = rng if rng is not None else np.random.default_rng()
        bound = 1.0 / math.sqrt(in_features)
        self.in_features, self.out_features = int(in_features), int(out_features)
        with _allocating("Linear", (self.out_features, self.in_features)):
            self.weight = param(rng.uniform(-bound, bound, (out_features, in_features)),
                                dtype=dtype, device=device)
            self.bias = (param(rng.uniform(-bound, bound, out_features), dtype=dtype,
                               device=device) if bias else None)

    def forward(self, x: Any) -> Tensor:
        return ops.linear(x, self.weight, self.bias)

    def __repr__(self) -> str:
        return (f"Linear(in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, dtype={self.weight.dtype}, "
                f"device='{self.weight.device}')")


class Identity(Module):
    """Returns its input (arguments to the constructor are ignored, as PyTorch's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def forward(self, x: Any) -> Any:
        return x


class Flatten(Module):
    """``ng.flatten(x, start_dim, end_dim)``; by default keeps the batch dim."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Any) -> Tensor:
        return ops.flatten(x, self.start_dim, self.end_dim)

    def __repr__(self) -> str:
        return f"Flatten(start_dim={self.start_dim}, end_dim={self.end_dim})"


class Dropout(Module):
    """``ng.dropout(x, p, training=self.training)``: the identity after
    ``eval()``. Masks come from numbagrad's generator (``ng.manual_seed``)
    unless ``generator=`` (a NumPy Generator, which stays the caller's to
    save) is given."""

    def __init__(self, p: float = 0.5, *, generator: np.random.Generator | None = None) -> None:
        if not is_scalar(p) or not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be a probability in [0, 1], got {p!r}")
        super().__init__()
        self.p, self.generator = float(p), generator

    def forward(self, x: Any) -> Tensor:
        return ops.dropout(x, self.p, self.training, generator=self.generator)

    def __repr__(self) -> str:
        return f"Dropout(p={self.p})"


class Embedding(Module):
    """A (num_embeddings, embedding_dim) ``weight`` looked up by integer
    indices (``ng.embedding``), PyTorch's default init N(0, 1) drawn from
    ``rng`` (a NumPy Generator; a fresh one when None) and the
    ``padding_idx`` row zeroed; that row gets no gradient."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 *, dtype: Any = None, device: str = "cpu",
                 rng: np.random.Generator | None = None) -> None:
        for what, n in (("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim)):
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
                raise ValueError(f"Embedding: {what} must be a positive integer, got {n!r}")
        if padding_idx is not None:
            if isinstance(padding_idx, bool) or not isinstance(padding_idx, (int, np.integer)) \
                    or not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"Embedding: padding_idx must be an int in "
                                 f"[{-num_embeddings}, {num_embeddings - 1}], got "
                                 f"{padding_idx!r}")
            padding_idx = int(padding_idx) % num_embeddings
        super().__init__()
        dtype = _dtype(dtype)
        rng = rng if rng is not None else np.random.default_rng()
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.padding_idx = padding_idx
        with _allocating("Embedding", (self.num_embeddings, self.embedding_dim)):
            weight = rng.standard_normal((num_embeddings, embedding_dim))
            if padding_idx is not None:
                weight[padding_idx] = 0.0
            self.weight = param(weight, dtype=dtype, device=device)

    def forward(self, idx: Any) -> Tensor:
        return ops.embedding(idx, self.weight, self.padding_idx)

    def __repr__(self) -> str:
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"Embedding({self.num_embeddings}, {self.embedding_dim}{pad})"
