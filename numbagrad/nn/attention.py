"""``MultiheadAttention`` with PyTorch's parameters, state-dict keys and init,
running its heads through the fused ``ng.scaled_dot_product_attention``."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import ops
from ..ops._common import is_scalar, operand
from ..tensor import Tensor, param
from . import init
from .layers import Linear
from .module import Module, _allocating


class MultiheadAttention(Module):
    """PyTorch's ``nn.MultiheadAttention`` (self- or cross-attention, kdim = vdim =
    embed_dim): ``in_proj_weight`` (3E, E) drawn with xavier_uniform_,
    ``in_proj_bias`` (3E,) and ``out_proj.bias`` zero, ``out_proj.weight`` a
    ``Linear``'s default; all from ``rng`` (a fresh Generator when None).
    ``dropout`` applies to the attention probabilities in training mode only."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = True, *, dtype: Any = np.float64, device: str = "cpu",
                 rng: np.random.Generator | None = None) -> None:
        name = "MultiheadAttention"
        for what, n in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
                raise ValueError(f"{name}: {what} must be a positive integer, got {n!r}")
        if embed_dim % num_heads:
            raise ValueError(f"{name}: embed_dim={embed_dim} must be divisible by "
                             f"num_heads={num_heads}")
        if not is_scalar(dropout) or not 0.0 <= dropout <= 1.0:
            raise ValueError(f"{name}: dropout must be a probability in [0, 1], got {dropout!r}")
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng()
        e = int(embed_dim)
        self.embed_dim, self.num_heads, self.head_dim = e, int(num_heads), e // int(num_heads)
        self.dropout, self.batch_first = float(dropout), bool(batch_first)
        with _allocating(name, (3 * e, e)):
            self.in_proj_weight = param(np.zeros((3 * e, e)), dtype=dtype, device=device)
        init.xavier_uniform_(self.in_proj_weight, generator=rng)
        self.in_proj_bias = (param(np.zeros(3 * e), dtype=dtype, device=device) if bias
                             else None)
        self.out_proj = Linear(e, e, bias=bias, dtype=dtype, device=device, rng=rng)
        if bias:
            init.zeros_(self.out_proj.bias)

    def _heads(self, x: Tensor, part: int) -> Tensor:
        """Projection ``part`` (0 q, 1 k, 2 v) of x (N, T, E) as (N, H, T, head_dim)."""
        e = self.embed_dim
        w = self.in_proj_weight[part * e:(part + 1) * e]
        b = None if self.in_proj_bias is None else self.in_proj_bias[part * e:(part + 1) * e]
        n, t = x.shape[0], x.shape[1]
        return ops.linear(x, w, b).reshape((n, t, self.num_heads, self.head_dim)) \
            .permute(0, 2, 1, 3)

    def forward(self, query: Any, key: Any, value: Any, attn_mask: Any = None,
                is_causal: bool = False, need_weights: bool = False) -> tuple[Tensor, None]:
        """(output, None) for query (N, L, E) and key, value (N, S, E) (batch_first;
        else (L, N, E) and (S, N, E); unbatched (L, E) too). ``attn_mask`` is
        PyTorch's: (L, S) or (N * num_heads, L, S), boolean with True = NOT
        allowed to attend (the opposite of ``scaled_dot_product_attention``'s),
        or float (added). ``is_causal`` without a mask applies the causal mask;
        with one it is PyTorch's hint and the mask is used. ``need_weights``
        must be False (PyTorch's default is True): the fused kernel never
        forms the attention weights."""
        name = "MultiheadAttention"
        if need_weights:
            raise NotImplementedError(f"{name}: need_weights=True is not supported (the fused "
                                      "attention never materialises the weights); pass "
                                      "need_weights=False")
        q, k, v = (operand(t, name, what) for t, what in
                   ((query, "query"), (key, "key"), (value, "value")))
        e = self.embed_dim
        for what, t in (("query", q), ("key", k), ("value", v)):
            if t.ndim not in (2, 3) or t.shape[-1] != e:
                raise ValueError(f"{name}: {what} must be (N, T, {e}) or unbatched (T, {e}), "
                                 f"got shape {t.shape}")
        if not q.ndim == k.ndim == v.ndim:
            raise ValueError(f"{name}: query, key and value must all be batched or all "
                             f"unbatched, got shapes {q.shape}, {k.shape}, {v.shape}")
        unbatched = q.ndim == 2
        if unbatched:
            q, k, v = (t.reshape((1,) + t.shape) for t in (q, k, v))
        elif not self.batch_first:
            q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        n, length, s = q.shape[0], q.shape[1], k.shape[1]
        if k.shape[:2] != v.shape[:2] or k.shape[0] != n:
            raise ValueError(f"{name}: key {k.shape} and value {v.shape} must share (N, S) "
                             f"with the query's N (query {q.shape})")
        mask = None
        if attn_mask is not None:
            mask = self._mask(attn_mask, q, n, length, s)
        p = self.dropout if self.training else 0.0
        out = ops.scaled_dot_product_attention(self._heads(q, 0), self._heads(k, 1),
                                               self._heads(v, 2), attn_mask=mask, dropout_p=p,
                                               is_causal=bool(is_causal) and mask is None)
        out = self.out_proj(out.permute(0, 2, 1, 3).reshape((n, length, e)))
        if unbatched:
            out = out.reshape((length, e))
        elif not self.batch_first:
            out = out.transpose(0, 1)
        return out, None

    def _mask(self, attn_mask: Any, q: Tensor, n: int, length: int, s: int) -> Any:
        """PyTorch's MHA mask as one ``scaled_dot_product_attention`` takes:
        (L, S) stays, (N * H, L, S) becomes (N, H, L, S), a boolean one inverted."""
        name = "MultiheadAttention"
        shape = tuple(attn_mask.shape)
        if shape not in ((length, s), (n * self.num_heads, length, s)):
            raise ValueError(f"{name}: attn_mask must be (L, S) = {(length, s)} or (N * "
                             f"num_heads, L, S) = {(n * self.num_heads, length, s)}, got "
                             f"{shape}")
        if len(shape) == 3:
            attn_mask = (attn_mask.reshape((n, self.num_heads, length, s))
                         if isinstance(attn_mask, Tensor)
                         else np.asarray(attn_mask).reshape((n, self.num_heads, length, s)))
        if isinstance(attn_mask, Tensor):
            if attn_mask.dtype == np.bool_:
                return ops.where(attn_mask, -math.inf, 0.0).astype(q.dtype)
            return attn_mask
        array = np.asarray(attn_mask)
        return ~array if array.dtype == np.bool_ else array

    def __repr__(self) -> str:
        return (f"MultiheadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"dropout={self.dropout}, bias={self.in_proj_bias is not None}, "
                f"batch_first={self.batch_first}, dtype={self.in_proj_weight.dtype}, "
                f"device='{self.in_proj_weight.device}')")
