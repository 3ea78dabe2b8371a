"""Dropout: ``dropout`` draws its mask on the device from numbagrad's
counter-based generator (``numbagrad/random.py``): one launch forward (mask
and output together), one backward.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import buffers, kernels
from .. import random as _random
from ..tape import Node, _Backward
from ..tensor import Tensor
from ._common import contiguous, describe, is_scalar, ones, operand, reshaped, result


def _flat(array: Any) -> Any:
    return reshaped(array, (math.prod(array.shape),))


def dropout(x: Any, p: float = 0.5, training: bool = True, *,
            generator: np.random.Generator | None = None) -> Tensor:
    """``torch.nn.functional.dropout``: each element is zeroed with probability
    ``p`` and the kept ones are scaled by 1 / (1 - p); ``p == 0``, ``training=
    False`` and an empty ``x`` return ``x`` itself (as PyTorch), ``p == 1``
    zeros. The mask comes from numbagrad's generator (``ng.manual_seed``,
    ``ng.random.get_state``), advanced on the device by every call, so
    compiled steps draw fresh masks too. ``generator=`` (a NumPy Generator)
    draws the call's seed from it on the host instead: that generator is the
    caller's to save and restore. A compiled step (``ng.compile``) cannot
    replay such a host-side draw, so its first verification call raises
    ``GraphChangedError``: compiled steps use numbagrad's generator."""
    op = "dropout"
    x = operand(x, op)
    if not is_scalar(p) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{op}: p must be a probability in [0, 1], got {p!r} (input of "
                         f"{describe(x)})")
    if not isinstance(training, (bool, np.bool_)):
        raise TypeError(f"{op}: training must be a bool, got {training!r}")
    if generator is not None and not isinstance(generator, np.random.Generator):
        raise TypeError(f"{op}: generator must be a NumPy Generator "
                        f"(np.random.default_rng(seed)) or None, got {type(generator).__name__}")
    if not training or p == 0 or x.size == 0:
        return x
    kern, dtype = x._kern, x._data.dtype
    state = _random.state(kern) if generator is None else _random.drawn_state(kern, generator)
    out = buffers.take(kern, x.shape, dtype)
    mask = buffers.take(kern, x.shape, dtype)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - float(p))
    kernels.call(kern, "dropout", out.size, _flat(contiguous(x)), _flat(out), _flat(mask), state,
                 float(p), scale)
    return result(out, kern, (x,), _dropout_backward, (mask,))


def _dropout_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (x,) = node.inputs
    (mask,) = node.saved
    kern = x._kern
    if gout is None:
        gout = ones(kern, x.shape, x._data.dtype)
    dest, beta = ctx.dest(x)
    kernels.call(kern, "dropout_backward", dest.size, _flat(gout), _flat(mask), _flat(dest),
                 beta)
