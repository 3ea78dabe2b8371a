"""Differentiable ops, one module per family, each forward beside its backward.

A forward validates its operands (raising before anything is written),
takes its output from the buffer pool, runs one kernel and, when recording,
attaches a ``Node``. A backward receives the output's gradient (``None``
for the loss itself, meaning ones) and writes each input's gradient where
the pass's ``dest`` says, with beta=1 adding into what is already there.
"""
from .elementwise import (add, div, exp, leaky_relu, log, mul, neg, pow, relu,  # noqa: F401
                          sigmoid, sqrt, sub, tanh)
from .losses import binary_cross_entropy_with_logits, cross_entropy, mse_loss  # noqa: F401
from .matmul import linear, matmul  # noqa: F401
from .reductions import log_softmax, mean, softmax, sum  # noqa: F401
from .shape import reshape, transpose  # noqa: F401
