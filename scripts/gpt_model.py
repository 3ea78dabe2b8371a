"""nanoGPT's model in ``ng.nn`` (``GPT``) and its PyTorch twin (``TorchGPT``).

Both have nanoGPT's parameter names (``transformer.wte.weight``,
``transformer.h.0.attn.c_attn.weight``, ..., ``lm_head.weight``), so one
state dict made by ``nanogpt_init`` loads into either. The head is tied to
the token embedding: ``lm_head.weight`` *is* ``transformer.wte.weight`` (one
param, used twice; both keys are in the state dict, as in PyTorch).
Attention runs through the fused ``scaled_dot_product_attention`` (causal).

Importing this module needs NumPy only (``GPTConfig``, ``param_shapes``,
``nanogpt_init``, read by every benchmark peer): ``GPT`` imports numbagrad
and ``TorchGPT`` PyTorch when first used.
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# GPT and TorchGPT come from __getattr__ (built on first use)
__all__ = ["GPTConfig", "nanogpt_init", "param_shapes"]


@dataclass(frozen=True)
class GPTConfig:
    """The model's sizes; the defaults are nanoGPT's CPU character-level config."""

    vocab_size: int
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig: {name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd={self.n_embd} must be divisible by "
                             f"n_head={self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig: dropout must be in [0, 1), got {self.dropout!r}")


def param_shapes(c: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Every state-dict entry's shape, in state-dict order (``lm_head.weight``,
    the tied head, last)."""
    e = c.n_embd
    shapes = {"transformer.wte.weight": (c.vocab_size, e),
              "transformer.wpe.weight": (c.block_size, e)}
    for i in range(c.n_layer):
        for name, shape in (("ln_1.weight", (e,)), ("ln_1.bias", (e,)),
                            ("attn.c_attn.weight", (3 * e, e)), ("attn.c_attn.bias", (3 * e,)),
                            ("attn.c_proj.weight", (e, e)), ("attn.c_proj.bias", (e,)),
                            ("ln_2.weight", (e,)), ("ln_2.bias", (e,)),
                            ("mlp.c_fc.weight", (4 * e, e)), ("mlp.c_fc.bias", (4 * e,)),
                            ("mlp.c_proj.weight", (e, 4 * e)), ("mlp.c_proj.bias", (e,))):
            shapes[f"transformer.h.{i}.{name}"] = shape
    shapes.update({"transformer.ln_f.weight": (e,), "transformer.ln_f.bias": (e,),
                   "lm_head.weight": (c.vocab_size, e)})
    return shapes


def nanogpt_init(c: GPTConfig, seed: int, dtype: Any = np.float32) -> dict[str, np.ndarray]:
    """nanoGPT's init as a state dict: weights and embeddings N(0, 0.02), each
    ``c_proj.weight`` N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm
    weights 1; drawn in state-dict order from ``np.random.default_rng(seed)``
    in float64, then cast; the tied head is the token embedding's array."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in param_shapes(c).items():
        if name == "lm_head.weight":
            out[name] = out["transformer.wte.weight"]
        elif ".ln_" in name:
            out[name] = (np.ones if name.endswith("weight") else np.zeros)(shape, dtype)
        elif name.endswith("bias"):
            out[name] = np.zeros(shape, dtype)
        else:
            std = 0.02 / math.sqrt(2 * c.n_layer) if name.endswith("c_proj.weight") else 0.02
            out[name] = rng.normal(0.0, std, shape).astype(dtype)
    return out


# ------------------------------------------------------------------ numbagrad
_CLASSES: dict[str, type] = {}


def _ng_gpt() -> type:
    """``GPT`` in ``ng.nn``, defined on first use (numbagrad imported then)."""
    if "GPT" in _CLASSES:
        return _CLASSES["GPT"]
    import numbagrad as ng

    class CausalSelfAttention(ng.nn.Module):
        """Multi-head causal self-attention: one (E, 3E) projection, the fused
        attention over (B, heads, T, E / heads), an output projection."""

        def __init__(self, c: GPTConfig, **kw: Any) -> None:
            super().__init__()
            self.c_attn = ng.nn.Linear(c.n_embd, 3 * c.n_embd, **kw)
            self.c_proj = ng.nn.Linear(c.n_embd, c.n_embd, **kw)
            self.resid_dropout = ng.nn.Dropout(c.dropout)
            self.n_head, self.dropout = c.n_head, c.dropout

        def forward(self, x: ng.Tensor) -> ng.Tensor:
            b, t, e = x.shape
            w, bias = self.c_attn.weight, self.c_attn.bias
            # q, k, v from row blocks of c_attn (as ng.nn.MultiheadAttention does): the
            # gradient of a slice of the (3E, E) weight is cheaper to place than one of
            # the (3, B, heads, T, E / heads) activations
            q, k, v = (ng.linear(x, w[i * e:(i + 1) * e], bias[i * e:(i + 1) * e])
                       .reshape((b, t, self.n_head, e // self.n_head)).permute(0, 2, 1, 3)
                       for i in range(3))
            y = ng.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                dropout_p=self.dropout if self.training else 0.0)
            return self.resid_dropout(self.c_proj(y.permute(0, 2, 1, 3).reshape((b, t, e))))

    class MLP(ng.nn.Module):
        """Linear E -> 4E, GELU (exact, in the GEMM's epilogue), linear 4E -> E."""

        def __init__(self, c: GPTConfig, **kw: Any) -> None:
            super().__init__()
            self.c_fc = ng.nn.Linear(c.n_embd, 4 * c.n_embd, **kw)
            self.c_proj = ng.nn.Linear(4 * c.n_embd, c.n_embd, **kw)
            self.dropout = ng.nn.Dropout(c.dropout)

        def forward(self, x: ng.Tensor) -> ng.Tensor:
            h = ng.linear(x, self.c_fc.weight, self.c_fc.bias, activation="gelu")
            return self.dropout(self.c_proj(h))

    class Block(ng.nn.Module):
        """Pre-norm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x))."""

        def __init__(self, c: GPTConfig, dtype: Any, device: str, rng: Any) -> None:
            super().__init__()
            kw = {"dtype": dtype, "device": device, "rng": rng}
            self.ln_1 = ng.nn.LayerNorm(c.n_embd, dtype=dtype, device=device)
            self.attn = CausalSelfAttention(c, **kw)
            self.ln_2 = ng.nn.LayerNorm(c.n_embd, dtype=dtype, device=device)
            self.mlp = MLP(c, **kw)

        def forward(self, x: ng.Tensor) -> ng.Tensor:
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(ng.nn.Module):
        """nanoGPT: token + position embeddings, ``n_layer`` blocks, a final
        LayerNorm and a head tied to the token embedding. ``model(idx, targets)``
        takes integer arrays (B, T) with T <= block_size and returns (logits
        (B, T, vocab), the mean cross-entropy or None). A half ``dtype``
        (float16, bfloat16) holds the params in it, computes each op in
        float32 and the loss from float32 logits."""

        def __init__(self, config: GPTConfig, *, dtype: Any = np.float32, device: str = "cpu",
                     seed: int = 0) -> None:
            super().__init__()
            c = self.config = config
            half = np.dtype(dtype) if np.dtype(dtype).itemsize == 2 else None
            dtype = np.float32 if half is not None else dtype   # (layers are built in float32)
            rng = np.random.default_rng(seed)   # replaced by nanogpt_init below
            kw = {"dtype": dtype, "device": device}
            self.transformer = ng.nn.ModuleDict({
                "wte": ng.nn.Embedding(c.vocab_size, c.n_embd, rng=rng, **kw),
                "wpe": ng.nn.Embedding(c.block_size, c.n_embd, rng=rng, **kw),
                "drop": ng.nn.Dropout(c.dropout),
                "h": ng.nn.ModuleList([Block(c, dtype, device, rng) for _ in range(c.n_layer)]),
                "ln_f": ng.nn.LayerNorm(c.n_embd, dtype=dtype, device=device),
            })
            self.lm_head = ng.nn.Linear(c.n_embd, c.vocab_size, bias=False, dtype=dtype,
                                        device=device, rng=rng)
            self.lm_head.weight = self.transformer.wte.weight    # tied: one param
            self._positions = np.arange(c.block_size, dtype=np.int64)
            self.load_state_dict(nanogpt_init(c, seed, dtype))
            if half is not None:   # the float32 init rounded once to the half format
                self.to(dtype=half)

        def forward(self, idx: np.ndarray, targets: np.ndarray | None = None
                    ) -> tuple[ng.Tensor, ng.Tensor | None]:
            b, t = idx.shape
            if t > self.config.block_size:
                raise ValueError(f"GPT: sequence length {t} exceeds block_size "
                                 f"{self.config.block_size}")
            tr = self.transformer
            x = tr.drop(tr.wte(idx) + tr.wpe(self._positions[:t]))
            for block in tr.h:
                x = block(x)
            logits = self.lm_head(tr.ln_f(x))
            if targets is None:
                return logits, None
            flat = logits.reshape((b * t, self.config.vocab_size))
            if flat.dtype.itemsize == 2:   # half logits: the loss in float32, as autocast
                flat = flat.astype(np.float32)
            loss = ng.cross_entropy(flat, targets.reshape(b * t))
            return logits, loss

    _CLASSES["GPT"] = GPT
    return GPT


# ------------------------------------------------------------------ PyTorch
def _torch_gpt() -> type:
    """The PyTorch twin, defined on first use (PyTorch imported then)."""
    if "TorchGPT" in _CLASSES:
        return _CLASSES["TorchGPT"]
    import torch
    from torch import nn
    from torch.nn import functional as F

    class TorchAttention(nn.Module):
        def __init__(self, c: GPTConfig, **kw: Any) -> None:
            super().__init__()
            self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, **kw)
            self.c_proj = nn.Linear(c.n_embd, c.n_embd, **kw)
            self.resid_dropout = nn.Dropout(c.dropout)
            self.n_head, self.dropout = c.n_head, c.dropout

        def forward(self, x):
            b, t, e = x.shape
            q, k, v = self.c_attn(x).view(b, t, 3, self.n_head, e // self.n_head) \
                .permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=self.dropout if self.training else 0.0)
            return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(b, t, e)))

    class TorchMLP(nn.Module):
        def __init__(self, c: GPTConfig, **kw: Any) -> None:
            super().__init__()
            self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd, **kw)
            self.c_proj = nn.Linear(4 * c.n_embd, c.n_embd, **kw)
            self.dropout = nn.Dropout(c.dropout)

        def forward(self, x):
            return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))

    class TorchBlock(nn.Module):
        def __init__(self, c: GPTConfig, **kw: Any) -> None:
            super().__init__()
            self.ln_1 = nn.LayerNorm(c.n_embd, **kw)
            self.attn = TorchAttention(c, **kw)
            self.ln_2 = nn.LayerNorm(c.n_embd, **kw)
            self.mlp = TorchMLP(c, **kw)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class TorchGPT(nn.Module):
        """``GPT`` in PyTorch: the same names, init and tied head."""

        def __init__(self, config: GPTConfig, *, dtype: Any = np.float32, device: str = "cpu",
                     seed: int = 0) -> None:
            super().__init__()
            c = self.config = config
            kw = {"dtype": getattr(torch, np.dtype(dtype).name), "device": device}
            self.transformer = nn.ModuleDict({
                "wte": nn.Embedding(c.vocab_size, c.n_embd, **kw),
                "wpe": nn.Embedding(c.block_size, c.n_embd, **kw),
                "drop": nn.Dropout(c.dropout),
                "h": nn.ModuleList([TorchBlock(c, **kw) for _ in range(c.n_layer)]),
                "ln_f": nn.LayerNorm(c.n_embd, **kw),
            })
            self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False, **kw)
            self.lm_head.weight = self.transformer.wte.weight
            self.register_buffer("positions", torch.arange(c.block_size, device=device),
                                 persistent=False)
            self.load_state_dict({k: torch.from_numpy(v) for k, v in
                                  nanogpt_init(c, seed, dtype).items()})

        def forward(self, idx, targets=None):
            b, t = idx.shape
            tr = self.transformer
            x = tr.drop(tr.wte(idx) + tr.wpe(self.positions[:t]))
            for block in tr.h:
                x = block(x)
            logits = self.lm_head(tr.ln_f(x))
            if targets is None:
                return logits, None
            return logits, F.cross_entropy(logits.reshape(b * t, -1), targets.reshape(b * t))

    _CLASSES["TorchGPT"] = TorchGPT
    return TorchGPT


def __getattr__(name: str) -> Any:
    if name == "GPT":
        return _ng_gpt()
    if name == "TorchGPT":
        return _torch_gpt()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
