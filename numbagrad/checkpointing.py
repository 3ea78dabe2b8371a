"""Activation checkpointing: ``ng.checkpoint(fn, *args)`` trades compute for memory.

    with ng.grad_tape():
        x = ng.checkpoint(block, x)      # block's activations are not kept
        loss = ...
    loss.backward()                       # block runs again here, then backpropagates

The forward runs ``fn`` and keeps none of its intermediates: the graph it
records is walked once, to learn which tensors needing a gradient the segment
reads (its tensor arguments, the params it uses, tensors it closes over),
then dropped, and the output is recorded by one node that holds ``fn`` and
its arguments. That node's backward runs ``fn`` again on the tape and
backpropagates the output's gradient through the new graph into those
tensors, through the pass in progress (so ``ng.backward``'s collected
gradients, optimizer windows and ``ng.grad`` all see it as any op). Before
the rerun the random generator is set back to where it was before the
forward (and restored after), so dropout draws the same masks and the
gradients are bit-identical to running ``fn`` without checkpointing.
``ng.nn.Checkpoint(module)`` does this for a module's forward.

Under ``ng.compile`` the rerun and the generator copies are kernel calls like
any other, so a compiled step gives eager mode's results; its arena keeps
every buffer of the step, so there checkpointing saves no memory.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from . import _subgraph
from .tape import Node, _Backward, grad_tape, is_grad_enabled, output
from .nn.module import Module
from .tensor import Tensor

__all__ = ["checkpoint"]


class _Segment:
    """What a checkpoint node keeps: the function, its arguments, the random
    generator's state before the forward, and what the output was."""

    __slots__ = ("fn", "args", "kwargs", "replay", "shape", "dtype", "reads")

    def __init__(self, fn: Callable, args: tuple, kwargs: dict,
                 replay: _subgraph.RandomReplay, out: Tensor, reads: tuple) -> None:
        self.fn, self.args, self.kwargs, self.replay = fn, args, kwargs, replay
        self.shape, self.dtype, self.reads = out.shape, out.dtype, reads


def checkpoint(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` without keeping its activations for the backward
    (``torch.utils.checkpoint.checkpoint``, non-reentrant): its backward runs
    ``fn`` again. ``fn`` returns one Tensor and must compute the same graph when
    run again (the same control flow; dropout's masks are replayed). Outside
    a tape, or when nothing ``fn`` reads needs a gradient, this is just
    ``fn(*args, **kwargs)``."""
    if not callable(fn):
        raise TypeError(f"checkpoint: fn must be callable, got {type(fn).__name__}")
    if not is_grad_enabled():
        return fn(*args, **kwargs)
    # the devices it draws on: its tensor arguments' and, for a module, its params'
    lead = [p for _, p in itertools.islice(fn.named_parameters(), 1)] \
        if isinstance(fn, Module) else []
    replay = _subgraph.RandomReplay(_subgraph.devices((*args, *kwargs.values(), *lead)))
    start = _subgraph.next_id()
    out = fn(*args, **kwargs)
    if not isinstance(out, Tensor):
        raise TypeError(f"checkpoint: fn must return one Tensor, got {type(out).__name__}")
    if out._node is None or out.id < start:   # nothing to recompute
        return out
    order = _subgraph.order_within(out._node, start)
    reads = tuple(_subgraph.boundary(order, start))
    # what it read that needs no gradient (its input batch, say) is read again
    # by the rerun: an input of the node too, so that a write into it before
    # the backward is refused as any recorded op's input's is
    held = tuple(_subgraph.boundary(order, start, grads=False))
    del order     # the segment's graph, and with it its activations, goes here
    segment = _Segment(fn, args, kwargs, replay, out, reads)
    return output(out._data, out._kern, out._pool, _checkpoint_backward, reads + held,
                  (segment,))


class _Inner(_Backward):
    """The pass through a rerun segment: gradients of tensors made before it
    (``start``: its arguments, params, closed-over tensors) go to the outer
    pass, the segment's own stay here."""

    __slots__ = ("outer", "start")

    def dest(self, t: Tensor) -> tuple[Any, float]:
        if t.id < self.start:
            return self.outer.dest(t)
        return _Backward.dest(self, t)

    def give(self, t: Tensor, grad: Any) -> None:
        if t.id < self.start:
            self.outer.give(t, grad)
        else:
            _Backward.give(self, t, grad)


def _checkpoint_backward(ctx: _Backward, node: Node, gout: Any) -> None:
    (seg,) = node.saved
    start = _subgraph.next_id()
    with seg.replay.replaying(), grad_tape():
        out = seg.fn(*seg.args, **seg.kwargs)
    if not isinstance(out, Tensor) or out.shape != seg.shape or out.dtype != seg.dtype:
        got = (f"a {out.dtype} Tensor of shape {out.shape}" if isinstance(out, Tensor)
               else type(out).__name__)
        raise RuntimeError(f"checkpoint: fn returned a {seg.dtype} Tensor of shape "
                           f"{seg.shape} in the forward and {got} when run again for the "
                           f"backward; a checkpointed function must compute the same thing "
                           f"each time")
    if out._node is None or out.id < start:
        raise RuntimeError("checkpoint: fn recorded nothing when run again for the "
                           "backward, though its forward did; a checkpointed function must "
                           "compute the same graph each time")
    inner = _Inner.make(False)
    inner.outer, inner.start = ctx, start
    if gout is not None:
        inner.pending[out._node] = gout
    _subgraph.run(inner, _subgraph.order_within(out._node, start))
    # an op may hand a gradient to its input's node directly (the losses do):
    # those of tensors from before the segment belong to the outer pass
    for t in seg.reads:
        below = t._node
        if below is not None:
            grad = inner.pending.pop(below, None)
            if grad is not None:
                ctx.give(t, grad)
