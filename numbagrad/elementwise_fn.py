"""``@ng.elementwise``: a scalar Python function as one fused, differentiable
elementwise op.

    @ng.elementwise
    def softplus(x, beta):
        z = beta * x
        if z > 20.0:
            return x
        return math.log1p(math.exp(z)) / beta

    y = softplus(t, 2.0)     # t a tensor (any shape), 2.0 a number: no gradient

The function's derivatives come from source-to-source forward-mode
differentiation of its AST (``numbagrad/_elementwise_ad.py``): exact, no
finite differences. The value and the tuple of partials are generated
scalar functions, compiled into two kernels per device and dtype:

* forward: ``out = f(x, y, ...)`` over the broadcast shape, one pass;
* backward: one pass over ``grad_out`` that computes every partial at each
  element and writes ``grad_out * df/dx_i`` for each input that needs a
  gradient, summed (in float64, in C order, as the built-in elementwise
  ops' backward) over the dims that input was broadcast along.

On the CPU they are ``@njit`` functions, on CUDA ``@cuda.jit`` kernels (the
backward: one thread per gradient element, which loops over the element's
broadcast dims). They are called through ``kernels.call_fn``, which tells
``ng.compile``'s recorder of the call as ``kernels.call`` does, so a
compiled step calls them from its generated code like a built-in kernel.
The kernels compile on first use (per dtype and, on CUDA, rank); the CPU
ones are cached on disk beside ``ng.compile``'s generated steps, in a module
named by the hash of its source.
"""
from __future__ import annotations

import functools
import hashlib
import math
import os
import threading
from typing import Any, Callable

import numpy as np

from . import _defaults, _dtypes, buffers, kernels
from ._elementwise_ad import HELPERS, SUPPORTED_MATH, Derived, ElementwiseError, derive
from .ops._common import (_number, _number_like, cast, ones, operand, reshaped, result,
                          scalar_of)
from .ops.elementwise import _merged
from .tape import Node, _Backward
from .tensor import Tensor

__all__ = ["ElementwiseError", "ElementwiseFunction", "elementwise"]

_lock = threading.Lock()


# ------------------------------------------------------------ CPU sources
_CPU_OFFSET = '''
@_jit
def _offset(idx, shape):
    k = 0
    for d in range(len(idx)):
        k = k * shape[d] + (0 if shape[d] == 1 else idx[d])
    return k * shape[-1]
'''


def _cpu_source(d: Derived) -> str:
    """The CPU module: the scalar functions, ``forward`` and ``backward``."""
    n = len(d.args)
    ins = ", ".join(f"a{i}" for i in range(n))
    fwd = ["@_kernel", f"def forward({ins}, out):", "    if out.size == 0:", "        return",
           "    shape = out.shape"]
    fwd += [f"    b{i} = np.broadcast_to(a{i}, shape)" for i in range(n)]
    fwd += ["    n = shape[-1]", "    for idx in np.ndindex(shape[:-1]):"]
    fwd += [f"        r{i} = b{i}[idx]" for i in range(n)]
    fwd += ["        ro = out[idx]", "        for j in range(n):",
            f"            ro[j] = _value({', '.join(f'r{i}[j]' for i in range(n))})"]
    dests = ", ".join(f"d{i}, beta{i}, need{i}" for i in range(n))
    bwd = ["@_kernel", f"def backward({ins}, g, {dests}):", "    shape = g.shape"]
    for i in range(n):
        bwd += [f"    b{i} = np.broadcast_to(a{i}, shape)",
                f"    full{i} = need{i} and d{i}.shape == shape",
                f"    acc{i} = np.zeros(d{i}.size if need{i} and not full{i} else 0, np.float64)",
                f"    f{i} = d{i}.reshape(d{i}.size)"]
    bwd += ["    if g.size:", "        n = shape[-1]",
            "        for idx in np.ndindex(shape[:-1]):", "            gr = g[idx]"]
    for i in range(n):
        bwd += [f"            r{i} = b{i}[idx]",
                f"            o{i} = _offset(idx, d{i}.shape)",
                f"            l{i} = d{i}.shape[-1] == 1"]
    bwd += ["            for j in range(n):",
            f"                p = _partials({', '.join(f'r{i}[j]' for i in range(n))})",
            "                gv = gr[j]"]
    for i in range(n):
        bwd += [f"                if need{i}:",
                f"                    v = gv * p[{i}]",
                f"                    if full{i}:",
                f"                        k = o{i} + j",
                f"                        f{i}[k] = v if beta{i} == 0 else v + beta{i} * f{i}[k]",
                "                    else:",
                f"                        acc{i}[o{i} if l{i} else o{i} + j] += v"]
    for i in range(n):
        bwd += [f"    if need{i} and not full{i}:", f"        for k in range(f{i}.size):",
                f"            f{i}[k] = acc{i}[k] if beta{i} == 0 else acc{i}[k] + "
                f"beta{i} * f{i}[k]"]
    return "\n\n".join([_jitted(HELPERS), _CPU_OFFSET, "@_jit\n" + d.value_source,
                        "@_jit\n" + d.partials_source, "\n".join(fwd), "\n".join(bwd),
                        *_cpu_threaded(n)]) + "\n"


_BLOCK = 4096   # columns per task of a threaded kernel


def _cpu_threaded(n: int) -> list[str]:
    """The threaded twins, for 2-D operands: ``forward_mt``, and
    ``backward_mt`` for gradients that are not summed over broadcast dims
    (the caller's choice). Each task is one row's block of columns, computed
    with the serial kernels' per-element expressions, so the bits are theirs."""
    ins = ", ".join(f"a{i}" for i in range(n))
    head = ["    rows, n = {o}.shape", f"    nb = (n + {_BLOCK - 1}) // {_BLOCK}"]
    head += [f"    b{i} = np.broadcast_to(a{i}, {{o}}.shape)" for i in range(n)]
    head += ["    for t in prange(rows * nb):", "        i = t // nb",
             f"        c0 = (t % nb) * {_BLOCK}", f"        c1 = min(c0 + {_BLOCK}, n)",
             "        for j in range(c0, c1):"]
    at = ", ".join(f"b{i}[i, j]" for i in range(n))
    fwd = ["@_kernel_mt", f"def forward_mt({ins}, out):"] + [h.format(o="out") for h in head]
    fwd += [f"            out[i, j] = _value({at})"]
    dests = ", ".join(f"d{i}, beta{i}, need{i}" for i in range(n))
    bwd = ["@_kernel_mt", f"def backward_mt({ins}, g, {dests}):"]
    bwd += [h.format(o="g") for h in head]
    bwd += [f"            p = _partials({at})", "            gv = g[i, j]"]
    for i in range(n):
        bwd += [f"            if need{i}:", f"                v = gv * p[{i}]",
                f"                d{i}[i, j] = v if beta{i} == 0 else v + beta{i} * d{i}[i, j]"]
    return ["\n".join(fwd), "\n".join(bwd)]


def _jitted(source: str) -> str:
    """``source``'s top-level functions decorated with ``@_jit``."""
    return source.replace("\ndef ", "\n@_jit\ndef ")


_CPU_HEAD = '''"""Generated by ng.elementwise; do not edit (its name is its source's hash)."""
import math

import numpy as np
from numba import njit, prange

_T = np.{dtype}
_CACHE = True
_jit = njit(cache=_CACHE, error_model="numpy")
_kernel = njit(cache=_CACHE, error_model="numpy")
_kernel_mt = njit(cache=_CACHE, error_model="numpy", parallel=True)
'''


def _cpu_module(source: str) -> dict:
    """The namespace of the generated CPU module ``source``: run from a file
    named by its hash in ng.compile's private cache folder (``cache_dir``), so
    that Numba caches its kernels on disk (a changed function is another
    source, hence another file: nothing stale is reused), or from memory,
    uncached, when no such folder is usable."""
    from .compile import cache
    name = f"ngelem_{hashlib.sha256(source.encode()).hexdigest()[:20]}"
    folder = cache.cache_dir()
    path = os.path.join(folder, name + ".py")
    try:
        if cache._folder_problem(folder) is None and cache._check_or_write(path, source):
            return cache._exec(name, source, path).__dict__
    except OSError:
        pass
    return cache._exec(name, source.replace("_CACHE = True", "_CACHE = False")).__dict__


# ----------------------------------------------------------- CUDA sources
def _cuda_source(d: Derived, rank: int) -> str:
    """The CUDA module for operands of ``rank`` dims: device functions,
    ``forward`` (one thread per output element) and ``backward`` (one per
    element of each gradient that is wanted, its broadcast dims summed in
    C order in float64)."""
    n = len(d.args)
    ins = ", ".join(f"a{i}" for i in range(n))

    def unflatten(shape: str, flat: str, prefix: str, pad: str) -> list[str]:
        out = [f"{pad}r = {flat}"]
        for k in range(rank - 1, 0, -1):
            out += [f"{pad}{prefix}{k} = r % {shape}[{k}]", f"{pad}r //= {shape}[{k}]"]
        return out + [f"{pad}{prefix}0 = r"]

    def read(i: int) -> str:
        return f"a{i}[" + ", ".join(f"0 if a{i}.shape[{k}] == 1 else i{k}"
                                    for k in range(rank)) + "]"

    at = ", ".join(f"i{k}" for k in range(rank))
    fwd = [f"def forward({ins}, out):", "    k = cuda.grid(1)", "    stride = cuda.gridsize(1)",
           "    while k < out.size:"]
    fwd += unflatten("out.shape", "k", "i", "        ")
    fwd += [f"        out[{at}] = _value({', '.join(read(i) for i in range(n))})",
            "        k += stride"]
    dests = ", ".join(f"d{i}, beta{i}, need{i}" for i in range(n))
    bwd = [f"def backward({ins}, g, {dests}):"]
    bwd += [f"    n{i} = d{i}.size if need{i} else 0" for i in range(n)]
    bwd += ["    k = cuda.grid(1)", "    stride = cuda.gridsize(1)",
            f"    while k < {' + '.join(f'n{i}' for i in range(n))}:", "        s = k"]
    for i in range(n):
        pad = "            "
        bwd += [f"        if s >= 0 and s < n{i}:"]
        bwd += unflatten(f"d{i}.shape", "s", "j", pad)
        bwd += [f"{pad}m = 1"]
        for k in range(rank):
            bwd += [f"{pad}if d{i}.shape[{k}] == 1:", f"{pad}    m *= g.shape[{k}]"]
        bwd += [f"{pad}acc = 0.0", f"{pad}for t in range(m):", f"{pad}    q = t"]
        for k in range(rank - 1, -1, -1):
            bwd += [f"{pad}    if d{i}.shape[{k}] == 1:", f"{pad}        i{k} = q % g.shape[{k}]",
                    f"{pad}        q //= g.shape[{k}]", f"{pad}    else:",
                    f"{pad}        i{k} = j{k}"]
        bwd += [f"{pad}    p = _partials({', '.join(read(j) for j in range(n))})",
                f"{pad}    acc += g[{at}] * p[{i}]"]
        dat = ", ".join(f"j{k}" for k in range(rank))
        bwd += [f"{pad}if beta{i} == 0:", f"{pad}    d{i}[{dat}] = acc", f"{pad}else:",
                f"{pad}    d{i}[{dat}] = acc + beta{i} * d{i}[{dat}]"]
        bwd += [f"        s -= n{i}"]
    bwd += ["        k += stride"]
    return "\n\n".join([_jitted(HELPERS), "@_jit\n" + d.value_source,
                        "@_jit\n" + d.partials_source, "\n".join(fwd), "\n".join(bwd)]) + "\n"


class _CudaLauncher:
    """A generated CUDA kernel as a destination-passing callable: launches it
    over ``size(args)`` threads (the recorded ``fn`` of a CUDA replay)."""

    def __init__(self, kernel: Any, size: Callable) -> None:
        self.kernel, self.size = kernel, size

    def __call__(self, *args: Any) -> None:
        from .kernels.cuda._core import THREADS, grid
        n = self.size(args)
        if n:
            self.kernel[grid(n), THREADS](*args)


# --------------------------------------------------------------- the op
class ElementwiseFunction:
    """A scalar function made an elementwise op by ``ng.elementwise``: call it
    on tensors, arrays and numbers (broadcast together)."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.derived = derive(fn)     # raises ElementwiseError on what it cannot compile
        self.nargs = len(self.derived.args)
        self.op_name = self.derived.name
        self._cpu_text = _cpu_source(self.derived)
        self._compiled: dict[tuple, tuple] = {}
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<ng.elementwise {self.op_name}({', '.join(self.derived.args)})>"

    def kernels(self, kern: Any, dtype: np.dtype, rank: int) -> tuple:
        """(forward, backward, forward_mt, backward_mt) for ``kern``'s device and
        ``dtype`` (the threaded twins: CPU only, else None)."""
        key = (kern.name, dtype.str, rank if kern.name != "cpu" else 0)
        pair = self._compiled.get(key)
        if pair is None:
            with _lock:
                pair = self._compiled.get(key)
                if pair is None:
                    pair = self._compiled[key] = self._compile(kern.name, dtype, rank)
        return pair

    def _compile(self, device: str, dtype: np.dtype, rank: int) -> tuple:
        if device == "cpu":
            space = _cpu_module(_CPU_HEAD.format(dtype=dtype.name) + self._cpu_text)
            return space["forward"], space["backward"], space["forward_mt"], space["backward_mt"]
        from numba import cuda
        space = {"math": math, "np": np, "_T": dtype.type, "cuda": cuda,
                 "_jit": cuda.jit(device=True)}
        code = compile(_cuda_source(self.derived, rank),
                       f"<ng.elementwise {self.op_name} {device} {dtype}>", "exec")
        exec(code, space)   # noqa: S102 (generated from the checked AST of the function)
        n = self.nargs
        fwd = _CudaLauncher(cuda.jit(space["forward"]), lambda args: args[n].size)
        bwd = _CudaLauncher(cuda.jit(space["backward"]), lambda args: sum(
            args[n + 1 + 3 * i].size for i in range(n) if args[n + 3 + 3 * i]))
        return fwd, bwd, None, None

    def __call__(self, *args: Any) -> Tensor:
        name = self.op_name
        if len(args) != self.nargs:
            raise TypeError(f"{name}: takes {self.nargs} argument"
                            f"{'s' * (self.nargs != 1)} ({', '.join(self.derived.args)}), "
                            f"got {len(args)}")
        if all(_number(a) for a in args):
            raise TypeError(f"{name}: at least one argument must be a tensor or an array "
                            f"(got only numbers: {args!r}); call the function itself for "
                            "numbers")
        want = _dtypes.result_type(*(a if isinstance(a, Tensor) or _number(a)
                                     else np.asarray(a) for a in args))
        if want.kind != "f":
            want = _defaults.get_default_dtype()
        tensors = [None if _number(a) else operand(a, name, f"argument {self.derived.args[i]!r}")
                   for i, a in enumerate(args)]
        kern = next(t._kern for t in tensors if t is not None)
        for i, t in enumerate(tensors):
            if t is not None and t._kern is not kern:
                first = next(j for j, u in enumerate(tensors) if u is not None)
                raise ValueError(f"{name}: arguments are on different devices: "
                                 f"{self.derived.args[first]!r} on {tensors[first].device}, "
                                 f"{self.derived.args[i]!r} on {t.device}")
        shapes = [() if t is None else tuple(t.shape) for t in tensors]
        try:
            shape = tuple(np.broadcast_shapes(*shapes))
        except ValueError:
            raise ValueError(f"{name}: shapes " + ", ".join(
                f"{a} {s}" for a, s in zip(self.derived.args, shapes))
                + " cannot be broadcast together") from None
        inputs = tuple(cast(t, want) if t is not None else _number_like(a, want, kern)
                       for t, a in zip(tensors, args))
        out = buffers.take(kern, shape, want)
        full, views = _merged(kern, shape, tuple(t._data for t in inputs))
        fns = self.kernels(kern, want, len(full))
        threaded = _threaded(kern, full)
        kernels.call_fn(fns[2] if threaded else fns[0], f"elementwise{'_mt' * threaded}:{name}",
                        *views, reshaped(out, full))
        return result(out, kern, inputs, _backward, (self, tuple(views), full, fns))


def _threaded(kern: Any, full: tuple) -> bool:
    """Whether the threaded twins run on operands of merged shape ``full``:
    2-D, at least ``MT_MIN`` elements, on the CPU, while the thread governor
    allows threads (a recording forces them on; a compiled step then always
    runs the threaded twin, as recorded)."""
    if kern.name != "cpu" or len(full) != 2 or math.prod(full) < kern.MT_MIN:
        return False
    from .kernels.cpu._threads import ALLOWED
    return bool(ALLOWED[0])


def _backward(ctx: _Backward, node: Node, gout: Any) -> None:
    op, views, full, fns = node.saved
    inputs = node.inputs
    kern = inputs[0]._kern
    dtype = views[0].dtype
    g = gout if gout is not None else ones(kern, full, dtype)
    g2 = reshaped(g, full)
    wanted = [i for i, t in enumerate(inputs) if t.requires_grad]
    if len({id(inputs[i]) for i in wanted}) == len(wanted):
        groups = [wanted]
    else:   # a tensor passed twice: its gradients land in one array, one at a time
        groups = [[i] for i in wanted]
    zero = scalar_of(dtype, 0.0)
    # threaded only where no gradient sums over broadcast dims (those sums
    # keep the serial kernel's one order)
    threaded = _threaded(kern, full) and all(views[i].shape == full for i in wanted)
    backward, name = (fns[3], "elementwise_backward_mt") if threaded else \
        (fns[1], "elementwise_backward")
    for group in groups:
        args: list[Any] = [*views, g2]
        for i in range(len(inputs)):
            if i in group:
                dest, beta = ctx.dest(inputs[i])
                args += [reshaped(dest, views[i].shape), scalar_of(dtype, beta), True]
            else:
                args += [g2, zero, False]
        kernels.call_fn(backward, f"{name}:{op.op_name}", *args)


def elementwise(fn: Callable) -> ElementwiseFunction:
    """Make the scalar function ``fn(x, y, ...)`` an elementwise op on
    tensors: its arguments broadcast together (NumPy's rules; Python numbers
    allowed, with no gradient), it computes in their promoted float dtype
    (``ng.result_type``; integers in the default float), on the tensors'
    device, on the tape and under ``ng.compile``, as one fused kernel
    forward and one backward.

    ``fn`` may use ``+ - * / **``, unary minus, comparisons, ``if``/``else``
    (statements and conditional expressions), assignments to local names,
    ``min``/``max``/``abs`` (PyTorch's ``maximum``/``minimum``/``abs``: nan
    wins, ties split the gradient, sign 0 at 0), numbers from its globals or
    closure, math's constants and these ``math`` functions: {math}.
    Anything else (a loop, a call to another function, a closure over a
    non-number, a lambda whose source cannot be read) raises
    ``ElementwiseError`` (a TypeError) here, naming the construct and its line.

    Its derivatives are exact: source-to-source forward-mode differentiation
    of its AST (the ``if`` taken is differentiated, comparisons have zero
    derivative); no finite differences. The backward recomputes the
    function's intermediate values rather than storing them."""
    return ElementwiseFunction(fn)


elementwise.__doc__ = elementwise.__doc__.format(math=", ".join(SUPPORTED_MATH))
