"""Which layers ``Sequential`` fuses: a ``Linear`` directly followed by an
activation whose op ``ops.linear`` applies in its GEMM epilogue runs as one
``ops.linear(..., activation=)``, one pass fewer over the output and one op
fewer on the tape; a ``ReLU`` directly followed by a ``MaxPool2d`` (without
``return_indices``) runs as one ``ops.pool._relu_max_pool2d`` (the same
values and gradients as the two; the relu's output is never written), and
a ``Conv2d`` directly before that pair runs with them as one
``ops.conv_pool._conv2d_relu_max_pool2d`` (the pool reads the
convolution's GEMM rows as they are: no reorderings either way).

Fusing here, where the layers are known, not as a pattern in ``ng.compile``:
eager steps gain as much as compiled ones, a compiled step records the
fused kernels as it records any op, and the functional calls a user writes
(``ng.max_pool2d(ng.relu(x))``) run as written.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _dtypes, ops
from ..kernels import codes
from ..ops._common import is_scalar
from ..ops.conv_pool import _conv2d_relu_max_pool2d
from ..ops.pool import _relu_max_pool2d
from .activation import ReLU
from .conv import Conv2d, MaxPool2d
from .layers import Linear
from .module import Module


def _run_fused(modules: Sequence[Module], x: Any) -> Any:
    """``x`` through ``modules`` in order, each ``Linear`` (not a subclass)
    and the activation after it as one ``ops.linear`` where ``_epilogue``
    allows, and each ``ReLU`` followed by a ``MaxPool2d`` (neither a
    subclass, the pool without ``return_indices``) as one ``_relu_max_pool2d``,
    with a ``Conv2d`` (not a subclass) before them as one
    ``_conv2d_relu_max_pool2d``."""
    i, n = 0, len(modules)
    while i < n:
        module = modules[i]
        i += 1
        if type(module) is Conv2d and i + 1 < n and _relu_pool(modules[i], modules[i + 1]) \
                and not _half(x):
            pool = modules[i + 1]
            x = _conv2d_relu_max_pool2d(
                x, module.weight, module.bias, module.stride, module.padding, module.dilation,
                module.groups, kernel_size=pool.kernel_size, pool_stride=pool.stride,
                pool_padding=pool.padding, pool_dilation=pool.dilation,
                ceil_mode=pool.ceil_mode)
            i += 2
            continue
        if type(module) is Linear and i < n:
            activation = _epilogue(modules[i])
            if activation is not None:
                x = ops.linear(x, module.weight, module.bias, *activation)
                i += 1
                continue
        if i < n and _relu_pool(module, modules[i]) and not _half(x):
            pool = modules[i]
            x = _relu_max_pool2d(x, pool.kernel_size, pool.stride, pool.padding,
                                 pool.dilation, pool.ceil_mode)
            i += 1
            continue
        x = module(x)
    return x


def _half(x: Any) -> bool:
    """Whether ``x`` holds float16 or bfloat16 data, which the pools' fused
    ops (outside the op table, so not swapped for half-aware ones) do not
    take: those layers run as written, through the op table's ops."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and dtype in _dtypes.HALVES


def _relu_pool(relu: Module, pool: Module) -> bool:
    """Whether ``relu``, ``pool`` run as one ``_relu_max_pool2d``."""
    return type(relu) is ReLU and type(pool) is MaxPool2d and not pool.return_indices


def _epilogue(module: Module) -> tuple[str, float] | None:
    """(activation, negative_slope) for ``ops.linear`` if ``module`` can be fused
    into the GEMM before it: its class (not a subclass, which may compute
    something else) names an op in ``_linear_activation`` whose code's record
    (``kernels/codes.py``) puts it in the GEMM's epilogue. (The fused codes
    that keep their pre-activation, GELU's and SiLU's, save only one pass and
    would change the bias's order of addition, so ``Sequential`` runs them as
    written.)"""
    name = type(module).__dict__.get("_linear_activation")
    code = codes.ACTIVATIONS.get(name)
    if code is None or code not in codes.EPILOGUE:
        return None
    if code != codes.LEAKY_RELU:
        return name, 0.0
    slope = module.negative_slope
    return (name, slope) if is_scalar(slope) and slope >= 0 else None
