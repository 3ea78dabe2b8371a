"""``MultiheadAttention`` with PyTorch's parameters, state-dict keys and init,
running its heads through the fused ``ng.scaled_dot_product_attention``
(``need_weights=True`` also forms the attention weights from ``matmul`` and
``softmax``)."""
from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from .. import ops
from ..ops._common import is_scalar, operand
from ..tensor import Tensor, param, tensor
from . import init
from .layers import Linear
from .module import Module, _allocating, _dtype


class MultiheadAttention(Module):
    """PyTorch's ``nn.MultiheadAttention`` (self- or cross-attention, kdim = vdim =
    embed_dim): ``in_proj_weight`` (3E, E) drawn with xavier_uniform_,
    ``in_proj_bias`` (3E,) and ``out_proj.bias`` zero, ``out_proj.weight`` a
    ``Linear``'s default; all from ``rng`` (a fresh Generator when None).
    ``dropout`` applies to the attention probabilities in training mode only.
    ``batch_first`` defaults to True, (N, L, E) inputs as every other layer
    here takes, where PyTorch's defaults to False: code written for
    PyTorch's (L, N, E) layout passes ``batch_first=False``."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = True, *, dtype: Any = None, device: str = "cpu",
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
        dtype = _dtype(dtype)
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

    def forward(self, query: Any, key: Any, value: Any, key_padding_mask: Any = None,
                need_weights: bool = False, attn_mask: Any = None,
                average_attn_weights: bool = True, is_causal: bool = False
                ) -> tuple[Tensor, Tensor | None]:
        """(output, weights) for query (N, L, E) and key, value (N, S, E)
        (batch_first; else (L, N, E) and (S, N, E); unbatched (L, E) too), the
        arguments in PyTorch's order.

        ``attn_mask`` is PyTorch's: (L, S) or (N * num_heads, L, S), boolean
        with True = NOT allowed to attend (the opposite of
        ``scaled_dot_product_attention``'s), or float (added).
        ``key_padding_mask`` (N, S), or (S,) unbatched: True (or a float added)
        marks the keys to ignore. ``is_causal`` without ``attn_mask`` applies
        the causal mask; with one it is PyTorch's hint and the mask is used.

        ``weights`` is None unless ``need_weights``: then the attention
        probabilities (after dropout, as PyTorch returns them),
        differentiable, (N, L, S) averaged over the heads when
        ``average_attn_weights``, else (N, num_heads, L, S); unbatched (L, S)
        or (num_heads, L, S). ``need_weights`` defaults to False, where
        PyTorch's defaults to True: the weights cost O(L * S) memory per head
        that the fused kernel never spends. Without dropout the output is the
        fused kernel's either way; with dropout (training) and
        ``need_weights`` it is the returned weights @ v."""
        name = "MultiheadAttention"
        for what, flag in (("need_weights", need_weights),
                           ("average_attn_weights", average_attn_weights),
                           ("is_causal", is_causal)):
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(f"{name}: {what} must be a bool, got {flag!r}")
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
        parts = []
        if attn_mask is not None:
            parts.append(self._mask(attn_mask, q, n, length, s))
        if key_padding_mask is not None:
            parts.append(self._padding_mask(key_padding_mask, q, n, s, unbatched))
        # The fused kernel applies is_causal itself; a mask that must be
        # combined with it, or formed weights, need it as a mask.
        causal = bool(is_causal) and attn_mask is None
        if causal and (parts or need_weights):
            parts.append(np.where(np.triu(np.ones((length, s), bool), 1), -math.inf, 0.0)
                         .astype(q.dtype))
            causal = False
        mask = _combined(parts, q)
        if isinstance(mask, np.ndarray) and q.device != "cpu":
            mask = tensor(mask, device=q.device)
        p = self.dropout if self.training else 0.0
        qh, kh, vh = self._heads(q, 0), self._heads(k, 1), self._heads(v, 2)
        weights = None
        if need_weights:
            scores = ops.matmul(qh, ops.transpose(kh)) * (1.0 / math.sqrt(self.head_dim))
            if mask is not None:
                scores = scores + mask
            weights = ops.softmax(scores, axis=-1)
            if p > 0.0:
                weights = ops.dropout(weights, p, True)
        if weights is not None and p > 0.0:
            out = ops.matmul(weights, vh)
        else:
            out = ops.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, dropout_p=p,
                                                   is_causal=causal)
        out = self.out_proj(out.permute(0, 2, 1, 3).reshape((n, length, e)))
        if unbatched:
            out = out.reshape((length, e))
        elif not self.batch_first:
            out = out.transpose(0, 1)
        if weights is not None:
            if average_attn_weights:
                weights = ops.mean(weights, axis=1)
            if unbatched:
                weights = weights.reshape(weights.shape[1:])
        return out, weights

    def _mask(self, attn_mask: Any, q: Tensor, n: int, length: int, s: int) -> Any:
        """PyTorch's MHA mask as an additive float mask of q's dtype that
        broadcasts to (N, H, L, S): (L, S) stays, (N * H, L, S) becomes
        (N, H, L, S), a boolean one -inf where True."""
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
        return _additive(attn_mask, q, "attn_mask")

    def _padding_mask(self, key_padding_mask: Any, q: Tensor, n: int, s: int,
                      unbatched: bool) -> Any:
        """PyTorch's ``key_padding_mask`` (N, S), unbatched (S,), as an
        additive float mask (N, 1, 1, S)."""
        shape = tuple(key_padding_mask.shape)
        want = (s,) if unbatched else (n, s)
        if shape != want:
            raise ValueError(f"MultiheadAttention: key_padding_mask must be "
                             f"{'(S,)' if unbatched else '(N, S)'} = {want}, got {shape}")
        mask = key_padding_mask.reshape((n, 1, 1, s)) if isinstance(key_padding_mask, Tensor) \
            else np.asarray(key_padding_mask).reshape((n, 1, 1, s))
        return _additive(mask, q, "key_padding_mask")

    def __repr__(self) -> str:
        return (f"MultiheadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"dropout={self.dropout}, bias={self.in_proj_bias is not None}, "
                f"batch_first={self.batch_first}, dtype={self.in_proj_weight.dtype}, "
                f"device='{self.in_proj_weight.device}')")


def _additive(mask: Any, q: Tensor, what: str) -> Any:
    """A PyTorch-convention MHA mask (boolean: True = masked out; or float,
    added) as a float mask of q's dtype, a tensor or host array as given."""
    if isinstance(mask, Tensor):
        if mask.dtype == np.bool_:
            return ops.where(mask, -math.inf, 0.0).astype(q.dtype)
        array_dtype = mask.dtype
    else:
        mask = np.asarray(mask)
        if mask.dtype == np.bool_:
            return np.where(mask, -math.inf, 0.0).astype(q.dtype)
        array_dtype = mask.dtype
    if array_dtype != q.dtype:
        raise TypeError(f"MultiheadAttention: {what} must be boolean or of the query's dtype "
                        f"{q.dtype}, got {array_dtype} (shape {tuple(mask.shape)})")
    return mask


def _combined(parts: list, q: Tensor) -> Any:
    """The sum of additive masks (host arrays stay host arrays unless a
    tensor is among them), or None for none."""
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    if not any(isinstance(m, Tensor) for m in parts):
        return functools.reduce(np.add, parts)
    tensors = [m if isinstance(m, Tensor) else tensor(m, device=q.device) for m in parts]
    return functools.reduce(ops.add, tensors)
