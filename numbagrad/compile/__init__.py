"""``ng.compile``: record a training step's kernels once, replay them as compiled code.

    step = ng.compile(loss_fn, optimizer=opt)
    for x, y in batches:
        loss = step(x, y)      # forward, backward into .grad, opt.step()
    predict = ng.compile(model)     # inference: any tensors out, no backward

The first call with a new signature runs ``loss_fn`` eagerly on a tape (so it
raises exactly what eager mode raises) while every kernel call is recorded;
the recording becomes one generated ``@njit`` function (CPU) that issues the
same kernels in the same order on buffers allocated once for that signature.
On CUDA the recorded launches are replayed back to back from Python, each
elementwise chain as one generated kernel. See ``compile`` for the rules.

One module a concept: ``intrinsics`` (the LLVM intrinsics generated code
calls), ``geometry`` (array geometry, signature keys), ``recording``,
``analysis``, ``fusion`` (the elementwise chains run as one loop), ``codegen``
(the CPU @njit source), ``cuda_chains`` (the chains as CUDA kernels),
``cache`` (the folder of generated modules), ``runners`` (one signature's
compiled step); this module is the public API.
"""
from __future__ import annotations

import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numba
import numpy as np

from .. import kernels, tape
from ..nn.module import CHANGES as _MODULE_CHANGES
from ..nn.module import _settled, _still, _watching
from ..optim.fused import FusedUpdate
from ..tensor import Tensor, _zero
from .analysis import _analyze, _compare, _device_of, _Program
from .cache import _load_module, _write, cache_dir  # noqa: F401 (_write: tests reach it here)
from .codegen import _Codegen
from .geometry import _describe_args, _key, _Unsupported
from .intrinsics import _array, _call  # noqa: F401 (generated modules import them from here)
from .recording import _recording, _reached_params
from .runners import (_EAGER, _MISS, _STALE, _VERIFY, MAX_SIGNATURES, _data, _EagerEntry,
                      _Entry, _NjitEntry, _ReplayEntry, _window_of)

__all__ = ["CompiledStep", "GraphChangedError", "compile"]


class GraphChangedError(RuntimeError):
    """``fn`` recorded a different graph for a signature already compiled."""


class CompiledStep:
    """A training micro-step (or an inference call) recorded once per signature
    and replayed; see ``compile``.

    Call it like ``fn``: ``loss = step(*args)`` (inference: fn's outputs, as
    new tensors). Attributes: ``fn``, ``optimizer``, ``backward`` (as given),
    ``stats`` (one dict per recording: the signature, ``backward`` (whether
    it is a training step), ``mode`` "njit" / "replay" / "eager",
    ``record_s``, and for "njit" ``codegen_s``, ``jit_s``, ``cache`` ("hit":
    loaded from Numba's cache, "miss": compiled, "loaded": already in this
    process, as for a graph's second batch size), the generated ``module``
    and ``fused_update``: whether the optimizer's update runs inside it,
    ``fused``: each fused elementwise loop's kernel calls by name, and for a
    step with threaded kernels ``threads``: "measuring", then "threaded" or
    "serial", the twins it measured faster and keeps),
    ``signatures`` (the cached ones, oldest first).
    """

    def __init__(self, fn: Callable, optimizer: Any = None, *, verify: bool = True,
                 cache_dir: str | None = None, max_signatures: int = MAX_SIGNATURES,
                 fuse_update: bool = True, backward: bool | None = None,
                 fuse_elementwise: bool = True) -> None:
        if not callable(fn):
            raise TypeError(f"ng.compile needs a callable, got {type(fn).__name__}")
        if optimizer is not None and not callable(getattr(optimizer, "step", None)):
            raise TypeError(f"optimizer must have a step() method, got "
                            f"{type(optimizer).__name__}")
        if backward not in (None, True, False):
            raise TypeError(f"ng.compile: backward must be None, True or False, got "
                            f"{backward!r}")
        if backward is False and optimizer is not None:
            raise ValueError(f"ng.compile: backward=False (inference) takes no optimizer, "
                             f"got a {type(optimizer).__name__}")
        self.backward = backward
        self.fn = fn
        self._optimizer = optimizer
        self._window = _window_of(optimizer)
        self.verify = bool(verify)
        self.fuse = bool(fuse_update)
        self.fuse_elementwise = bool(fuse_elementwise)
        self.cache_dir = cache_dir
        self.max_signatures = max(1, int(max_signatures))
        self.stats: list[dict[str, Any]] = []
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self._last: _Entry | None = None
        self._changes = _MODULE_CHANGES[0]
        self.__wrapped__ = fn

    @property
    def signatures(self) -> list[tuple]:
        return list(self._entries)

    @property
    def optimizer(self) -> Any:
        return self._optimizer

    @optimizer.setter
    def optimizer(self, value: Any) -> None:
        """Another optimizer (or None): every signature records again."""
        if value is not None and not callable(getattr(value, "step", None)):
            raise TypeError(f"optimizer must have a step() method, got {type(value).__name__}")
        if value is not None and self.backward is False:
            raise ValueError(f"ng.compile: a step made with backward=False (inference) takes "
                             f"no optimizer, got a {type(value).__name__}")
        self._optimizer = value
        self._window = _window_of(value)
        self._entries.clear()
        self._last = None

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        return f"ng.compile({name}, {len(self._entries)} signature(s))"

    def __call__(self, *args: Any) -> Tensor:
        win = self._window   # the optimizer's window is one thread's (optim/window.py)
        if win is not None and win.thread != threading.get_ident():   # inline: hot path
            win.claim("a compiled step (ng.compile)")
        try:   # one frame, no helper call: this is the compiled step's hot path
            if _MODULE_CHANGES[0] != self._changes:   # model.eval(), a param replaced, ...
                self._drop_changed()
            entry = self._last
            if entry is not None:
                out = entry.run(args)
                if type(out) is not object:   # not a sentinel: the loss (or the outputs)
                    return out
            else:
                out = _MISS
            if out is _MISS:
                key = _key(args)
                entry = self._entries.get(key)
                if entry is None:
                    return self._record(args, key, None)
                self._last = entry
                self._entries.move_to_end(key)
                out = entry.run(args)
                if type(out) is not object:
                    return out
                if out is _MISS:    # the key matched but the runner's guard did not: be safe
                    return self._eager(args, entry)
            if out is _STALE:
                return self._record(args, entry.key, None)
            if out is _VERIFY:
                if entry.fails_checks(args):
                    return self._eager(args, entry)
                return self._record(args, entry.key, entry)
            if out is _EAGER:
                return self._eager(args, entry)
            raise RuntimeError(f"ng.compile: internal error, unexpected runner answer {out!r}")
        except BaseException:
            if win is not None:
                win.release_if_idle()    # a step that raised before counting holds nothing
            raise

    # ------------------------------------------------------------ internals
    def _drop_changed(self) -> None:
        """Forget the signatures whose recorded modules changed since."""
        self._changes = _MODULE_CHANGES[0]
        for key, entry in list(self._entries.items()):
            if not _still(entry.watch):
                del self._entries[key]
        if self._last is not None and self._last.key not in self._entries:
            self._last = None

    def _eager(self, args: tuple, entry: _Entry) -> Any:
        with tape.grad_tape():
            loss = self.fn(*args)
        if not entry.train:
            return loss
        loss.backward()
        self._step_optimizer()
        return loss

    def _step_optimizer(self) -> None:
        if self.optimizer is not None:
            self.optimizer.step()

    def _record(self, args: tuple, key: tuple, check: _Entry | None) -> Tensor:
        for i, a in enumerate(args):
            if isinstance(a, Tensor) and a._node is not None:
                raise TypeError(f"ng.compile: argument {i} is the output of a recorded op; "
                                f"pass leaf tensors (the graph is recorded inside fn)")
        # a verifying call's backward adds into .grad before the graphs are
        # compared: kept here, so that a GraphChangedError leaves them as they were
        kept = _GradState(self, check) if check is not None else None
        t0 = time.perf_counter()
        outputs = pack = None
        with _recording() as rec, _watching() as called:
            with tape.grad_tape():
                result = self.fn(*args)
            train = self._trains(result, check is None)
            if train:
                if not isinstance(result, Tensor):
                    raise TypeError(f"ng.compile: fn must return the loss Tensor (with an "
                                    f"optimizer or backward=True), got "
                                    f"{type(result).__name__}")
                loss = result
                params = _reached_params(loss) if loss._node is not None else []
                if kept is not None:
                    kept.add(params)
                loss.backward()  # eager's errors (not recorded, not one element) as they are
            else:
                outputs, pack = _flatten(result)
                loss = outputs[0]
                params = _reached_params_of(outputs)
        t1 = time.perf_counter()
        watch = _settled(called)
        if rec.host_reads and check is None:
            warnings.warn("ng.compile: fn copied a tensor to the host (.item(), .numpy()) "
                          "while being recorded; replays run no Python code, so a decision "
                          "taken on that value is frozen into the compiled step",
                          RuntimeWarning, stacklevel=3)
        devices = {_device_of(call[2]) for call in rec.calls} - {None}
        host = all(t.device == "cpu" for t in outputs or [loss]) and devices <= {"cpu"}
        reason = ""    # (not host: Python replay)
        try:
            why = rec.eager_only or rec.from_arguments(args)
            if why:
                raise _Unsupported(why)
            prog = _analyze(rec, args, loss, params, host, outputs)
            prog.pack = pack
        except Exception as exc:  # noqa: BLE001 (whatever fails, the call itself is done)
            prog, reason = None, _reason(exc)
        if check is not None:
            problem = ("its arrays cannot be mapped as before" if prog is None
                       else _compare(check.prog, prog, args))
            if problem is not None:
                kept.restore()
                raise GraphChangedError(
                    f"ng.compile: {getattr(self.fn, '__qualname__', 'fn')} recorded a different "
                    f"graph on call {check.count[0]} for the same signature "
                    f"{_describe_args(args)}: {problem}. A compiled step replays the graph "
                    f"recorded on the first call; Python control flow that depends on tensor "
                    f"values or on state outside the arguments is not captured. Make the "
                    f"choice an argument (each value is its own signature) or run this step "
                    f"eagerly.")
            if isinstance(check, _NjitEntry):
                check.remeasure()
            self._step_optimizer()
            return result
        stat: dict[str, Any] = {"signature": _describe_args(args), "record_s": t1 - t0,
                                "backward": train}
        entry: _Entry | None = None
        if prog is not None and host:
            try:
                entry = self._njit_entry(prog, args, key, stat)
            except Exception as exc:  # noqa: BLE001 (replayed from Python instead)
                reason = _reason(exc)
        if prog is not None and entry is None:
            try:
                entry = _ReplayEntry(prog, args, key, self)
                if host:
                    warnings.warn(f"ng.compile: no @njit function for this step ({reason}); "
                                  f"its kernels are replayed from Python", RuntimeWarning,
                                  stacklevel=3)
            except Exception as exc:  # noqa: BLE001 (run eagerly instead)
                reason = _reason(exc)
        if entry is None:
            warnings.warn(f"ng.compile: this step cannot be replayed ({reason}); it runs "
                          f"eagerly for this signature", RuntimeWarning, stacklevel=3)
            entry = _EagerEntry(None, args, key, self)
        entry.watch = watch
        entry.train = train
        stat["mode"] = entry.mode
        if isinstance(entry, _ReplayEntry):
            stat["fused"] = entry.fused
        if isinstance(entry, _NjitEntry):     # "threads": its measured choice, when it has one
            stat.update(entry.stat)
            entry.stat = stat
        stat["total_s"] = time.perf_counter() - t0
        self.stats.append(stat)
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_signatures:
            self._entries.popitem(last=False)
        self._last = entry
        self._step_optimizer()
        return result

    def _trains(self, result: Any, warn: bool) -> bool:
        """Whether this recording is a training step (backward, optimizer) or inference."""
        if self.backward is not None:
            return self.backward
        if self.optimizer is not None:
            return True
        if isinstance(result, Tensor) and result._node is not None:
            if len(result.shape) == 0:
                return True
            if result.size == 1 and warn:
                warnings.warn(f"ng.compile: fn returned a one-element tensor of shape "
                              f"{result.shape}, not a 0-d loss: it is compiled as inference "
                              f"(no backward, no gradients); pass backward=True to train on "
                              f"it (backward=False silences this)", RuntimeWarning,
                              stacklevel=4)
        return False

    def _njit_entry(self, prog: _Program, args: tuple, key: tuple, stat: dict) -> _NjitEntry:
        t0 = time.perf_counter()
        fused = None
        if self.optimizer is not None and self.fuse:
            fused = FusedUpdate.build(self.optimizer, prog.params)
            if fused is not None:
                try:
                    fused.kernel.compile(tuple(numba.typeof(a) for a in fused.args))
                except Exception as exc:  # noqa: BLE001 (the update then runs from Python)
                    warnings.warn(f"ng.compile: the optimizer update stays outside the "
                                  f"compiled step ({_reason(exc)})", RuntimeWarning,
                                  stacklevel=4)
                    fused = None
        gen = _Codegen(prog, fused, self.fuse_elementwise)
        source = gen.source()
        module, path = _load_module(source, cache_dir(self.cache_dir))
        fn = module.step
        t1 = time.perf_counter()
        per_call = []
        for kind, idx in gen.per_call:
            if kind == "in":
                per_call.append(_data(args[idx]))
            else:
                i, dtype = prog.derived[idx]
                per_call.append(np.ascontiguousarray(args[i], dtype))
        meta = np.array(gen.meta, np.int64)
        fmeta = np.array(gen.fmeta, np.float64)
        sig = tuple(numba.typeof(a) for a in [meta, fmeta, *per_call])
        loaded = sig in fn.overloads
        hits = sum(fn.stats.cache_hits.values())
        try:
            fn.compile(sig)
        except Exception as exc:  # noqa: BLE001 (a typing problem in generated code: replay)
            raise _Unsupported(f"Numba could not compile the generated step "
                               f"({_reason(exc)})") from None
        cache = ("loaded" if loaded else
                 "hit" if sum(fn.stats.cache_hits.values()) > hits else "miss")
        stat.update(codegen_s=t1 - t0, jit_s=time.perf_counter() - t1, cache=cache,
                    module=path, fused_update=fused is not None,
                    fused=gen.plan.fused(prog))
        # Tensors' arrays are numbagrad's own (aligned, and checked against the
        # signature by the runner), so those calls may skip Numba's dispatch
        direct = None
        if all(kind == "in" and isinstance(args[idx], Tensor) for kind, idx in gen.per_call):
            direct = getattr(fn.overloads.get(sig), "entry_point", None)
        return _NjitEntry(prog, args, key, self, gen, direct or fn)


class _GradState:
    """What a verifying call's eager backward changes before its graph is
    compared: the ``.grad`` of the params the step recorded before, of its
    optimizer's params and of those the new recording reaches (``add``,
    before its backward): values and whether they hold one; and their
    windows' ``fed`` flags. ``restore`` puts them back (a call that raises
    ``GraphChangedError`` then leaves them as they were)."""

    def __init__(self, step: CompiledStep, entry: _Entry) -> None:
        self.grads: list[tuple] = []
        self.seen: set[int] = set()
        self.windows: dict[int, tuple] = {}
        self.add(list(entry.prog.params) if entry.prog is not None else [])
        if step.optimizer is not None:
            self.add(getattr(step.optimizer, "params", ()))

    def add(self, params: Any) -> None:
        for p in params:
            if id(p) not in self.seen:
                self.seen.add(id(p))
                acc = p._acc   # (the device module's own copy: no recording observes it)
                self.grads.append((p, p._live, acc,
                                   None if acc is None else p._kern.to_host(acc)))
                if p._owner is not None:
                    w = p._owner._window
                    self.windows.setdefault(id(w), (w, w.fed))

    def restore(self) -> None:
        for p, live, acc, host in self.grads:
            if host is not None:
                kernels.call(p._kern, "upload", 0, host, acc)
            elif p._acc is not None:
                _zero(p._kern, p._acc)
            p._live = live
        for w, fed in self.windows.values():
            w.fed = fed


def _flatten(result: Any) -> tuple[list[Tensor], Callable]:
    """An inference step's tensors (a Tensor, or tuples, lists and dicts of them,
    nested) and the function that puts new ones in the same structure."""
    leaves: list[Tensor] = []

    def walk(x: Any, where: str) -> Callable:
        if isinstance(x, Tensor):
            k = len(leaves)
            leaves.append(x)
            return lambda ts: ts[k]
        if isinstance(x, (tuple, list)):
            parts = [walk(v, f"{where}[{i}]") for i, v in enumerate(x)]
            kind = type(x)
            if hasattr(x, "_fields"):     # a named tuple
                return lambda ts: kind(*[p(ts) for p in parts])
            return lambda ts: kind([p(ts) for p in parts])
        if isinstance(x, dict):
            parts = [(key, walk(v, f"{where}[{key!r}]")) for key, v in x.items()]
            return lambda ts: {key: p(ts) for key, p in parts}
        raise TypeError(f"ng.compile: fn must return the loss Tensor or, for inference, "
                        f"tensors (a Tensor, tuple, list or dict of them); {where} is a "
                        f"{type(x).__name__}")
    build = walk(result, "its result")
    if not leaves:
        raise TypeError(f"ng.compile: fn returned no tensor ({type(result).__name__} "
                        f"{result!r}); it must return the loss Tensor or, for inference, "
                        f"tensors")
    return leaves, build


def _reached_params_of(outputs: list[Tensor]) -> list[Tensor]:
    """The params an inference step's outputs were computed from, first seen first."""
    params: list[Tensor] = []
    seen: set[int] = set()
    for t in outputs:
        for p in _reached_params(t) if t._node is not None else []:
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params


def _reason(exc: Exception) -> str:
    if isinstance(exc, _Unsupported):
        return str(exc)
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def compile(fn: Callable, optimizer: Any = None, *, verify: bool = True,
            cache_dir: str | None = None, fuse_update: bool = True,
            backward: bool | None = None, fuse_elementwise: bool = True) -> CompiledStep:
    """Record ``fn``'s training step (or inference) once per signature and replay it compiled.

    ``step = ng.compile(fn)``; ``loss = step(*args)`` does what
    ``with ng.grad_tape(): loss = fn(*args)`` then ``loss.backward()`` does
    (gradients added into every reached param's ``.grad``) and returns the
    loss tensor. With ``optimizer=opt`` it then calls ``opt.step()``, so one
    call is a whole micro-step, the window's update included.

    **Training or inference.** With an optimizer (or ``backward=True``)
    ``fn`` must return the scalar loss Tensor; a non-scalar one raises
    eager mode's ``backward`` error. Without an optimizer, a 0-d Tensor
    recorded on the tape is a loss (backward, as above) and anything else
    is inference: ``fn`` may return a Tensor of any shape or a tuple, list
    or dict of tensors (nested), and ``step(*args)`` returns the same
    structure holding new tensors with the values
    ``with ng.grad_tape(): fn(*args)`` computes, off the tape (they hold no
    graph, unlike eager's); no backward runs and no ``.grad`` changes.
    ``backward=False`` makes any result inference (an evaluation loss) and
    takes no optimizer. A one-element non-0-d result (shape ``(1,)``) is
    inference too, with a warning (``backward=`` says which is meant).
    PyTorch's ``torch.compile`` compiles any function alike; here the
    backward is part of the step, hence the rule.

    **Signatures.** A signature is each argument's shape, strides, dtype and
    device (a tensor's ``requires_grad`` too; Python numbers by value). The
    first call with a new signature runs ``fn`` eagerly on a tape, raising
    whatever eager mode raises (a shape an op rejects, say), records every
    kernel call, and generates one ``@njit`` function that issues them in the
    same order on buffers allocated once for that signature. Later calls
    replay it: no tape, no op dispatch, no allocation. The last
    ``MAX_SIGNATURES`` (8) signatures are kept. A param that no longer holds
    the arrays it was recorded with (a new optimizer adopted it) makes the
    next call record again, and so does a change to an ``nn.Module`` that
    ``fn`` called while recording (``train()``/``eval()`` switching its mode,
    an attribute set again: a param, submodule or setting replaced), unless
    ``fn`` makes that change itself; that signature then records anew (a
    mode switched and switched back before the next call changes nothing).
    A new batch size is a new signature: it records, but the generated code
    it reaches is the one already compiled (see **Cache**), so a ragged last
    batch costs one eager-speed call, not a compile.

    **What is captured.** Only kernels. Python code in ``fn`` runs on the
    recording call only: control flow that depends on tensor values
    (``if loss.item() > 1``) or on state outside the arguments (a counter, a
    random choice) is frozen as it went on that call, and arrays ``fn``
    creates itself (``ng.tensor(...)`` of closure data) are captured as
    constants; arrays passed as arguments are read fresh on every call. To
    catch the common mistake, the 2nd, 4th, 8th, ... call of a signature runs
    eagerly again and compares what it records: a different graph raises
    ``GraphChangedError`` (``verify=False`` skips these checks). Host indices
    and class labels given as arguments (``x[idx]``, ``embedding``,
    ``gather``, ``cross_entropy``, ``nll_loss``) are range-checked on every
    call before any kernel runs, as the op checks them: a call that fails the
    check runs eagerly, so it raises eager mode's error (IndexError or
    ValueError, naming the op) with params, gradients and the optimizer
    untouched (and a cross_entropy target holding ``ignore_index``, which
    the replay cannot express, is computed eagerly; a call recorded with
    one replays no other, unless it ignored every label). Ops that turn an
    argument's values into positions on the host (``x[i, j]`` with several
    index arrays, ``x[mask]``, ``masked_select``, ``one_hot``,
    ``repeat_interleave`` with per-element counts, each given an argument)
    make their signature run eagerly on every call, with a RuntimeWarning:
    a replay would keep the first call's positions. A verifying call
    that fails these checks runs eagerly too, rather than compare the graph
    eager mode builds for it. CUDA device indices and labels are checked by
    their kernels, which raise after their launch.

    **Results** are bit-identical to eager execution on the CPU: the same
    compiled kernels, called with the same arguments in the same order,
    except that a chain of elementwise kernels (a bias add and its
    activation, a residual add, their gradients; ``compile.fusion``) runs
    as one generated loop over the elements, which computes each with the
    kernels' own scalar functions and expressions, rounding every link's
    value to its dtype as the kernel's store does: the same bits, in one
    pass over memory, and no buffer for a temporary only the chain reads.
    A chain reading a threaded GEMM's output runs inside the GEMM's blocks,
    each thread's block computed by the GEMM's own call and then passed
    through the chain while in cache (the same calls: the same bits).

    **Threads.** A step whose kernels include threaded twins times its calls
    after the first 16, in alternating blocks with the threaded twins and
    with their serial twins (which give the same bits), and keeps the serial
    ones when they are at least 10% faster: a step of small kernels can lose
    more to moving its data between the cores' caches than the threads
    gain. Steps over 50 ms, or measured while the thread governor has
    threads off, keep them.
    ``fuse_elementwise=False`` calls every kernel as recorded.

    **Cache.** The generated module is written to ``cache_dir`` (default
    ``$NUMBAGRAD_CACHE_DIR`` or ``~/.cache/numbagrad``, subfolder
    ``compiled``) under a hash of its source, so Numba's ``cache=True`` lets
    a later process skip compiling it. The source holds no addresses, shapes,
    offsets, kernels or scalar arguments (integers in an int64 array, floats
    such as a mean's 1/N in a float64 one, passed bit for bit), so graphs of
    the same form share it: a new batch size records again but compiles
    nothing (``cache`` "loaded"), unless the new shapes make eager mode call
    other kernels or overloads (a different graph). ``step.stats`` reports
    each recording's record, codegen and jit time and the cache outcome. The
    folder must be this user's own with mode 0700 (created so); any other one
    (someone else's, group- or world-writable, a symlink, not writable) is
    refused, with one warning, for a private ``tempfile.mkdtemp`` folder, and a
    module found there runs only if it holds exactly the source its name is
    the hash of (else it is written again, with a warning).

    **Optimizer.** On the CPU the update is part of the compiled function:
    at a window boundary it checks the window's total, clips it and applies
    the SGD/Adam/AdamW update with the optimizer's own kernels (the same
    bits as ``opt.step()``), while the window's bookkeeping (positions,
    ``t``, schedules evaluated once per update) stays the optimizer's, in
    Python around the call. This needs a numbagrad optimizer whose params
    are all of one dtype and all reached by ``fn``, and fewer params than
    the threaded kernels' threshold (``NUMBAGRAD_PARALLEL_MIN``, 65536
    elements: above it the update dominates the step and eager dispatch
    picks its faster variant). Otherwise, and for micro-steps the window
    must handle itself (a ``step(grads)`` window, ``average="samples"``, a
    ``DistributedOptimizer``, a non-finite total), ``opt.step()`` runs after
    the compiled forward and backward, so every error and warning is eager
    mode's. ``fuse_update=False`` always calls ``opt.step()``.

    **CUDA.** numba-cuda offers no CUDA graphs, so the recorded launches are
    replayed back to back from Python: eager mode's launches, without tape
    or op work between them, except that each elementwise chain is one
    generated kernel with the chain's bits (``fuse_elementwise=False``: the
    same launches and counts as eager mode). The returned loss stays on the
    device.

    Arguments are positional. A compiled step is not for concurrent calls
    from several threads (it owns one set of buffers per signature);
    recording holds a global lock.
    """
    return CompiledStep(fn, optimizer, verify=verify, cache_dir=cache_dir,
                        fuse_update=fuse_update, backward=backward,
                        fuse_elementwise=fuse_elementwise)
