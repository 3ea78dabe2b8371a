"""Differentiable ops, one module per family, each forward beside its backward.

A forward validates its operands (raising before anything is written),
takes its output from the buffer pool, runs one kernel and, when recording,
attaches a ``Node``. A backward receives the output's gradient (``None``
for the loss itself, meaning ones) and writes each input's gradient where
the pass's ``dest`` says, with beta=1 adding into what is already there.
"""
from .table import OPS
from . import _half  # noqa: F401,E402 (half precision: the casts and the op wrapper)

__all__ = [op.name for op in OPS]
globals().update({op.name: op.fn for op in OPS})
