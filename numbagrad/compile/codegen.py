"""CPU code generation: the source of the generated @njit step and its ``meta``.

How arrays reach the generated function: op outputs become slices of one
flat arena per dtype that the compiled step owns; params, gradient
accumulators and other persistent arrays are reached through their owning
buffer's address, and the arguments' arrays are passed in. The generated
function therefore takes one int64 ``meta`` array (addresses, shapes,
offsets, flags), one float64 ``fmeta`` array (the kernels' float arguments)
plus one array per argument, so a call unboxes a handful of arrays however
big the graph.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba import types as _nbtypes

from ..kernels.cpu import _threads
from ..optim.fused import FusedUpdate
from . import fusion
from .analysis import _Program, _Ref
from .geometry import _address, _c_contiguous, _c_strides, _owner, _shape, _strides
from .geometry import _Unsupported
from .intrinsics import _type_text


_ALIGN = 64   # bytes between arena slots


def _scalar_expr(value: Any, meta: list, fmeta: list) -> str:
    """Source for a kernel's scalar argument, typed as eager mode types it.

    Its value is data (``m`` for integers and booleans, the float64 ``f`` for
    floats: a float32 round-trips through float64 exactly), never a literal,
    so a float that depends on a shape (a mean's 1/N) leaves the source, and
    Numba's cache key, the same for every batch size."""
    if isinstance(value, (bool, np.bool_)):
        meta.append(int(bool(value)))
        return f"(m[{len(meta) - 1}] != 0)"
    if isinstance(value, int):
        meta.append(value)
        return f"m[{len(meta) - 1}]"
    if isinstance(value, np.integer):
        meta.append(int(value))
        return f"np.{value.dtype.name}(m[{len(meta) - 1}])"
    if isinstance(value, float) and type(value) is float:
        fmeta.append(value)
        return f"f[{len(fmeta) - 1}]"
    if isinstance(value, np.floating) and value.dtype in (np.float32, np.float64):
        fmeta.append(float(value))
        if value.dtype == np.float64:
            return f"f[{len(fmeta) - 1}]"
        return f"np.float32(f[{len(fmeta) - 1}])"
    raise _Unsupported(f"a kernel argument of type {type(value).__name__}")


class _Codegen:
    """Source of the generated @njit step and the ``meta``/``fmeta`` it reads.

    A view of a buffer the step keeps (an arena slot, a param's flat buffer)
    is ``_array(m, k, spec)``: its address, shape and strides are ``meta``
    entries. A view of an argument is built from the array passed in."""

    def __init__(self, prog: _Program, boundary: FusedUpdate | None = None,
                 fuse: bool = True) -> None:
        self.prog = prog
        self.boundary = boundary
        # the elementwise chains run as fused loops (``fusion``), or every call as recorded
        self.plan = fusion.plan(prog) if fuse else fusion.FusionPlan(
            [("call", k, None) for k in range(len(prog.calls))])
        self.functions: list[str] = []      # the fused loops' @njit functions
        # (source with its name masked, product or None) -> the loop's name
        self.chain_names: dict[tuple, str] = {}
        self.scalars: dict[str, tuple] = {}  # the scalar functions they call
        self.threaded = False                # a fused loop has a threaded twin
        self.folded = False                  # a fused loop runs in a product's blocks
        self.step_threads = np.ones(1, np.int64)   # this step's threads switch (threads_on)
        self.opt_roots: list[np.ndarray] = []   # kind "opt": the optimizer's buffers
        self.meta: list[int] = []
        self.fmeta: list[float] = []   # the kernels' float arguments (``f``)
        self.lines: list[str] = []
        self.params: list[str] = ["m", "f"]
        self.per_call: list[tuple[str, int]] = []   # ("in"|"der", index) per array param
        self.keep: list[Any] = []                   # arrays the meta addresses point into
        self.args: dict[tuple, str] = {}
        self.views: dict[tuple, str] = {}
        self.arena_slots: dict[int, tuple[str, int]] = {}
        self.arenas: dict[str, np.ndarray] = {}

    def slot(self, value: int) -> str:
        self.meta.append(int(value))
        return f"m[{len(self.meta) - 1}]"

    def plan_arenas(self) -> None:
        sizes: dict[str, int] = {}
        for k, t in enumerate(self.prog.temps):
            if k in self.plan.dropped:    # its values stay in a fused loop's registers
                continue
            dt = np.dtype(t.dtype)
            at = sizes.get(dt.str, 0)
            step = max(1, _ALIGN // dt.itemsize)
            self.arena_slots[k] = (dt.str, at)
            sizes[dt.str] = at + -(-max(t.size, 1) // step) * step
        for dts, total in sizes.items():
            self.arenas[dts] = np.zeros(max(total, 1), np.dtype(dts))
        self.keep += list(self.arenas.values())

    def address(self, r: _Ref) -> int:
        """Where the view ``r`` of a kept buffer starts in this process."""
        if r.kind == "tmp":
            dts, at = self.arena_slots[r.index]
            return self.arenas[dts].__array_interface__["data"][0] + at * int(
                np.dtype(dts).itemsize) + r.off
        root = (self.opt_roots if r.kind == "opt" else self.prog.fixed)[r.index]
        if not isinstance(root, np.ndarray):
            raise _Unsupported("a persistent array that is not a host array")
        self.keep.append(root)
        return root.__array_interface__["data"][0] + r.off

    def arg_root(self, r: _Ref) -> tuple[str, tuple, tuple]:
        key = (r.kind, r.index)
        var = self.args.get(key)
        if var is None:
            var = self.args[key] = f"a{len(self.per_call)}"
            self.params.append(var)
            self.per_call.append(key)
        if r.kind == "in":
            data = self.prog.inputs[r.index]
            return var, _shape(data), _strides(data)
        shape = self.prog.derived_shapes[r.index]    # a C-contiguous converted copy
        return var, shape, _c_strides(shape, r.dtype.itemsize)

    def view(self, r: _Ref) -> str:
        key = r.desc()
        if key in self.views:
            return self.views[key]
        if r.off % r.dtype.itemsize:
            raise _Unsupported("a misaligned view")
        if r.kind in ("tmp", "fix", "opt"):
            k = len(self.meta)
            self.meta += [self.address(r), *r.shape, *r.strides]
            spec = f"{r.dtype.str}:{len(r.shape)}:{r.layout}"
            return self.bind(key, f"_array(m, {k}, {spec!r})")
        var, rshape, rstrides = self.arg_root(r)
        item = r.dtype.itemsize
        if r.off == 0 and (r.shape, r.strides) == (rshape, rstrides):
            self.views[key] = var
            return var
        if r.off == 0 and len(r.shape) == 2 and r.shape == rshape[::-1] \
                and r.strides == rstrides[::-1]:
            return self.bind(key, f"{var}.T")
        if _c_contiguous(rshape, rstrides, item):
            flat = f"{var}.reshape(({self.slot(math.prod(rshape))},))"
        elif len(rshape) == 2 and _c_contiguous(rshape[::-1], rstrides[::-1], item):
            flat = f"{var}.T.reshape(({self.slot(math.prod(rshape))},))"
        else:
            raise _Unsupported("a view of a non-contiguous argument")
        o, size, shape = r.off // item, math.prod(r.shape), r.shape
        # the slice's bounds are meta too: they move with the batch size
        cut = f"{flat}[{self.slot(o)}:{self.slot(o + size)}]"
        if r.layout == "C" or len(shape) == 0:
            dims = "".join(f"{self.slot(n)}, " for n in shape)
            return self.bind(key, f"{cut}.reshape(({dims}))")
        if r.layout == "F" and len(shape) == 2:
            dims = f"{self.slot(shape[1])}, {self.slot(shape[0])}"
            return self.bind(key, f"{cut}.reshape(({dims})).T")
        raise _Unsupported("a strided view of an argument")

    def output_arrays(self) -> list[np.ndarray]:
        """Host views of the arena slots that hold the outputs (inference)."""
        out = []
        for r in self.prog.outputs or []:
            dts, at = self.arena_slots[r.index]
            arena = self.arenas[dts]
            out.append(np.ndarray(r.shape, r.dtype, buffer=arena, strides=r.strides,
                                  offset=at * arena.itemsize + r.off))
        return out

    def bind(self, key: tuple, expr: str) -> str:
        var = f"v{len(self.views)}"
        self.lines.append(f"    {var} = {expr}")
        self.views[key] = var
        return var

    def kernel(self, fn: Callable, cargs: tuple, kwargs: dict) -> tuple[str, str]:
        """(meta slot of the address, type text) of the overload eager mode ran."""
        if not isinstance(fn, numba.core.registry.CPUDispatcher):
            raise _Unsupported(f"{getattr(fn, '__name__', fn)} is not an @njit kernel")
        if kwargs:
            raise _Unsupported("a kernel called with keyword arguments")
        sig = tuple(numba.typeof(a) for a in cargs)
        cres = fn.overloads.get(sig)
        if cres is None:   # eager dispatch converted to another overload: keep that one
            raise _Unsupported(f"no exact overload of {fn.__name__} for {sig}")
        if cres.signature.return_type != _nbtypes.none:
            raise _Unsupported(f"kernel {fn.__name__} returns a value")
        addr = cres.library.get_pointer_to_function(cres.fndesc.llvm_cfunc_wrapper_name)
        if not addr:
            raise _Unsupported(f"kernel {fn.__name__} has no C wrapper")
        return self.slot(addr), "|".join(_type_text(t) for t in sig)

    def serial_twin(self, name: str, cargs: tuple) -> str | None:
        """For a threaded twin (``name`` ends in "_mt"), the meta slot of the
        overload for the same arguments (compiled now if eager mode never ran
        it) of the kernel the step runs while the thread governor has the
        threads off (``_threads.governed_serial``, ``ALLOWED``); None for any
        other kernel."""
        serial = _threads.governed_serial(self.prog.kern, name)
        if serial is None:
            return None
        sig = tuple(numba.typeof(a) for a in cargs)
        if sig not in serial.overloads:
            serial.compile(sig)
        return self.kernel(serial, cargs, {})[0]

    def threads_on(self) -> str:
        """The test that picks a threaded twin: the thread governor's switch
        (``_threads.ALLOWED``) and this step's own (``step_threads``: the
        runner's measured choice, ``_NjitEntry``), both 1."""
        for key, flag in ((("governor",), _threads.ALLOWED), (("own threads",), self.step_threads)):
            if key not in self.views:
                k = len(self.meta)
                self.keep.append(flag)
                self.meta += [flag.__array_interface__["data"][0], 1, flag.itemsize]
                self.bind(key, f"_array(m, {k}, '<i8:1:C')")
        return f"({self.views[('governor',)]}[0] != 0 and {self.views[('own threads',)]}[0] != 0)"

    def arg(self, a: Any) -> str:
        return self.view(a) if isinstance(a, _Ref) else _scalar_expr(a[1], self.meta, self.fmeta)

    def opt_ref(self, a: np.ndarray) -> _Ref:
        root = _owner(a)
        for k, r in enumerate(self.opt_roots):
            if r is root:
                break
        else:
            k = len(self.opt_roots)
            self.opt_roots.append(root)
        return _Ref("opt", k, _address(a) - _address(root), _shape(a), _strides(a), a.dtype,
                    numba.typeof(a).layout)

    def boundary_call(self) -> list[str]:
        """The optimizer's window boundary, run when its ``ctl[0]`` says so."""
        fused = self.boundary
        refs = [self.opt_ref(a) if isinstance(a, np.ndarray) else ("s", a)
                for a in fused.args]
        addr, expect = self.kernel(fused.kernel, fused.args, {})
        ctl = self.view(self.opt_ref(fused.ctl))
        parts = ", ".join(self.arg(a) for a in refs)
        return [f"    if {ctl}[0] != 0.0:",
                f"        _call({addr}, ({parts},), {expect!r})   # the optimizer's update"]

    def chain(self, chain: fusion.Chain) -> str:
        """The call of one fused loop (its function goes to ``functions``)."""
        name = f"_fused{len(self.functions)}"
        text, views, scalars = fusion.source(chain, name, self.scalars)
        product = None if chain.fold is None else self.prog.calls[chain.fold][1]
        arrays = ", ".join([*(f"a{k}" for k in range(len(views))),
                            *(f"k{k}" for k in range(len(scalars)))])
        # a loop the step already has (each layer's bias + activation) is compiled once
        known = self.chain_names.setdefault((text.replace(name, "_fused?"), product), name)
        if known == name:
            self.functions.append(text)
            if product is not None:
                self.functions.append(fusion.fold_source(name, product, arrays))
        name = known
        rows, cols = (self.slot(n) for n in chain.frame)
        args = [*(self.view(v) for v in views),
                *(f"{dtype}({self.arg(v)})" for v, dtype in scalars)]
        calls = " ".join(self.prog.calls[link.call][1] for link in chain.links)
        if chain.fold is not None:    # inside the blocks of the threaded product before it
            rargs = self.prog.calls[chain.fold][2]
            self.folded = True
            args = [*(self.arg(a) for a in rargs), *args]
            return "\n".join([f"    if {self.threads_on()}:",
                              f"        {name}_fold_mt({', '.join(args)})   # {product} {calls}",
                              "    else:", f"        {name}_fold_st({', '.join(args)})"])
        call = f"{name}(0, {rows}, 0, {cols}, {', '.join(args)})   # fused: {calls}"
        if not chain.threaded:
            return f"    {call}"
        self.threaded = True   # the thread governor's choice, read each call
        return "\n".join([f"    if {self.threads_on()}:",
                          f"        {name}_mt({rows}, {cols}, {', '.join(args)})",
                          "    else:", f"        {call}"])

    def fused_header(self) -> list[str]:
        """The fused loops' imports and functions (none: the header of old)."""
        if not self.functions:
            return []
        threads = ["from numba import prange",
                   "from numbagrad.kernels.cpu.elementwise import _grid"] if self.threaded else []
        if self.folded:
            threads = ["from numba import prange",
                       "from numbagrad.kernels.cpu._threads import num_threads as _num_threads",
                       ("from numbagrad.kernels.cpu.matmul import _blocks, _check_epilogue, "
                        "_set_blas_threads"),
                       ("from numbagrad.kernels.cpu.matmul import gemm as _gemm, linear as "
                        "_linear, linear_block as _linear_piece, product_block as "
                        "_product_block"), *threads[1:]]
        return [*threads, "from numbagrad.compile.fusion import scalar",
                f"# the kernels' sources: {fusion.fingerprint()}", "",
                *(f"{name} = scalar{args!r}" for name, args in sorted(self.scalars.items())),
                "", "", *self.functions]

    def source(self) -> str:
        prog = self.prog
        self.plan_arenas()
        # the ops' checks of indices and labels come before any kernel: a bad value
        # raises before anything is written (the runner then runs the call eagerly,
        # which raises the op's own error); bounds are meta, so the source is not
        # specific to them
        checks = []
        for r, low, high, exclude, allow in prog.checks:
            var = self.view(r)
            lo, hi, ex, al = (self.slot(v) for v in (low, high, exclude, allow))
            checks += [f"    for v in {var}.flat:",
                       f"        if (v < {lo} or v >= {hi} or v == {ex}) and v != {al}:",
                       "            raise ValueError('ng.compile: an index or label is out of "
                       "range')"]
        body = []
        for step in self.plan.steps:
            if step[0] == "chain":
                body.append(self.chain(step[1]))
                continue
            _, k, args = step
            fn, name, rargs, _ = prog.calls[k]
            cargs, kwargs = prog.originals[k]
            addr, expect = self.kernel(fn, cargs, kwargs)
            serial = self.serial_twin(name, cargs)
            if serial is not None:   # the thread governor's choice, read each call
                addr = f"{addr} if {self.threads_on()} else {serial}"
            parts = [self.arg(a) for a in args or rargs]
            body.append(f"    _call({addr}, ({', '.join(parts)},), {expect!r})   # {name}")
        if self.boundary is not None:
            body += self.boundary_call()
        if prog.outputs is None:     # a training step: the loss's value
            index = ", ".join(["0"] * len(prog.loss.shape)) or "()"
            tail = f"    return {self.view(prog.loss)}[{index}]"
        else:                        # inference: the runner copies the outputs
            for r in prog.outputs:
                if r.kind != "tmp":
                    raise _Unsupported("an output that is not an op output (an argument, "
                                       "param or constant returned as it is)")
            tail = "    return 0"
        lines = ['"""Generated by numbagrad.compile (a recorded step); do not edit.',
                 "",
                 "Kernels are called through the addresses in ``m`` (their compiled C",
                 'wrappers), arrays are views of the buffers whose addresses ``m`` holds."""',
                 "import numpy as np",
                 "from numba import njit",
                 "from numbagrad.compile import _array, _call",
                 *self.fused_header(),
                 "",
                 "",
                 "@njit(cache=True)",
                 f"def step({', '.join(self.params)}):",
                 *self.lines, *checks, *body,
                 tail,
                 ""]
        return "\n".join(lines)
