"""What ``ng.grad``/``ng.vjp`` (``functional.py``) and ``ng.checkpoint``
(``checkpoint.py``) share: a reverse pass over the part of the tape that one
call recorded, and the replay of dropout's random draws.

A function run on the tape records nodes whose inputs may reach tensors
recorded before it (a closed-over tensor, an argument of an outer graph).
The pass here stops at those: every tensor with an ``id`` below ``start``
(made before the function ran) is a boundary, and the nodes of the outer
graph are never run, marked done or freed by it.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any

import numpy as np

from . import buffers, kernels
from . import random as _random
from .ops._common import contiguous_array
from .tape import Node, _Backward, _reverse_order_general
from .tensor import Tensor, _ids


def next_id() -> int:
    """An id no tensor made so far has, and every later tensor exceeds."""
    return next(_ids)


def order_within(root: Node, start: int) -> list[Node]:
    """The nodes reachable from ``root`` without crossing a tensor made before
    ``start`` (``next_id``), each after every node that uses it."""
    return _reverse_order_general(root, start)


def boundary(order: list[Node], start: int, grads: bool = True) -> list[Tensor]:
    """The tensors made before ``start`` that the nodes of ``order`` read, once
    each: those that need a gradient (``grads``), or those that do not."""
    seen: dict[int, Tensor] = {}
    for node in order:
        for t in node.inputs:
            if t.id < start and bool(t.requires_grad) is grads:
                seen.setdefault(id(t), t)
    return list(seen.values())


def run(ctx: _Backward, order: list[Node]) -> None:
    """Run the backward of every node of ``order`` (its first node's gradient
    is already in ``ctx.pending``, or none: ones), freeing what they saved."""
    pending = ctx.pending
    for node in order:
        node.backward(ctx, node, pending.pop(node, None))
        node.done = True
        node.saved = ()


class Root:
    """A node that feeds given gradients (cotangents) to several outputs, so
    that one pass serves a function of several outputs."""

    @staticmethod
    def make(outputs: tuple[Tensor, ...], grads: tuple[Any, ...]) -> Node:
        node = Node()
        node.backward = _feed
        node.inputs = outputs
        node.saved = grads
        node.done = False
        node.stamp = 0
        return node


def _feed(ctx: _Backward, node: Node, gout: Any) -> None:
    for t, g in zip(node.inputs, node.saved):
        if t.requires_grad:
            ctx.give(t, g)


def copied(kern: ModuleType, array: Any) -> Any:
    """A pooled C-contiguous copy of device array ``array`` of ``kern``
    (a pass may keep and add into what it is given, so never the caller's)."""
    out = buffers.take(kern, tuple(array.shape), array.dtype)
    if out.size:
        kernels.call(kern, "axpby", out.size, 1.0, contiguous_array(kern, array), 0.0, out)
    return out


class RandomReplay:
    """The random generator's state on some devices, copied aside on the
    device, so that a function run again draws the same dropout masks
    (``replaying``). The copies are kernel calls: a compiled step replays
    them with the rest."""

    __slots__ = ("saved",)

    def __init__(self, kerns: Iterable[ModuleType]) -> None:
        self.saved = []
        for kern in {k.name: k for k in kerns}.values():
            state = _random.state(kern)
            snap = buffers.take(kern, (3,), np.uint64)
            kernels.call(kern, "copy_state", 0, state, snap)
            self.saved.append((kern, state, snap))

    @contextlib.contextmanager
    def replaying(self) -> Iterator[None]:
        """Inside: the generator is where it was when this was made; after:
        where it was before (so the rerun draws nothing new)."""
        now = []
        for kern, state, snap in self.saved:
            keep = buffers.take(kern, (3,), np.uint64)
            kernels.call(kern, "copy_state", 0, state, keep)
            kernels.call(kern, "copy_state", 0, snap, state)
            now.append((kern, state, keep))
        try:
            yield
        finally:
            for kern, state, keep in now:
                kernels.call(kern, "copy_state", 0, keep, state)


def devices(values: Iterable[Any]) -> list[ModuleType]:
    """The kernel modules of the tensors among ``values`` (the CPU's if none):
    the devices whose generator a function of them draws from. (Every device
    whose generator was ever used would be safer for a function that draws on
    a device none of its tensors is on, but would put CUDA copies into a CPU
    step that ``ng.compile`` then could not compile.)"""
    kerns = {t._kern.name: t._kern for t in values if isinstance(t, Tensor)}
    return list(kerns.values()) or [kernels.get("cpu")]
