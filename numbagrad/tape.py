"""The gradient tape: what ops record, and the reverse pass over it.

Recording is a per-thread depth: inside ``with ng.grad_tape():`` an op whose
inputs need a gradient attaches a ``Node`` to its output; other threads are
not affected. The reverse pass walks those nodes from the loss and asks each
op's backward (in ``ops/``, beside its forward) to write input gradients
where ``_Backward.dest`` says.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import threading
from threading import get_ident

import numpy as np

from . import _dtypes, buffers, kernels
from .tensor import Tensor, _ids, _seen, _wrappers, _writes


class _State(threading.local):
    """This thread's tape depth, ``box[0]``: > 0 while it is inside at least one
    grad_tape block. A one-element list, so that entering or leaving a tape
    reads the thread-local state once instead of reading and writing it."""

    def __init__(self) -> None:
        self.box = [0]

    @property
    def depth(self) -> int:
        return self.box[0]


_state = _State()
_new = object.__new__


class grad_tape:
    """Context manager: ops inside it are recorded for ``ng.backward``.

    Outside a tape ops still compute but record nothing. Tapes nest, and
    each thread has its own.
    """

    __slots__ = ()

    def __enter__(self) -> grad_tape:
        _state.box[0] += 1
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        _state.box[0] -= 1


class no_grad:
    """Context manager (or decorator): ops inside it record nothing, even
    inside ``ng.grad_tape()``, as ``torch.no_grad``. A ``grad_tape`` opened
    inside it records again (PyTorch's ``enable_grad``); the depth it
    paused comes back on exit. Per thread, like the tape."""

    __slots__ = ("_saved",)

    def __init__(self) -> None:
        self._saved: list[int] = []

    def __enter__(self) -> no_grad:
        box = _state.box
        self._saved.append(box[0])
        box[0] = 0
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        _state.box[0] = self._saved.pop()

    def __call__(self, fn: Callable) -> Callable:
        """``@ng.no_grad()`` on a function: it runs without recording."""
        import functools

        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with no_grad():
                return fn(*args, **kwargs)
        return wrapped


def is_grad_enabled() -> bool:
    """Whether ops on this thread record now (inside a tape, not paused)."""
    return _state.box[0] > 0


class Node:
    """One recorded op: its backward function, inputs and saved arrays;
    ``output`` makes one."""

    __slots__ = ("backward", "inputs", "saved", "done", "stamp")


def output(data: Any, kern: Any, pool: Any, backward: Callable | None = None,
           inputs: tuple = (), saved: tuple = ()) -> Tensor:
    """An op's output tensor (``pool``: the pooled array its data is, or is a
    view of; None if none), recorded by a ``Node`` when ``backward`` is given.
    Built without calling ``Tensor.__init__``: before Python 3.13 a class
    call reaches a Python ``__init__`` through a slow generic slot (about
    100 ns), and this runs once per op (``Node`` has no ``__init__``). Sets
    what ``Tensor.__init__`` sets."""
    t = _new(Tensor)
    t._data = data
    t._kern = kern
    t.id = next(_ids)
    t._acc = None
    t._live = False
    t._owner = None
    t._pool = pool
    if backward is None:
        t.requires_grad = False
        t._node = None
        return t
    node = Node()   # no __init__: a cheap class call
    node.backward = backward
    node.inputs = inputs
    node.saved = saved
    node.done = False
    node.stamp = _writes[0]
    t.requires_grad = True
    t._node = node
    return t


class _Backward:
    """Where one reverse pass writes gradients.

    Intermediate gradients live in ``pending`` until their node runs. A
    param's gradient goes straight into its accumulator (``collect`` off),
    or into a fresh per-call array that is added to the accumulator at the
    end and returned to the caller (``collect`` on). A param in ``defer``
    (an input of the pass wraps its accumulator) is handled as collected,
    its total added at the end and not returned.
    """

    __slots__ = ("collect", "pending", "calls", "thread", "defer")

    @classmethod
    def make(cls, collect: bool, defer: Any = None) -> _Backward:
        """A new pass (built as ``output`` builds a tensor)."""
        ctx = cls()   # no __init__: a cheap class call
        ctx.collect = collect
        ctx.pending = {}   # Node -> its output's gradient so far
        ctx.calls = {}     # Tensor -> its per-call gradient
        ctx.thread = get_ident()
        ctx.defer = defer   # params written per call even when not collecting (or None)
        return ctx

    def dest(self, t: Tensor) -> tuple[Any, float]:
        """An array to write ``t``'s gradient into, and the beta to use:
        0.0 means overwrite it, 1.0 means add to what is there."""
        node = t._node
        if node is None and not self.collect:
            owner = t._owner   # an optimizer's window is one thread's (optim/window.py)
            if owner is not None:
                win = owner._window
                if win.thread != self.thread:
                    win.claim("backward()")
                win.fed = True   # step() counts a micro-step only after a gradient
            if self.defer is None or t not in self.defer:
                # A cleared accumulator holds zeros, so adding is always right.
                t._live = True
                acc = t._acc
                return (acc if acc is not None else t._accumulator()), 1.0
        store, key = (self.calls, t) if node is None else (self.pending, node)
        array = store.get(key)
        if array is not None:
            return array, 1.0
        # A param's per-call gradient goes to the caller, so it is a fresh
        # array; an intermediate's lives only in this pass, so it is pooled.
        data = t._data
        array = (kernels.empty(t._kern, data.shape, data.dtype) if node is None
                 else buffers.take(t._kern, data.shape, data.dtype))
        store[key] = array
        return array, 0.0

    def give(self, t: Tensor, grad: Any) -> None:
        """Hand over a finished gradient for ``t`` that the pass may keep."""
        if not t.requires_grad:
            return
        node = t._node
        if node is not None and node not in self.pending:
            self.pending[node] = grad
            return
        array, beta = self.dest(t)
        _add_into(t._kern, grad, beta, array)


def _add_into(kern: Any, grad: Any, beta: float, dest: Any) -> None:
    """dest = grad + beta * dest (halves added in float32: ops/_half.py)."""
    if (dest.dtype.itemsize == 2 or grad.dtype.itemsize == 2) \
            and (dest.dtype in _dtypes.HALVES or grad.dtype in _dtypes.HALVES):
        from .ops import _half as half
        half.add_into(kern, grad, beta, dest)
    else:
        kernels.call(kern, "axpby", 0, 1.0, grad, beta, dest)


def _reverse_order(root: Node) -> list[Node]:
    """Nodes reachable from ``root``, each after every node that uses it; a
    RuntimeError if backward already ran through one of them, or if one's
    input was written after it was recorded (``_check_unmodified``)."""
    chain = [root]   # fast path: a plain chain, each node fed by at most one node
    node = root
    now = _writes[0]
    stale = False    # a node recorded before the last in-place write
    while node is not None:
        if node.done:
            _already_run()
        if node.stamp < now:
            stale = True
        parent = None
        for t in node.inputs:
            below = t._node
            if below is not None:
                if parent is not None:
                    return _checked(_reverse_order_general(root))
                parent = below
        if parent is not None:
            chain.append(parent)
        node = parent
    if stale:
        _check_unmodified(chain)
    return chain


def _checked(order: list[Node]) -> list[Node]:
    for node in order:
        if node.done:
            _already_run()
    if _writes[0]:
        _check_unmodified(order)
    return order


def _already_run() -> None:
    raise RuntimeError("backward was already run through this recorded graph; "
                       "record the forward again inside ng.grad_tape() "
                       "(running it twice would count its gradients twice)")


def _reverse_order_general(root: Node, start: int = 0) -> list[Node]:
    # Iterative depth-first post-order: a node is emitted once every node it
    # reads from has been, and marked visited when expanded, not when pushed
    # (marking at push time emits a node shared by two paths too early).
    # ``start``: tensors with a smaller id (made before it) are not crossed.
    order: list[Node] = []
    visited: set[Node] = set()
    stack = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if node in visited:
            continue
        visited.add(node)
        stack.append((node, True))
        for t in node.inputs:
            parent = t._node
            if parent is not None and t.id >= start and parent not in visited:
                stack.append((parent, False))
    order.reverse()
    return order


def _aliased_params(order: list[Node]) -> set | None:
    """The params whose accumulator an input of these nodes wraps (say
    ``ng.as_tensor(W.grad)``): written in place, it would be read after (or
    while) the pass adds to it, so their gradients are added at the end."""
    wrapped, params = [], []
    for node in order:
        for t in node.inputs:
            if t in _wrappers:
                wrapped.append(t._data)
            elif t._node is None and t.requires_grad and t._acc is not None:
                params.append(t)
    found = {p for p in params for data in wrapped if _overlap(data, p._acc)}
    return found or None


def _overlap(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return np.may_share_memory(a, b)
    # device arrays: a view does not name its parent, so compare the bytes
    (lo_a, hi_a), (lo_b, hi_b) = kernels.extent(a), kernels.extent(b)
    return lo_a < hi_b and lo_b < hi_a


def _check_unmodified(order: list[Node]) -> None:
    """Refuse a pass through a node whose input was written in place after
    it was recorded (PyTorch's version-counter error): its backward would
    read the new values and give a wrong gradient. An input shares the
    writes of what it is a view or a detach() of (its ``_base`` chain), as a
    PyTorch view shares its base's version counter; an optimizer update
    and ``load_state_dict`` write the params they change."""
    now = _writes[0]
    for node in order:
        stamp = node.stamp
        if stamp < now:
            for t in node.inputs:
                written = t
                while written is not None and getattr(written, "_stamp", 0) <= stamp:
                    written = getattr(written, "_base", None)
                if written is not None:
                    op = getattr(node.backward, "__name__", "_op_backward")
                    op = op.strip("_").removesuffix("_backward")
                    shared = "" if written is t else (
                        f" (through a tensor of shape {written.shape} that it is a view or a "
                        f"detach() of)")
                    raise RuntimeError(
                        f"backward: a {t.dtype} tensor of shape {t.shape} that a recorded "
                        f"op ({op}) read "
                        f"was modified in place after it was recorded{shared} (by an "
                        f"in-place op, an optimizer update, load_state_dict or nn.init), so "
                        f"its gradient would use the new values; run backward before the "
                        f"write (before opt.step()), record the forward again after it, or "
                        f"write into a clone()")


def run_backward(loss: Tensor, collect: bool) -> Mapping[int, Any] | None:
    """The reverse pass behind ``ng.backward`` and ``Tensor.backward``."""
    try:
        root = loss._node
    except AttributeError:
        root = None
    if root is None:
        if not isinstance(loss, Tensor):
            raise TypeError(f"backward needs a Tensor loss, got {type(loss).__name__}")
        raise ValueError("the loss was not recorded on a tape: compute it inside "
                         "`with ng.grad_tape():` from at least one ng.param")
    if loss._data.size != 1:
        raise ValueError(f"backward needs a one-element loss, got shape {loss.shape}")
    order = _reverse_order(root)
    ctx = _Backward.make(collect, _aliased_params(order) if _seen.wrapped else None)
    pending = ctx.pending
    for node in order:
        node.backward(ctx, node, pending.pop(node, None))
        node.done = True
        # what it saved, and its inputs: a tensor still held (say a view's
        # base) does not keep the consumed graph alive
        node.saved = ()
        node.inputs = ()
    calls = ctx.calls
    if not calls:
        return None if not collect else MappingProxyType({})
    if collect:
        for t in calls:   # every window first: a refused one leaves every .grad as it was
            if t._owner is not None:
                t._owner._window.claim("backward()")
    for t, g in calls.items():   # the per-call gradients (collected, or deferred by an alias)
        _add_into(t._kern, g, 1.0, t._accumulator())
        t._live = True
        if t._owner is not None:
            t._owner._window.fed = True
    if not collect:
        return None
    for g in calls.values():
        if isinstance(g, np.ndarray):
            g.flags.writeable = False
    return MappingProxyType({t.id: g for t, g in calls.items()})


def backward(loss: Tensor) -> Mapping[int, Any]:
    """Back-propagate ``loss``; return this call's gradients by ``param.id``.

    Every param reached also gets this call's gradient added into its
    ``.grad``. The returned mapping is read-only and its arrays are never
    touched by later calls. ``loss.backward()`` is the copy-free variant.
    """
    return run_backward(loss, collect=True)
