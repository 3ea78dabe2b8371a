"""Functional gradients, JAX's API: ``ng.grad``, ``ng.value_and_grad``, ``ng.vjp``.

    dloss_dw = ng.grad(loss_fn)(w, x)                  # gradient w.r.t. argument 0
    (loss, aux), (gw, gx) = ng.value_and_grad(f, argnums=(0, 1), has_aux=True)(w, x)
    out, vjp_fn = ng.vjp(f, x, y); gx, gy = vjp_fn(cotangent)

The differentiated arguments are Tensors or NumPy arrays (or Python floats)
of float32/float64. Each becomes a fresh leaf sharing its data, ``f`` runs
on the tape, and a reverse pass over what ``f`` recorded collects the
leaves' gradients: a Tensor argument's gradient comes back as a Tensor on its
device, a NumPy array's (or a number's) as a NumPy array (numbagrad computes
it on the CPU). No param's ``.grad`` changes: a param passed as an argument
gets its gradient returned, a param ``f`` closes over is a constant (as every
argument not in ``argnums``). Results are off the tape (no graph), inside
or outside ``ng.grad_tape()``. numbagrad's backward kernels are not
recorded, so a gradient cannot be differentiated again: ``grad(grad(f))``
raises ``NotImplementedError`` instead of returning a wrong zero.
"""
from __future__ import annotations

import functools
import operator
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import _subgraph, kernels
from ._defaults import get_default_dtype
from .ops._common import ones
from .tape import _Backward, _check_unmodified, grad_tape, output
from .tensor import Tensor, _writes

__all__ = ["grad", "value_and_grad", "vjp"]


class _Active(threading.local):
    """This thread's running transforms: the leaves each one differentiates."""

    def __init__(self) -> None:
        self.stack: list[list[Tensor]] = []


_active = _Active()


def grad(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """``jax.grad``: a function returning the gradient of ``f`` (a 0-d float
    Tensor result) w.r.t. argument ``argnums`` (an int: one gradient; a
    tuple: a tuple of them), with ``has_aux`` ``(gradients, aux)``."""
    nums = _check_argnums(argnums, "grad")
    _check_callable(f, "grad")

    @functools.wraps(f)
    def grad_f(*args: Any, **kwargs: Any) -> Any:
        _, aux, grads = _value_and_grad(f, args, kwargs, nums, argnums, has_aux, "grad")
        return (grads, aux) if has_aux else grads
    return grad_f


def value_and_grad(f: Callable, argnums: int | Sequence[int] = 0,
                   has_aux: bool = False) -> Callable:
    """``jax.value_and_grad``: a function returning ``(value, gradients)``, or
    ``((value, aux), gradients)`` with ``has_aux`` (``f`` then returns a pair
    ``(value, aux)``). ``value`` is ``f``'s 0-d Tensor, off the tape; tensors
    in ``aux`` are off the tape too."""
    nums = _check_argnums(argnums, "value_and_grad")
    _check_callable(f, "value_and_grad")

    @functools.wraps(f)
    def value_and_grad_f(*args: Any, **kwargs: Any) -> Any:
        value, aux, grads = _value_and_grad(f, args, kwargs, nums, argnums, has_aux,
                                            "value_and_grad")
        return ((value, aux) if has_aux else value), grads
    return value_and_grad_f


def vjp(f: Callable, *primals: Any, has_aux: bool = False) -> tuple:
    """``jax.vjp``: ``(out, vjp_fn)``, or ``(out, vjp_fn, aux)`` with ``has_aux``.
    ``out`` is ``f(*primals)`` (a Tensor, or a tuple/list of them) off the tape;
    ``vjp_fn(cotangent)``, the cotangent shaped as ``out`` (a Tensor or array
    per output, of its shape and dtype), returns one gradient per primal.
    ``vjp_fn`` may be called again: the recorded graph serves the first call,
    later ones run ``f`` again, replaying its dropout masks."""
    op = "vjp"
    _check_callable(f, op)
    nums = tuple(range(len(primals)))
    replay = _subgraph.RandomReplay(_subgraph.devices(primals))
    state = {"run": _run(f, primals, {}, nums, has_aux, op), "used": False}
    outs, aux = state["run"][0], state["run"][1]
    single = isinstance(outs, Tensor)
    outs_t = (outs,) if single else tuple(outs) if isinstance(outs, (tuple, list)) else None
    if outs_t is None or not all(isinstance(t, Tensor) for t in outs_t):
        raise TypeError(f"{op}: f must return a Tensor or a tuple/list of Tensors, got "
                        f"{_kind(outs)}")
    shapes = [(t.shape, t.dtype, t._kern) for t in outs_t]

    def vjp_fn(cotangent: Any) -> tuple:
        cts = (cotangent,) if single else cotangent
        if not single and (not isinstance(cts, (tuple, list)) or len(cts) != len(outs_t)):
            raise ValueError(f"{op}: vjp_fn needs one cotangent per output of f "
                             f"({len(outs_t)} in a tuple), got {_kind(cotangent)}")
        seeds = tuple(_cotangent(ct, shape, dtype, kern, k, op)
                      for k, (ct, (shape, dtype, kern)) in enumerate(zip(cts, shapes)))
        if state["used"]:   # the first pass freed the graph: record f again
            with replay.replaying():
                state["run"] = _run(f, primals, {}, nums, has_aux, op)
        state["used"] = True
        ran, _, subs, kinds, start = state["run"]
        again = (ran,) if single else tuple(ran)
        return tuple(_pass(again, seeds, subs, kinds, start))

    out_detached = _detach(outs)
    return (out_detached, vjp_fn, aux) if has_aux else (out_detached, vjp_fn)


# ------------------------------------------------------------------ internals
def _value_and_grad(f: Callable, args: tuple, kwargs: dict, nums: tuple, argnums: Any,
                    has_aux: bool, op: str) -> tuple:
    nums = _in_range(nums, len(args), argnums, op)
    value, aux, subs, kinds, start = _run(f, args, kwargs, nums, has_aux, op)
    if not isinstance(value, Tensor):
        raise TypeError(f"{op}: f must return a 0-d float Tensor"
                        f"{' as the first of its pair (value, aux)' if has_aux else ''}, "
                        f"got {_kind(value)}")
    if value.shape != () or value.dtype.kind != "f":
        raise TypeError(f"{op}: gradient only defined for scalar-output functions; f "
                        f"returned a {value.dtype} Tensor of shape {value.shape} (reduce it "
                        f"to shape (), or use ng.vjp for a non-scalar output)")
    seed = ones(value._kern, (), value.dtype)
    grads = _pass((value,), (seed,), subs, kinds, start)
    return _detach(value), aux, grads[0] if isinstance(argnums, int) else tuple(grads)


def _run(f: Callable, args: tuple, kwargs: dict, nums: tuple, has_aux: bool,
         op: str) -> tuple:
    """``f`` on the tape with fresh leaves for arguments ``nums``: (its result,
    aux, the leaves, how to return each gradient, the first id it made)."""
    stack = _active.stack
    new, subs, kinds = list(args), [], []
    for i in nums:
        leaf, kind = _leaf(args[i], i, op)
        if stack and isinstance(args[i], Tensor) and args[i].requires_grad \
                and _reaches(args[i], stack):
            _higher_order(op)
        new[i] = leaf
        subs.append(leaf)
        kinds.append(kind)
    start = _subgraph.next_id()
    stack.append(subs)
    try:
        with grad_tape():
            result = f(*new, **kwargs)
    finally:
        stack.pop()
    aux = None
    if has_aux:
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise TypeError(f"{op}: with has_aux=True f must return a pair (output, aux), "
                            f"got {_kind(result)}")
        result, aux = result
        aux = _detach(aux)
    if stack:   # inside another transform: f must not read what that one differentiates
        outs = result if isinstance(result, (tuple, list)) else (result,)
        for t in outs:
            if isinstance(t, Tensor) and t._node is not None and t.id >= start:
                order = _subgraph.order_within(t._node, start)
                if any(_reaches(b, stack) for b in _subgraph.boundary(order, start)):
                    _higher_order(op)
    return result, aux, subs, kinds, start


def _pass(outs: tuple, seeds: tuple, subs: list, kinds: list, start: int) -> list:
    """The reverse pass from ``outs`` (fed ``seeds``) over what ``f`` recorded;
    each leaf's gradient, returned as its argument was given."""
    root = _subgraph.Root.make(outs, seeds)
    order = _subgraph.order_within(root, start)
    if _writes[0]:
        _check_unmodified(order)
    ctx = _Backward.make(collect=True)   # per-call arrays: no accumulator is touched
    _subgraph.run(ctx, order)
    grads = []
    for leaf, kind in zip(subs, kinds):
        g = ctx.calls.get(leaf)
        kern = leaf._kern
        if g is None:
            g = kernels.empty(kern, leaf.shape, leaf.dtype)
            kernels.call(kern, "fill", 0, g, 0.0)
        grads.append(Tensor(g, kern) if kind == "tensor" else kernels.to_host(kern, g))
    return grads


def _leaf(a: Any, i: int, op: str) -> tuple[Tensor, str]:
    """A fresh leaf for differentiated argument ``i``, and "tensor" or "numpy"."""
    if isinstance(a, Tensor):
        if a.dtype.kind != "f":
            raise TypeError(f"{op}: argument {i} is a {a.dtype} Tensor; gradients need "
                            f"float32 or float64 inputs (ints and bools have none)")
        return Tensor(a._data, a._kern, requires_grad=True), "tensor"
    if isinstance(a, (bool, np.bool_)) or not isinstance(a, (np.ndarray, np.floating, float)):
        raise TypeError(f"{op}: argument {i} must be a float Tensor, NumPy array or float "
                        f"to be differentiated, got {_kind(a)}")
    if isinstance(a, float) and not isinstance(a, np.floating):
        array = np.asarray(a, dtype=get_default_dtype())
    else:     # (np.ascontiguousarray would make a 0-d array or a NumPy scalar 1-d)
        array = np.asarray(a, order="C")
    if array.dtype not in (np.float32, np.float64):
        raise TypeError(f"{op}: argument {i} is a {array.dtype} array; gradients need "
                        f"float32 or float64 inputs")
    cpu = kernels.get("cpu")
    return Tensor(kernels.from_host(cpu, array), cpu, requires_grad=True), "numpy"


def _cotangent(ct: Any, shape: tuple, dtype: np.dtype, kern: Any, k: int, op: str) -> Any:
    """Output ``k``'s cotangent as a pooled array the pass may keep."""
    where = f"{op}: the cotangent of output {k}"
    if isinstance(ct, Tensor):
        if ct._kern is not kern:
            raise ValueError(f"{where} is on {ct.device!r}, the output on {kern.name!r}")
        data = ct._data
    else:
        data = np.asarray(ct)
    if tuple(data.shape) != shape or data.dtype != dtype:
        raise ValueError(f"{where} must have the output's shape {shape} and dtype {dtype}, "
                         f"got shape {tuple(data.shape)} and dtype {data.dtype}")
    if not isinstance(ct, Tensor):
        data = kernels.from_host(kern, np.ascontiguousarray(data))
    return _subgraph.copied(kern, data)


def _reaches(t: Tensor, stack: list[list[Tensor]]) -> bool:
    """Whether ``t`` is, or was computed from, a leaf of a running transform."""
    leaves = {id(leaf) for subs in stack for leaf in subs}
    seen: set[int] = set()
    todo = [t]
    while todo:
        x = todo.pop()
        if id(x) in leaves:
            return True
        node = x._node
        if node is not None and id(node) not in seen:
            seen.add(id(node))
            todo.extend(node.inputs)
    return False


def _higher_order(op: str) -> None:
    raise NotImplementedError(
        f"{op}: higher-order gradients (a transform of a function that itself takes a "
        f"gradient of what the outer transform differentiates, as grad(grad(f))) are not "
        f"supported: numbagrad's backward kernels are not recorded on the tape, so a "
        f"gradient cannot be differentiated again")


def _detach(x: Any) -> Any:
    """Tensors in ``x`` (nested tuples, lists, dicts) off the tape."""
    if isinstance(x, Tensor):
        return x if x._node is None and not x.requires_grad else output(x._data, x._kern,
                                                                        x._pool)
    if isinstance(x, (tuple, list)):
        items = [_detach(v) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    if isinstance(x, dict):
        return {k: _detach(v) for k, v in x.items()}
    return x


def _check_argnums(argnums: Any, op: str) -> tuple[int, ...]:
    nums = (argnums,) if not isinstance(argnums, (tuple, list)) else tuple(argnums)
    for n in nums:
        if isinstance(n, (bool, np.bool_)):
            raise TypeError(f"{op}: argnums must be an int or a tuple of ints, got {argnums!r}")
        try:
            operator.index(n)
        except TypeError:
            raise TypeError(f"{op}: argnums must be an int or a tuple of ints, got "
                            f"{argnums!r}") from None
    return tuple(operator.index(n) for n in nums)


def _in_range(nums: tuple[int, ...], n: int, argnums: Any, op: str) -> tuple[int, ...]:
    out = []
    for k in nums:
        if not -n <= k < n:
            raise ValueError(f"{op}: argnums {argnums!r} is out of range for a call with "
                             f"{n} positional argument(s)")
        out.append(k % n)
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: argnums {argnums!r} names an argument twice (as torch.func, "
                         f"argnums must be unique)")
    return tuple(out)


def _check_callable(f: Any, op: str) -> None:
    if not callable(f):
        raise TypeError(f"{op}: f must be callable, got {_kind(f)}")


def _kind(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"a {x.dtype} Tensor of shape {x.shape}"
    if isinstance(x, np.ndarray):
        return f"a {x.dtype} NumPy array of shape {x.shape}"
    return f"a {type(x).__name__}"
