"""The op table: one row per public op.

Everything that lists ops is derived from ``OPS``: the ``ng.`` namespace and
``__all__`` (``ops/__init__.py``), the Tensor methods and operators, the
NumPy ufuncs a tensor answers to (``Tensor.__array_ufunc__``), the
activations ``linear`` applies in its GEMM epilogue, and the tests' op
cases (``tests/test_op_table.py`` runs each row against its PyTorch
reference). Adding an op is its module (forward beside backward), one
kernel per device and one row here.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kernels import codes
from ..tensor import Tensor
from . import conv, pool   # convolution and pooling
from . import resample   # interpolate (made of indexing and matmul)
from . import elementwise as ew
from . import indexing, join, losses, masks, matmul, reductions, shape
from . import dropout, embedding   # randomness; integer row lookups
from . import activations, extrema, statistics  # noqa: I001 (activations and reductions)
from . import attention, norm   # normalisation and attention
from . import creation   # zeros, arange, rand, ...
from . import layout   # flip, roll, tril, repeat, ... (made of the ops above)
from . import arith   # binary math: atan2, fmod, %, //, logaddexp, isclose, ...
from . import einsum   # lowered to diagonal, sum and batched matmul
from . import sorting   # sort, argsort, topk
from . import bitwise   # & | ^ ~ << >>, logical_*: integer and bool tensors
from . import scans, selection, vector_norm   # issue 30: scans, norm, scatter, unfold


@dataclass(frozen=True)
class Op:
    """One public op.

    ``code``: its kernel code (``kernels/codes.py``), for the ops that have
    one (an op made by ``unary_op`` brings its own). ``method``: also a
    Tensor method of the same name (``x.relu()``).
    ``operators``: the Tensor operators that run it; a reflected one
    (``__radd__``) passes the tensor second. ``numpy``: the NumPy ufuncs
    that run it on a tensor. (Whether ``linear(..., activation=name)``
    applies it is its code's record in ``kernels/codes.py``.) ``torch``:
    the PyTorch expression the tests compare it with, in the names
    ``torch``, ``F`` (functional) and the inputs ``a``, ``b`` (a string: the
    package never imports PyTorch).
    ``sample``: the input shapes of that test; ``domain``: "positive" when
    the inputs must be > 0, "unit" inside (-1, 1), "above_one" > 1;
    ``targets``: how many of the last inputs are data the op never
    differentiates (a loss's target); ``args``: further arguments of that
    test's call (an exponent, a shape). ``integer``: an op of integer and
    bool tensors only (bitwise): its tests feed it those, and compare it
    with the ``torch`` function of its name (it has no gradient).
    """

    name: str
    fn: Callable
    code: int | None = None
    method: bool = False
    operators: tuple[str, ...] = ()
    numpy: tuple[str, ...] = ()
    torch: str | None = None
    sample: tuple[tuple[int, ...], ...] = ((3, 4),)
    domain: str = "real"
    targets: int = 0
    args: tuple = ()
    integer: bool = False

    def __post_init__(self) -> None:
        if self.code is None and hasattr(self.fn, "code"):
            object.__setattr__(self, "code", self.fn.code)


def unary_op(name: str, doc: str) -> Callable[[Any], Tensor]:
    """The op ``name(x)`` of the unary record ``name`` (``kernels/codes.py``):
    one ``unary`` kernel forward, one ``unary_backward`` backward, on every
    device. Its row below makes it public, so a new code is its record and
    its row (``docs/adding_an_op.md``)."""
    names = [r.name for r in codes.UNARY]
    if name not in names:
        raise ValueError(f"unary_op: no unary record named {name!r} in kernels/codes.py "
                         f"(known: {names})")
    code = names.index(name)

    def op(x: Any) -> Tensor:
        return ew._unary(code, x, 0.0, name)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    op.code = code      # type: ignore[attr-defined]  (the row's code)
    return op


_PAIR = ((3, 4), (4,))
OPS: tuple[Op, ...] = (
    Op("add", ew.add, codes.ADD, operators=("__add__", "__radd__"), numpy=("add",),
       torch="torch.add(a, b)", sample=_PAIR),
    Op("sub", ew.sub, codes.SUB, operators=("__sub__", "__rsub__"), numpy=("subtract",),
       torch="torch.sub(a, b)", sample=_PAIR),
    Op("mul", ew.mul, codes.MUL, operators=("__mul__", "__rmul__"), numpy=("multiply",),
       torch="torch.mul(a, b)", sample=_PAIR),
    Op("div", ew.div, codes.DIV, operators=("__truediv__", "__rtruediv__"),
       numpy=("divide", "true_divide"), torch="torch.div(a, b)", sample=_PAIR),
    Op("neg", ew.neg, codes.NEG, operators=("__neg__",), numpy=("negative",),
       torch="torch.neg(a)"),
    Op("pow", ew.pow, codes.POW, operators=("__pow__", "__rpow__"), numpy=("power",),
       torch="torch.pow(a, 3)", args=(3,)),
    Op("relu", ew.relu, codes.RELU, method=True, torch="torch.relu(a)"),
    Op("leaky_relu", ew.leaky_relu, codes.LEAKY_RELU, method=True,
       torch="F.leaky_relu(a)"),
    Op("tanh", ew.tanh, codes.TANH, method=True, numpy=("tanh",),
       torch="torch.tanh(a)"),
    Op("sigmoid", ew.sigmoid, codes.SIGMOID, method=True, torch="torch.sigmoid(a)"),
    Op("exp", ew.exp, codes.EXP, method=True, numpy=("exp",), torch="torch.exp(a)"),
    Op("log", ew.log, codes.LOG, method=True, numpy=("log",), torch="torch.log(a)",
       domain="positive"),
    Op("sqrt", ew.sqrt, codes.SQRT, method=True, numpy=("sqrt",), torch="torch.sqrt(a)",
       domain="positive"),
    Op("sum", reductions.sum, method=True, numpy=("sum",), torch="torch.sum(a)"),
    Op("mean", reductions.mean, method=True, numpy=("mean",), torch="torch.mean(a)"),
    Op("softmax", reductions.softmax, method=True, torch="torch.softmax(a, -1)"),
    Op("log_softmax", reductions.log_softmax, method=True, torch="torch.log_softmax(a, -1)"),
    Op("matmul", matmul.matmul, operators=("__matmul__", "__rmatmul__"), numpy=("matmul",),
       torch="torch.matmul(a, b)", sample=((3, 4), (4, 2))),
    Op("linear", matmul.linear, torch="F.linear(a, b)", sample=((3, 4), (2, 4))),
    Op("einsum", einsum.einsum, numpy=("einsum",)),   # an equation first: tests/test_einsum.py
    Op("mse_loss", losses.mse_loss, torch="F.mse_loss(a, b)", sample=((3, 4), (3, 4)),
       targets=1),
    Op("cross_entropy", losses.cross_entropy),   # integer labels: tests/test_ops.py
    Op("binary_cross_entropy_with_logits", losses.binary_cross_entropy_with_logits,
       torch="F.binary_cross_entropy_with_logits(a, b)", sample=((3, 4), (3, 4)), targets=1),
    # --- shape, joining and indexing ops
    Op("reshape", shape.reshape, method=True, numpy=("reshape",), torch="torch.reshape(a, (4, 3))",
       args=((4, 3),)),
    Op("view", shape.view, method=True, torch="a.view(2, 1, 6)", args=((2, 1, 6),)),
    Op("permute", shape.permute, method=True, numpy=("transpose",), torch="a.permute(2, 0, 1)",
       sample=((2, 3, 4),), args=((2, 0, 1),)),
    Op("transpose", shape.transpose, method=True, torch="torch.transpose(a, 0, 2)",
       sample=((2, 3, 4),), args=(0, 2)),
    Op("flatten", shape.flatten, method=True, torch="torch.flatten(a, 1)",
       sample=((2, 3, 4),), args=(1,)),
    Op("squeeze", shape.squeeze, method=True, numpy=("squeeze",), torch="torch.squeeze(a, 1)",
       sample=((2, 1, 4),), args=(1,)),
    Op("unsqueeze", shape.unsqueeze, method=True, numpy=("expand_dims",),
       torch="torch.unsqueeze(a, -1)", args=(-1,)),
    Op("broadcast_to", shape.broadcast_to, method=True, numpy=("broadcast_to",),
       torch="torch.broadcast_to(a, (2, 3, 4))", sample=((3, 1),), args=((2, 3, 4),)),
    Op("expand", shape.expand, method=True, torch="a.expand(2, -1, 4)", sample=((3, 1),),
       args=(2, -1, 4)),
    # (the joins take a list, which the table's torch cases do not: tests/test_join.py)
    Op("concatenate", join.concatenate, numpy=("concatenate",)),
    Op("cat", join.cat),
    Op("stack", join.stack, numpy=("stack",)),
    Op("split", join.split, numpy=("split",)),
    Op("pad", join.pad, numpy=("pad",), torch="F.pad(a, (2, 0, 1, 1), value=0.5)",
       args=(((1, 1), (2, 0)), 0.5)),
    Op("getitem", indexing.getitem, operators=("__getitem__",), numpy=("take",)),
    Op("gather", indexing.gather, method=True, numpy=("take_along_axis",)),
    # --- binary math (ops/arith.py; a tensor exponent in pow, rounding_mode,
    # the boolean tests: tests/test_arith.py)
    Op("atan2", arith.atan2, method=True, numpy=("arctan2",), torch="torch.atan2(a, b)",
       sample=_PAIR),
    Op("copysign", arith.copysign, method=True, numpy=("copysign",),
       torch="torch.copysign(a, b)", sample=_PAIR),
    Op("fmod", arith.fmod, method=True, numpy=("fmod",), torch="torch.fmod(a, b)",
       sample=_PAIR),
    Op("remainder", arith.remainder, method=True, operators=("__mod__", "__rmod__"),
       numpy=("remainder",), torch="torch.remainder(a, b)", sample=_PAIR),
    Op("floor_divide", arith.floor_divide, method=True,
       operators=("__floordiv__", "__rfloordiv__"), numpy=("floor_divide",),
       torch="torch.div(a, b, rounding_mode='floor')", sample=_PAIR),
    Op("logaddexp", arith.logaddexp, method=True, numpy=("logaddexp",),
       torch="torch.logaddexp(a, b)", sample=_PAIR),
    Op("lerp", arith.lerp, method=True, torch="torch.lerp(a, b, 0.3)",
       sample=((3, 4), (3, 4)), args=(0.3,)),
    Op("isnan", arith.isnan, method=True, numpy=("isnan",)),
    Op("isinf", arith.isinf, method=True, numpy=("isinf",)),
    Op("isfinite", arith.isfinite, method=True, numpy=("isfinite",)),
    Op("isclose", arith.isclose, method=True, numpy=("isclose",)),
    Op("any", arith.any, method=True),
    Op("all", arith.all, method=True),
    # --- rearranging, repeating and masking (ops/layout.py; chunk: tests/test_layout.py)
    Op("flip", layout.flip, method=True, numpy=("flip",), torch="torch.flip(a, (0, 2))",
       sample=((2, 3, 4),), args=((0, 2),)),
    Op("roll", layout.roll, method=True, numpy=("roll",),
       torch="torch.roll(a, (1, -3), (0, 1))", args=((1, -3), (0, 1))),
    Op("tril", layout.tril, method=True, numpy=("tril",), torch="torch.tril(a, -1)",
       sample=((2, 3, 4),), args=(-1,)),
    Op("triu", layout.triu, method=True, numpy=("triu",), torch="torch.triu(a, 1)",
       sample=((2, 3, 4),), args=(1,)),
    Op("masked_fill", layout.masked_fill, method=True,
       torch="a.masked_fill(torch.tensor([True, False, False, True]), 0.5)",
       args=(np.array([True, False, False, True]), 0.5)),
    Op("chunk", layout.chunk, method=True),
    Op("unflatten", layout.unflatten, method=True, torch="torch.unflatten(a, 1, (2, -1))",
       args=(1, (2, -1))),
    Op("repeat", layout.repeat, method=True, torch="a.repeat(2, 1, 3)", args=((2, 1, 3),)),
    Op("tile", layout.tile, method=True, numpy=("tile",), torch="torch.tile(a, (2,))",
       sample=((2, 3),), args=((2,),)),
    Op("repeat_interleave", layout.repeat_interleave, method=True, numpy=("repeat",),
       torch="torch.repeat_interleave(a, 2, 1)", args=(2, 1)),
    Op("diagonal", layout.diagonal, method=True, numpy=("diagonal",),
       torch="torch.diagonal(a, 1, 0, 2)", sample=((3, 4, 5),), args=(1, 0, 2)),
    Op("diag", layout.diag, method=True, numpy=("diag",), torch="torch.diag(a, -1)",
       sample=((4,),), args=(-1,)),
    Op("meshgrid", layout.meshgrid),     # a list: tests/test_layout.py
    # --- selection, comparison and casting ops
    Op("lt", masks.lt, operators=("__lt__",), numpy=("less",)),
    Op("le", masks.le, operators=("__le__",), numpy=("less_equal",)),
    Op("gt", masks.gt, operators=("__gt__",), numpy=("greater",)),
    Op("ge", masks.ge, operators=("__ge__",), numpy=("greater_equal",)),
    Op("eq", masks.eq, operators=("__eq__",), numpy=("equal",)),
    Op("ne", masks.ne, operators=("__ne__",), numpy=("not_equal",)),
    Op("where", masks.where, numpy=("where",)),   # vs torch: tests/test_select.py
    Op("astype", masks.astype, method=True),
    # --- activations
    Op("gelu", activations.gelu, codes.GELU, method=True, torch="F.gelu(a)"),
    Op("silu", activations.silu, codes.SILU, method=True, torch="F.silu(a)"),
    Op("softplus", activations.softplus, codes.SOFTPLUS, method=True,
       torch="F.softplus(a, 2.0, 1.5)", args=(2.0, 1.5)),
    Op("abs", activations.abs, codes.ABS, method=True, operators=("__abs__",), numpy=("absolute",),
       torch="torch.abs(a)"),
    Op("clamp", activations.clamp, method=True, torch="torch.clamp(a, -0.5, 0.7)",
       args=(-0.5, 0.7)),
    Op("clip", activations.clip, method=True, torch="torch.clip(a, None, 0.3)",
       args=(None, 0.3)),
    Op("maximum", activations.maximum, codes.MAX, numpy=("maximum",),
       torch="torch.maximum(a, b)", sample=_PAIR),
    Op("minimum", activations.minimum, codes.MIN, numpy=("minimum",),
       torch="torch.minimum(a, b)", sample=_PAIR),

    # --- reductions
    Op("amax", extrema.amax, method=True, torch="torch.amax(a, 1)", args=(1,)),
    Op("amin", extrema.amin, method=True, torch="torch.amin(a, (0, 2), True)",
       sample=((2, 3, 4),), args=((0, 2), True)),
    # (with an axis, (values, indices) vs torch: tests/test_torch_habits_ops.py)
    Op("max", extrema.max, method=True, torch="torch.max(a)"),
    Op("min", extrema.min, method=True, torch="torch.min(a)"),
    Op("argmax", extrema.argmax, method=True),     # integer indices: tests/test_extrema.py
    Op("argmin", extrema.argmin, method=True),
    Op("logsumexp", statistics.logsumexp, method=True, torch="torch.logsumexp(a, -1)",
       args=(-1,)),
    Op("var", statistics.var, method=True, torch="torch.var(a, 0)", args=(0,)),
    Op("std", statistics.std, method=True, torch="torch.std(a, None, correction=0)",
       args=(None, 0)),
    Op("cumsum", statistics.cumsum, method=True, torch="torch.cumsum(a, 1)", args=(1,)),
    # (values and indices: tests/test_sorting.py)
    Op("sort", sorting.sort, method=True),
    Op("argsort", sorting.argsort, method=True),
    Op("topk", sorting.topk, method=True),
    Op("var_mean", statistics.var_mean),      # pairs: tests/test_layout.py
    Op("std_mean", statistics.std_mean),

    # --- losses
    Op("nll_loss", losses.nll_loss),   # integer labels: tests/test_losses17.py
    Op("l1_loss", losses.l1_loss, torch="F.l1_loss(a, b)", sample=((3, 4), (3, 4)), targets=1),
    Op("smooth_l1_loss", losses.smooth_l1_loss,
       torch="F.smooth_l1_loss(a, b, reduction='sum', beta=0.5)", sample=((3, 4), (3, 4)),
       targets=1, args=("sum", 0.5)),
    Op("huber_loss", losses.huber_loss, torch="F.huber_loss(a, b, reduction='none', delta=0.7)",
       sample=((3, 4), (3, 4)), targets=1, args=("none", 0.7)),
    Op("binary_cross_entropy", losses.binary_cross_entropy),   # probabilities: test_losses17

    # --- randomness, dropout and embedding
    # (random masks and integer indices: tests/test_dropout.py, tests/test_nn_modules.py)
    Op("dropout", dropout.dropout),
    Op("embedding", embedding.embedding),

    # --- convolution and pooling
    Op("conv1d", conv.conv1d, torch="F.conv1d(a, b, None, 2, 1, 1, 2)",
       sample=((2, 4, 7), (4, 2, 3)), args=(None, 2, 1, 1, 2)),
    Op("conv2d", conv.conv2d, torch="F.conv2d(a, b, None, 1, 1)",
       sample=((2, 2, 4, 5), (3, 2, 2, 3)), args=(None, 1, 1)),
    Op("conv3d", conv.conv3d, torch="F.conv3d(a, b, None, (2, 1, 1), 1, 1, 2)",
       sample=((1, 4, 4, 3, 4), (2, 2, 3, 2, 2)), args=(None, (2, 1, 1), 1, 1, 2)),
    Op("conv_transpose1d", conv.conv_transpose1d,
       torch="F.conv_transpose1d(a, b, None, 2, 1, 1, 2)", sample=((2, 4, 5), (4, 1, 3)),
       args=(None, 2, 1, 1, 2)),
    Op("conv_transpose2d", conv.conv_transpose2d,
       torch="F.conv_transpose2d(a, b, None, 2, 1, (1, 0))", sample=((2, 2, 3, 4), (2, 3, 3, 2)),
       args=(None, 2, 1, (1, 0))),
    Op("max_pool2d", pool.max_pool2d, torch="F.max_pool2d(a, 2, 1)", sample=((2, 2, 3, 4),),
       args=(2, 1)),
    Op("avg_pool2d", pool.avg_pool2d, torch="F.avg_pool2d(a, 3, 2, 1)", sample=((1, 2, 5, 4),),
       args=(3, 2, 1)),
    Op("adaptive_avg_pool2d", pool.adaptive_avg_pool2d, torch="F.adaptive_avg_pool2d(a, (2, 3))",
       sample=((1, 2, 5, 4),), args=((2, 3),)),
    # (indices from max_pool2d(..., return_indices=True): tests/test_pool_options.py)
    Op("max_unpool2d", pool.max_unpool2d),
    Op("interpolate", resample.interpolate, torch="F.interpolate(a, (5, 3), None, 'bilinear')",
       sample=((2, 2, 3, 4),), args=((5, 3), None, "bilinear")),

    # --- normalisation and attention
    # (weights, biases, running statistics and layers: tests/test_norm.py)
    Op("layer_norm", norm.layer_norm, torch="F.layer_norm(a, (3, 4))", sample=((2, 3, 4),),
       args=((3, 4),)),
    Op("group_norm", norm.group_norm, torch="F.group_norm(a, 2)", sample=((2, 4, 3),),
       args=(2,)),
    Op("batch_norm", norm.batch_norm, torch="F.batch_norm(a, None, None, training=True)",
       sample=((3, 2, 2),), args=(None, None, None, None, True)),
    # (three inputs and a mask, which the table's torch cases do not take: tests/test_attention.py)
    Op("scaled_dot_product_attention", attention.scaled_dot_product_attention),

    # --- creation (no tensor input: tests/test_creation.py)
    Op("zeros", creation.zeros),
    Op("ones", creation.ones),
    Op("full", creation.full),
    Op("empty", creation.empty),
    Op("zeros_like", creation.zeros_like, numpy=("zeros_like",)),
    Op("ones_like", creation.ones_like, numpy=("ones_like",)),
    Op("full_like", creation.full_like, numpy=("full_like",)),
    Op("empty_like", creation.empty_like, numpy=("empty_like",)),
    Op("arange", creation.arange),
    Op("linspace", creation.linspace),
    Op("eye", creation.eye),
    Op("rand", creation.rand),
    Op("randn", creation.randn),
    Op("normal", creation.normal),
    Op("rand_like", creation.rand_like),
    Op("randn_like", creation.randn_like),
    Op("randint", creation.randint),
    Op("multinomial", creation.multinomial),
    Op("one_hot", creation.one_hot),

    # --- elementwise codes made from their records (kernels/codes.py)
    Op("erf", unary_op("erf", "The error function elementwise (PyTorch's torch.erf; its "
                                 "gradient 2 / sqrt(pi) exp(-x^2) is 0 at +-inf)."),
       method=True, torch="torch.erf(a)"),
    Op("sin", unary_op("sin", "The sine elementwise (PyTorch's torch.sin; nan at +-inf)."),
       method=True, numpy=("sin",), torch="torch.sin(a)"),
    Op("cos", unary_op("cos", "The cosine elementwise (PyTorch's torch.cos)."),
       method=True, numpy=("cos",), torch="torch.cos(a)"),
    Op("tan", unary_op("tan", "The tangent elementwise (PyTorch's torch.tan; gradient 1 + "
                              "tan(x)^2)."),
       method=True, numpy=("tan",), torch="torch.tan(a)"),
    Op("asin", unary_op("asin", "The arcsine elementwise (torch.asin: nan outside [-1, 1], "
                                "gradient inf at +-1)."),
       method=True, numpy=("arcsin",), domain="unit", torch="torch.asin(a)"),
    Op("acos", unary_op("acos", "The arccosine elementwise (torch.acos: nan outside [-1, 1])."),
       method=True, numpy=("arccos",), domain="unit", torch="torch.acos(a)"),
    Op("atan", unary_op("atan", "The arctangent elementwise (PyTorch's torch.atan)."),
       method=True, numpy=("arctan",), torch="torch.atan(a)"),
    Op("sinh", unary_op("sinh", "The hyperbolic sine elementwise (PyTorch's torch.sinh)."),
       method=True, numpy=("sinh",), torch="torch.sinh(a)"),
    Op("cosh", unary_op("cosh", "The hyperbolic cosine elementwise (PyTorch's torch.cosh)."),
       method=True, numpy=("cosh",), torch="torch.cosh(a)"),
    Op("asinh", unary_op("asinh", "The inverse hyperbolic sine elementwise (PyTorch's "
                                  "torch.asinh)."),
       method=True, numpy=("arcsinh",), torch="torch.asinh(a)"),
    Op("acosh", unary_op("acosh", "The inverse hyperbolic cosine elementwise (torch.acosh: nan "
                                  "below 1; its gradient (x^2 - 1)^-1/2, as PyTorch's)."),
       method=True, numpy=("arccosh",), domain="above_one", torch="torch.acosh(a)"),
    Op("atanh", unary_op("atanh", "The inverse hyperbolic tangent elementwise (torch.atanh: +-inf "
                                  "at +-1, nan beyond)."),
       method=True, numpy=("arctanh",), domain="unit", torch="torch.atanh(a)"),
    Op("erfc", unary_op("erfc", "1 - erf(x) elementwise, without the cancellation (PyTorch's "
                                "torch.erfc)."),
       method=True, torch="torch.erfc(a)"),
    Op("exp2", unary_op("exp2", "2 ** x elementwise (PyTorch's torch.exp2)."),
       method=True, numpy=("exp2",), torch="torch.exp2(a)"),
    Op("log2", unary_op("log2", "The base-2 logarithm elementwise (PyTorch's torch.log2)."),
       method=True, numpy=("log2",), domain="positive", torch="torch.log2(a)"),
    Op("log10", unary_op("log10", "The base-10 logarithm elementwise (PyTorch's torch.log10)."),
       method=True, numpy=("log10",), domain="positive", torch="torch.log10(a)"),
    Op("log1p", unary_op("log1p", "log(1 + x) elementwise, exact for small x (PyTorch's "
                                  "torch.log1p)."),
       method=True, numpy=("log1p",), domain="positive", torch="torch.log1p(a)"),
    Op("expm1", unary_op("expm1", "exp(x) - 1 elementwise, exact for small x (PyTorch's "
                                  "torch.expm1)."),
       method=True, numpy=("expm1",), torch="torch.expm1(a)"),
    Op("rsqrt", unary_op("rsqrt", "1 / sqrt(x) elementwise (PyTorch's torch.rsqrt; inf at 0, nan "
                                  "below)."),
       method=True, domain="positive", torch="torch.rsqrt(a)"),
    Op("reciprocal", unary_op("reciprocal", "1 / x elementwise (PyTorch's torch.reciprocal; +-inf "
                                            "at +-0). NumPy's np.reciprocal on a tensor runs it "
                                            "(float only)."),
       method=True, numpy=("reciprocal",), torch="torch.reciprocal(a)"),
    Op("sign", unary_op("sign", "-1, 0 or 1 elementwise, with gradient 0 (PyTorch's torch.sign: 0 "
                                "at nan, where NumPy's np.sign gives nan)."),
       method=True, numpy=("sign",), torch="torch.sign(a)"),
    Op("floor", unary_op("floor", "The largest integer <= x elementwise (torch.floor; "
                                  "gradient 0)."),
       method=True, numpy=("floor",), torch="torch.floor(a)"),
    Op("ceil", unary_op("ceil", "The smallest integer >= x elementwise (torch.ceil; gradient 0)."),
       method=True, numpy=("ceil",), torch="torch.ceil(a)"),
    Op("trunc", unary_op("trunc", "x rounded toward zero elementwise (torch.trunc; gradient 0)."),
       method=True, numpy=("trunc",), torch="torch.trunc(a)"),
    Op("round", ew.round, method=True, numpy=("rint",), torch="torch.round(a)"),
    # --- activations of issue 30 (ops/activations.py: the ones with arguments)
    Op("elu", activations.elu, torch="F.elu(a, 0.7)", args=(0.7,)),
    Op("selu", activations.selu, torch="F.selu(a)"),
    # (alpha 1.5: PyTorch's celu backward rounds alpha to float32, see celu)
    Op("celu", activations.celu, torch="F.celu(a, 1.5)", args=(1.5,)),
    Op("hardtanh", activations.hardtanh, torch="F.hardtanh(a, -0.5, 0.8)", args=(-0.5, 0.8)),
    Op("relu6", activations.relu6, torch="F.relu6(a)"),
    # (F.hardsigmoid's gradient is float32's 1/6 even in float64: its kinks
    # are checked against it in tests/test_math_ops.py)
    Op("hardsigmoid", activations.hardsigmoid, torch="torch.clamp(a + 3, 0, 6) / 6"),
    Op("hardswish", activations.hardswish, torch="F.hardswish(a)"),
    Op("mish", activations.mish, torch="F.mish(a)"),
    Op("softsign", activations.softsign, torch="F.softsign(a)"),
    Op("logsigmoid", activations.logsigmoid, torch="F.logsigmoid(a)"),
    Op("quick_gelu", activations.quick_gelu, torch="a * torch.sigmoid(1.702 * a)"),
    # bitwise and logical: integer and bool tensors (ops/bitwise.py)
    Op("bitwise_and", bitwise.bitwise_and, method=True, operators=("__and__", "__rand__"),
       numpy=("bitwise_and",), integer=True),
    Op("bitwise_or", bitwise.bitwise_or, method=True, operators=("__or__", "__ror__"),
       numpy=("bitwise_or",), integer=True),
    Op("bitwise_xor", bitwise.bitwise_xor, method=True, operators=("__xor__", "__rxor__"),
       numpy=("bitwise_xor",), integer=True),
    Op("bitwise_not", bitwise.bitwise_not, method=True, operators=("__invert__",),
       numpy=("invert",), integer=True),
    Op("bitwise_left_shift", bitwise.bitwise_left_shift, method=True,
       operators=("__lshift__", "__rlshift__"), numpy=("left_shift",), integer=True),
    Op("bitwise_right_shift", bitwise.bitwise_right_shift, method=True,
       operators=("__rshift__", "__rrshift__"), numpy=("right_shift",), integer=True),
    Op("logical_and", bitwise.logical_and, method=True, numpy=("logical_and",), integer=True),
    Op("logical_or", bitwise.logical_or, method=True, numpy=("logical_or",), integer=True),
    Op("logical_xor", bitwise.logical_xor, method=True, numpy=("logical_xor",), integer=True),
    Op("logical_not", bitwise.logical_not, method=True, numpy=("logical_not",), integer=True),
    # --- reductions, scans and indexing of issue 30 (ops/scans.py, ops/vector_norm.py,
    # ops/selection.py; values and indices, scatters: tests/test_scans.py, test_scatter.py)
    Op("prod", scans.prod, method=True, torch="torch.prod(a, 1)", args=(1,)),
    Op("cumprod", scans.cumprod, method=True, torch="torch.cumprod(a, 1)", args=(1,)),
    Op("cummax", scans.cummax, method=True),
    Op("cummin", scans.cummin, method=True),
    Op("logcumsumexp", scans.logcumsumexp, method=True, torch="torch.logcumsumexp(a, 0)",
       args=(0,)),
    Op("norm", vector_norm.norm, method=True, torch="torch.norm(a, 3, 1)", args=(3, 1)),
    Op("scatter", selection.scatter, method=True),
    Op("scatter_add", selection.scatter_add, method=True),
    Op("scatter_reduce", selection.scatter_reduce, method=True),
    Op("masked_select", selection.masked_select, method=True,
       torch="torch.masked_select(a, torch.tensor([True, False, False, True]))",
       args=(np.array([True, False, False, True]),)),
    Op("unfold", selection.unfold, method=True, torch="a.unfold(1, 2, 1)", args=(1, 2, 1)),
    # (a new row goes here)
)

BY_NAME = {op.name: op for op in OPS}
# what linear applies with its GEMM: name -> kernel code (the codes' records)
ACTIVATIONS = matmul.ACTIVATIONS
# NumPy ufunc name -> the op that answers it on a tensor; other NumPy
# function name -> its op (ops/numpy_api.py adapts NumPy's arguments)
UFUNCS = {u: op.fn for op in OPS for u in op.numpy if isinstance(getattr(np, u, None), np.ufunc)}
FUNCTIONS = {f: op.fn for op in OPS for f in op.numpy if f not in UFUNCS}


def _operator(fn: Callable, dunder: str) -> Callable:
    if dunder in ("__neg__", "__invert__", "__abs__"):
        def run(self):
            return fn(self)
    elif dunder.startswith("__r") and dunder != "__rshift__":   # reflected: tensor on the right
        def run(self, other):
            return fn(other, self)
    else:
        def run(self, other):
            return fn(self, other)
    return run


def _method(fn: Callable) -> Callable:
    def run(self, *args, **kwargs):
        return fn(self, *args, **kwargs)
    return run


def _install(cls: type) -> None:
    """Give ``cls`` (Tensor) each row's operators and method."""
    for op in OPS:
        runs = [(d, _operator(op.fn, d)) for d in op.operators]
        runs += [(op.name, _method(op.fn))] if op.method else []
        for name, run in runs:
            run.__name__ = name
            run.__qualname__ = f"{cls.__name__}.{name}"
            run.__doc__ = op.fn.__doc__
            setattr(cls, name, run)


_install(Tensor)
