"""``ng.custom_op``: the user's own Numba kernels as a differentiable op.

    @njit
    def forward(out, x, s):               # out = s * x**2
        for i in range(x.size):
            out.flat[i] = s * x.flat[i] ** 2

    @njit
    def backward(gout, out, x, s, gx):     # gx += gout * d out / d x
        for i in range(x.size):
            gx.flat[i] += gout.flat[i] * 2.0 * s * x.flat[i]

    scaled_square = ng.custom_op("scaled_square", forward, backward)
    y = scaled_square(x, 0.5)

The kernels are destination-passing, as the package's own: the forward
writes ``out``; the backward ADDS into the gradient buffers, which come
zeroed or are the accumulators themselves, so a param's gradient
accumulates exactly as the built-in ops' do. Both run through
``kernels.call_fn``, so ``ng.compile`` records them and its generated
@njit step calls the user's compiled code by address, with no Python in
between (a CUDA step replays the launches).
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
from numba.core.errors import TypingError
from numba.core.registry import CPUDispatcher

from . import buffers, kernels, tape
from .ops._common import contiguous, contiguous_array, ones, operand, result
from .tape import Node, _Backward
from .tensor import Tensor

__all__ = ["CustomOp", "custom_op"]

# what an op passes its kernels as a scalar (no gradient); anything else is a tensor input
_SCALARS = (bool, int, float, np.bool_, np.integer, np.floating)


def _arity(fn: Callable) -> int | None:
    """The number of positional parameters of a kernel's Python function,
    None when it takes ``*args`` (or has no readable signature)."""
    try:
        params = inspect.signature(getattr(fn, "py_func", fn)).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _is_njit(fn: Any) -> bool:
    return isinstance(fn, CPUDispatcher)


def _is_cuda_kernel(fn: Any) -> bool:
    """A ``@cuda.jit`` kernel (numba-cuda's dispatcher or the simulator's):
    launchable with ``kernel[blocks, threads]``, and not an @njit function."""
    return (not _is_njit(fn) and hasattr(fn, "py_func") and callable(fn)
            and hasattr(type(fn), "__getitem__"))


def _what(fn: Any) -> str:
    return f"{type(fn).__name__} {getattr(fn, '__name__', '')!s}".strip()


class _Launch:
    """A CUDA kernel's host launcher, one per op and direction (so that
    ``ng.compile`` sees the same function on every call): called as
    ``launch(blocks, threads, *kernel_args)``."""

    __slots__ = ("kernel", "__name__")

    def __init__(self, kernel: Any, name: str) -> None:
        self.kernel = kernel
        self.__name__ = name

    def __call__(self, blocks: Any, threads: Any, *args: Any) -> None:
        self.kernel[blocks, threads](*args)


class CustomOp:
    """An op made by ``custom_op``: call it with tensors (any rank, either
    device) and Python numbers; see ``custom_op``."""

    def __init__(self, name: str, forward: Any, backward: Any, out_shape: Any, out_dtype: Any,
                 cuda_forward: Any, cuda_backward: Any) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"custom_op: name must be a non-empty string, got {name!r}")
        self.name = name
        self.forward, self.backward = forward, backward
        self.out_shape, self.out_dtype = out_shape, out_dtype
        if out_shape is not None and not callable(out_shape):
            raise TypeError(f"custom_op {name!r}: out_shape must be a function of the tensor "
                            f"inputs' shapes, got {out_shape!r}")
        if out_dtype is not None:
            try:              # a dtype (np.float32 is one, though callable), else a function
                out_dtype = np.dtype(out_dtype)
            except TypeError:
                if not callable(out_dtype):
                    raise TypeError(f"custom_op {name!r}: out_dtype must be a dtype or a "
                                    f"function of the inputs' dtypes, got {out_dtype!r}") \
                        from None
        self._out_dtype = out_dtype
        # what ng.compile's recordings call the kernels (on either device)
        self._fwd_name, self._bwd_name = f"custom:{name}", f"custom:{name}.backward"
        for what, fn in (("forward", forward), ("backward", backward)):
            if fn is not None and not _is_njit(fn):
                hint = (f"; a @cuda.jit kernel goes in cuda_{what}=" if _is_cuda_kernel(fn)
                        else "; decorate it with @numba.njit")
                raise TypeError(f"custom_op {name!r}: {what} must be an @njit function (a "
                                f"Numba CPU dispatcher), got {_what(fn)}{hint}")
        self._cuda = [self._cuda_kernel(k, what) for what, k in
                      (("cuda_forward", cuda_forward), ("cuda_backward", cuda_backward))]
        if forward is None and self._cuda[0] is None:
            raise TypeError(f"custom_op {name!r}: a forward kernel is needed (forward=, "
                            f"cuda_forward= or both)")
        self._check_arities(forward, backward, cuda_forward, cuda_backward)

    # ------------------------------------------------------------ definition checks
    def _cuda_kernel(self, spec: Any, what: str) -> tuple | None:
        """(launcher, geometry or None) of a ``cuda_*`` argument."""
        if spec is None:
            return None
        kernel, geometry = spec if isinstance(spec, tuple) and len(spec) == 2 else (spec, None)
        if not _is_cuda_kernel(kernel):
            hint = "; an @njit function goes in forward=/backward=" if _is_njit(kernel) else ""
            raise TypeError(f"custom_op {self.name!r}: {what} must be a @cuda.jit kernel or "
                            f"(kernel, launch) with launch(out_shape, *input_shapes) -> "
                            f"(blocks, threads), got {_what(kernel)}{hint}")
        if geometry is not None and not callable(geometry):
            raise TypeError(f"custom_op {self.name!r}: {what}'s launch must be a function "
                            f"(out_shape, *input_shapes) -> (blocks, threads), got "
                            f"{geometry!r}")
        name = self._fwd_name if what == "cuda_forward" else self._bwd_name
        return _Launch(kernel, name), geometry

    def _check_arities(self, *fns: Any) -> None:
        """The kernels' parameter counts, where they can be read: the forwards
        take (out, *inputs), the backwards (grad_out, out, *inputs, *grads)
        with one grad per tensor input, so 1 to len(inputs) of them."""
        names = ("forward", "backward", "cuda_forward", "cuda_backward")
        counts = [None if fn is None else _arity(fn[0] if isinstance(fn, tuple) else fn)
                  for fn in fns]
        fwd = [(n, c) for n, c in zip(names[::2], counts[::2]) if c is not None]
        bwd = [(n, c) for n, c in zip(names[1::2], counts[1::2]) if c is not None]
        for group in (fwd, bwd):
            if len(group) == 2 and group[0][1] != group[1][1]:
                raise TypeError(f"custom_op {self.name!r}: {group[0][0]} takes {group[0][1]} "
                                f"arguments and {group[1][0]} {group[1][1]}; they must match")
        self._nargs = self._ngrads = None
        if fwd:
            what, k = fwd[0]
            if k < 2:
                raise TypeError(f"custom_op {self.name!r}: {what} must take (out, *inputs), "
                                f"at least 2 arguments; it takes {k}")
            self._nargs = k - 1
        if bwd:
            what, b = bwd[0]
            if b < 4:
                raise TypeError(f"custom_op {self.name!r}: {what} must take (grad_out, out, "
                                f"*inputs, *grads), at least 4 arguments; it takes {b}")
            if self._nargs is not None:
                n = self._nargs
                if not 1 <= b - 2 - n <= n:
                    raise TypeError(
                        f"custom_op {self.name!r}: forward takes out and {n} input(s), so "
                        f"{what} must take grad_out, out, those {n} input(s) and one grad "
                        f"buffer per tensor input ({n + 3} to {2 * n + 2} arguments); it "
                        f"takes {b}")
                self._ngrads = b - 2 - n

    def __repr__(self) -> str:
        devices = [d for d, k in (("cpu", self.forward), ("cuda", self._cuda[0])) if k is not None]
        grad = "differentiable" if self.backward is not None or self._cuda[1] else "no backward"
        return f"ng.custom_op({self.name!r}, {'/'.join(devices)}, {grad})"

    # ------------------------------------------------------------ the call
    def __call__(self, *args: Any) -> Tensor:
        nargs = self._nargs
        if nargs is not None and len(args) != nargs:
            raise TypeError(f"custom_op {self.name!r} takes {nargs} input(s) (its forward's "
                            f"arguments after out), got {len(args)}")
        tensors: list[Tensor] = []
        cargs: list[Any] = []        # what the kernels get after out: arrays and numbers
        for a in args:
            if type(a) is not Tensor:
                if isinstance(a, _SCALARS):
                    cargs.append(a)
                    continue
                a = operand(a, self.name, f"input {len(tensors)}", ints=True)
            tensors.append(a)
            cargs.append(contiguous(a))
        if not tensors:
            raise TypeError(f"custom_op {self.name!r}: needs at least one tensor input, got "
                            f"only numbers {args!r}")
        first = tensors[0]
        kern, data = first._kern, first._data
        on_cuda = kern.name == "cuda"
        fwd = self._cuda[0] if on_cuda else self.forward
        grad = False
        if tape._state.box[0] > 0:
            for t in tensors:
                if t.requires_grad:
                    grad = True
                    break
        if fwd is None or len(tensors) > 1 or (grad and (
                self._cuda[1] if on_cuda else self.backward) is None) or (
                self._ngrads is not None and len(tensors) != self._ngrads):
            self._check_call(kern, on_cuda, tensors, grad)
        out = buffers.take(kern, data.shape if self.out_shape is None else self._shape(tensors),
                           data.dtype if self._out_dtype is None else self._dtype(tensors))
        if out.size:
            if on_cuda:
                self._launch(0, out, cargs, (out, *cargs))
            else:
                try:
                    returned = kernels.call_fn(fwd, self._fwd_name, out, *cargs)
                except TypingError as exc:
                    raise self._typing_error("forward", (out, *cargs), exc) from exc
                if returned is not None:
                    raise self._returned("forward", returned)
        return result(out, kern, tuple(tensors), _custom_backward, (self, tuple(cargs), out))

    def _check_call(self, kern: Any, on_cuda: bool, tensors: list, grad: bool) -> None:
        """What must hold before anything runs: one device, a kernel for it,
        a backward when an input needs a gradient, one grad per tensor input."""
        name = self.name
        for t in tensors:
            if t._kern is not kern:
                raise ValueError(f"custom_op {name!r}: inputs on different devices "
                                 f"({', '.join(t.device for t in tensors)})")
        if (self._cuda[0] if on_cuda else self.forward) is None:
            given = "cuda_forward=" if on_cuda else "forward="
            raise TypeError(f"custom_op {name!r} has no {kern.name} kernel: its inputs are on "
                            f"{kern.name!r}; pass {given} to custom_op (or move the inputs "
                            f"with .to({'cpu' if on_cuda else 'cuda'!r}))")
        if grad and (self._cuda[1] if on_cuda else self.backward) is None:
            given = "cuda_backward=" if on_cuda else "backward="
            raise TypeError(f"custom_op {name!r} has no {kern.name} backward ({given}) and an "
                            f"input requires a gradient; define one, or call the op under "
                            f"ng.no_grad() / on inputs that need no gradient")
        if self._ngrads is not None and len(tensors) != self._ngrads:
            raise TypeError(f"custom_op {name!r}: its backward takes {self._ngrads} grad "
                            f"buffer(s), one per tensor input, but the call has "
                            f"{len(tensors)} tensor input(s) (the other inputs are numbers)")

    def _shape(self, tensors: list) -> tuple:
        shape = self.out_shape(*(tuple(t._data.shape) for t in tensors))
        try:
            shape = tuple(int(n) for n in shape)
            if any(n < 0 for n in shape):
                raise ValueError
        except (TypeError, ValueError):
            raise ValueError(f"custom_op {self.name!r}: out_shape returned {shape!r}, not a "
                             f"tuple of non-negative ints") from None
        return shape

    def _dtype(self, tensors: list) -> np.dtype:
        dtype = self._out_dtype
        return np.dtype(dtype(*(t._data.dtype for t in tensors)) if callable(dtype) else dtype)

    def _run(self, fn: Any, name: str, what: str, args: tuple) -> None:
        """One CPU kernel call, its typing errors and a returned value named."""
        try:
            returned = kernels.call_fn(fn, name, *args)
        except TypingError as exc:
            raise self._typing_error(what, args, exc) from exc
        if returned is not None:
            raise self._returned(what, returned)

    def _typing_error(self, what: str, args: tuple, exc: Exception) -> TypeError:
        types = ", ".join(_describe(a) for a in args)
        return TypeError(f"custom_op {self.name!r}: Numba could not compile {what} for "
                         f"({types}): {str(exc).strip().splitlines()[0]}")

    def _returned(self, what: str, value: Any) -> TypeError:
        return TypeError(f"custom_op {self.name!r}: {what} returned a value "
                         f"({type(value).__name__}); kernels write into their out / grad "
                         f"buffers and return nothing")

    def _launch(self, which: int, out: Any, cargs: tuple, args: tuple) -> None:
        """One CUDA launch: ``launch(out_shape, *input_shapes)``'s geometry, or
        one thread per element of ``out`` (the backward: of grad_out)."""
        launcher, geometry = self._cuda[which]
        if geometry is None:
            threads = kernels.get("cuda").THREADS
            blocks = -(-out.size // threads)
        else:
            blocks, threads = geometry(tuple(out.shape), *(tuple(a.shape) for a in cargs
                                                           if not isinstance(a, _SCALARS)))
        kernels.call_fn(launcher, launcher.__name__, blocks, threads, *args)


def _describe(a: Any) -> str:
    return f"{a.dtype}{list(a.shape)}" if hasattr(a, "shape") else type(a).__name__


def _custom_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    """backward(grad_out, out, *inputs, *grads): each grad buffer zeroed (or a
    param's accumulator, added into), a zeroed scratch one for an input
    that needs no gradient."""
    op, cargs, out = node.saved
    kern = node.inputs[0]._kern
    g = ones(kern, out.shape, out.dtype) if gout is None else contiguous_array(kern, gout)
    grads = []
    for t in node.inputs:
        if t.requires_grad:
            dest, beta = ctx.dest(t)
        else:
            dest, beta = buffers.take(kern, t._data.shape, t._data.dtype), 0.0
        if beta == 0.0:
            kernels.call(kern, "fill", 0, dest, 0.0)
        grads.append(dest)
    if not out.size:
        return
    args = (g, out, *cargs, *grads)
    if kern.name == "cuda":
        op._launch(1, out, cargs, args)
    else:
        op._run(op.backward, op._bwd_name, "backward", args)


def custom_op(name: str, forward: Callable | None, backward: Callable | None = None, *,
              out_shape: Callable[..., tuple] | None = None, out_dtype: Any = None,
              cuda_forward: Any = None, cuda_backward: Any = None) -> CustomOp:
    """Your own Numba kernels as a differentiable op (PyTorch's
    ``torch.library.custom_op`` with its ``register_autograd``).

    ``op = ng.custom_op(name, forward, backward)``; ``y = op(x, w, 0.5)``.
    Arguments that are Python or NumPy numbers reach the kernels as scalars
    (no gradient: a float as float64, an int as int64); every other one is a
    tensor input (arrays and lists are made tensors, integer tensors kept),
    passed as a C-contiguous array of its shape, in the order given.

    * ``forward(out, *inputs)``: an ``@njit`` function that writes the output
      ``out`` (shape ``out_shape(*shapes)`` of the tensor inputs' shapes,
      default the first's; dtype ``out_dtype``, a dtype or a function of
      their dtypes, default the first's) and returns nothing.
    * ``backward(grad_out, out, *inputs, *grads)``: an ``@njit`` function that
      ADDS each tensor input's gradient into its buffer in ``grads`` (one
      per tensor input, of its shape and dtype, zeroed or holding the
      gradient so far: add, never assign). An input that needs no gradient
      still gets a (scratch) buffer. None makes a forward-only op, which
      raises when an input needs a gradient on the tape.
    * ``cuda_forward``/``cuda_backward``: ``@cuda.jit`` kernels with the same
      arguments for tensors on "cuda". numbagrad launches one thread per
      element of ``out`` (the backward: of ``grad_out``), a 1-D grid of
      ``kernels.get("cuda").THREADS`` threads a block, so ``i =
      cuda.grid(1)`` with ``if i < out.size`` is an element's flat index; or
      pass ``(kernel, launch)`` with ``launch(out_shape, *input_shapes)``
      returning ``(blocks, threads)``. A gradient several threads add into
      needs ``cuda.atomic.add``.

    Inputs of any rank; the op records on the tape, runs under
    ``ng.compile`` (the generated step calls the compiled kernels
    themselves: kernels defined in ``__main__`` or a notebook work, and a
    kernel whose source changed is the new one, as the step's cache holds
    no kernel code) and is checked by ``ng.gradcheck``. Bad kernels fail
    at definition (not Numba functions, parameter counts that cannot fit)
    or on the first call, before anything runs (no kernel for the inputs'
    device, no backward for an input that needs a gradient, a call with
    the wrong number of inputs); Numba's typing errors and a kernel that
    returns a value raise a TypeError naming the op.
    """
    return CustomOp(name, forward, backward, out_shape, out_dtype, cuda_forward, cuda_backward)
