"""Fusion: chains of elementwise kernel calls in a recording, planned as one loop each.

A chain is a run of the CPU elementwise kernels (``unary``,
``unary_backward``, ``binary``, the full-shape destinations of
``binary_backward``, ``axpby``) over one shape, all of one float dtype,
whose operands are the same C-contiguous elements (or a row, column or
scalar broadcast to them). Other calls between two links move ahead of the
chain when they touch none of its arrays (their arrays, byte ranges of the
same buffer, are compared; what a kernel does with an array is not known, so
any overlap stops the move). ``codegen`` turns each chain into one generated
``@njit`` loop that computes every element of every link in recording order
with the kernels' own scalar functions and expressions, each link's value
rounded to its array's dtype as the store would (so the bits are the
unfused step's: no fastmath flag, nothing to contract), and keeps a value
in a register where a later link reads it. A step temporary that only the
chain reads and that the chain wholly overwrites is never stored: it needs
no arena slot. A ``binary_backward`` whose other destination is summed over
a broadcast dimension (a bias's gradient) keeps that half as its kernel
call, with the fused half's ``need`` flag off, run right after the chain.

A chain with a link recorded as its threaded twin (``*_mt``) gets a
threaded twin too, over the elementwise kernels' blocks, which the step
picks from the thread governor's switch as it does a kernel's twin; each
element is computed by one thread with the same expression, so the two
agree bit for bit. A chain right after a threaded GEMM whose output it
reads folds into the GEMM's blocks (``_fold``).

The plan is the device's: a CUDA recording's chains (the CUDA elementwise
kernels' calls) become generated CUDA kernels (``cuda_chains``), from the
same per-element code (``_Spelling.body``).
"""
from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .analysis import _Program, _Ref
from .geometry import _c_contiguous, _c_strides

# the kernels (of each device's kernels/<device>/elementwise.py) a chain may
# hold, and their dtypes
KINDS = ("unary", "unary_backward", "binary", "binary_backward", "axpby")
_MODULES = {"cpu": "numbagrad.kernels.cpu.elementwise",
            "cuda": "numbagrad.kernels.cuda.elementwise"}
_DT = {"<f4": "np.float32", "<f8": "np.float64"}
# Chains over fewer elements stay kernel calls: their passes run in cache in
# microseconds, and each fused loop is new machine code to compile (about
# half a second) for a module that fuses. A batch size on the other side of
# this compiles its own module once.
MIN_ELEMENTS = 1 << 12
# A chain after a threaded GEMM runs inside its blocks (``_fold``); False
# keeps them apart (a benchmark's comparison).
FOLD = True
# On CUDA every chain fuses: each link saved is a launch and a pass over
# device memory, and the generated kernel compiles once per chain's source.
CUDA_MIN_ELEMENTS = 1


def fingerprint() -> str:
    """A hash of the sources a fused loop's machine code comes from, written into
    generated modules that fuse: Numba's cache of such a module is keyed by its
    own file only, so a change to these must change the module's name."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        from ..kernels import bodies, codes
        from ..kernels.cpu import _threads, elementwise, matmul, vmath
        h = hashlib.sha256()
        for mod in (bodies, codes, _threads, elementwise, matmul, vmath):
            with open(mod.__file__, "rb") as fh:
                h.update(fh.read())
        with open(os.path.abspath(__file__), "rb") as fh:
            h.update(fh.read())
        _FINGERPRINT = h.hexdigest()[:20]
    return _FINGERPRINT


_FINGERPRINT: str | None = None
_FORMS = {"unary": 0, "unary_grad": 1}


def scalar(kind: str, code: int, dtype: str) -> Any:
    """The compiled scalar function the elementwise kernels' loops reach for
    ``kind`` ("unary", "unary_grad", "binary", "binary_grad_a" or
    "binary_grad_b") and ``code`` on ``dtype``'s elements: the branch their
    ladder folds to with the code constant (a float32 fast form for the codes
    that have one, ``kernels/cpu/vmath.py``). Generated loops call it
    directly, so they do not compile the whole ladder."""
    from ..kernels import codes
    from ..kernels.cpu import vmath
    if kind in _FORMS and dtype == "<f4" and code in codes.FAST32:
        return vmath._fast_forms()[code][_FORMS[kind]]
    return vmath.EXACT[kind].py_func.__globals__[f"_{kind}_{code}"]


@dataclass
class _Operand:
    """One array a link reads or writes: ``full`` (the chain's elements, read
    through a C-contiguous (rows, cols) view) or broadcast (a (1, cols),
    (rows, 1) or (1, 1) view, read only)."""

    ref: _Ref
    full: bool
    key: tuple            # equal keys: the same elements (full) or the same view


@dataclass
class _Link:
    """One fused kernel call: ``kind``, the op ``code`` (None for axpby), its
    operands by role, its scalar arguments by role, and the binary_backward
    sides it computes ("a", "b")."""

    call: int
    kind: str
    code: int | None
    ops: dict[str, _Operand]
    scalars: dict[str, tuple]
    sides: tuple = ()
    rest: str | None = None     # binary_backward: the side summed by its own call
    threaded: bool = False      # recorded as the threaded twin (``*_mt``)


@dataclass
class Chain:
    """A planned fused loop: its links in order, its (rows, cols) frame, the
    calls kept for a binary_backward's summed half (run after the loop, with
    their new arguments), and which operands' values are never stored."""

    links: list[_Link] = field(default_factory=list)
    frame: tuple = (0, 0)
    broadcast: bool = False
    threaded: bool = False       # a link ran threaded: the loop has a threaded twin
    residual: list[tuple[int, list]] = field(default_factory=list)
    access: list[tuple] = field(default_factory=list)   # (ref, key, written, after)
    unstored: set = field(default_factory=set)          # keys of values kept in registers only
    fold: int | None = None     # the threaded product whose blocks the loop follows (``_fold``)


@dataclass
class FusionPlan:
    """What codegen emits, in order: ("call", index, args) for a recorded call
    (args: None for its recorded ones) and ("chain", Chain) for a fused loop;
    ``dropped``: the temps no loop stores (no arena slot)."""

    steps: list[tuple] = field(default_factory=list)
    chains: list[Chain] = field(default_factory=list)
    dropped: set = field(default_factory=set)

    def fused(self, prog: _Program) -> list[tuple[str, ...]]:
        """Each fused loop's kernel calls, by name (``CompiledStep.stats``), the
        product first for a loop folded into one."""
        return [(*(() if c.fold is None else (prog.calls[c.fold][1],)),
                 *(prog.calls[link.call][1] for link in c.links)) for c in self.chains]


def _root(r: _Ref, alias: dict[int, int]) -> tuple:
    return (r.kind, alias.get(r.index, r.index) if r.kind == "in" else r.index)


def _span(r: _Ref) -> tuple[int, int]:
    if any(n == 0 for n in r.shape):
        return (0, 0)
    lo = r.off + sum(min(0, (n - 1) * s) for n, s in zip(r.shape, r.strides))
    hi = r.off + sum(max(0, (n - 1) * s) for n, s in zip(r.shape, r.strides))
    return (lo, hi + r.dtype.itemsize)


class _Planner:
    def __init__(self, prog: _Program, module: str) -> None:
        self.prog = prog
        self.module = module
        self.alias = {i: j for j, i in prog.alias}

    def overlap(self, r: _Ref, q: _Ref) -> bool:
        if _root(r, self.alias) != _root(q, self.alias):
            return False
        (a, b), (c, d) = _span(r), _span(q)
        return a < d and c < b

    # ------------------------------------------------------------ one link
    def full(self, r: _Ref, n: int) -> _Operand | None:
        if r.dtype.str not in _DT or n == 0 or math.prod(r.shape) != n or \
                not _c_contiguous(r.shape, r.strides, r.dtype.itemsize):
            return None
        if r.kind == "in":
            root = self.prog.inputs.get(r.index)
            if root is None or not root.flags["C_CONTIGUOUS"]:   # host or device
                return None
        return _Operand(r, True, (_root(r, self.alias), r.off, r.dtype.str))

    def operand(self, r: Any, frame: tuple, dtype: np.dtype, write: bool = False
                ) -> _Operand | None:
        if not isinstance(r, _Ref) or r.dtype != dtype:
            return None
        if len(r.shape) == 2 and r.shape == frame:
            return self.full(r, frame[0] * frame[1])
        if write or len(r.shape) != 2:
            return None
        if all(m in (1, f) for m, f in zip(r.shape, frame)):
            return _Operand(r, False, ("b", _root(r, self.alias), r.desc()))
        return None

    def link(self, k: int) -> _Link | None:
        fn, name, rargs, rkw = self.prog.calls[k]
        threaded = name.endswith("_mt")
        name = name[:-3] if threaded else name
        if name not in KINDS or getattr(fn, "__module__", None) != self.module or rkw:
            return None
        link = self.link_of(k, name, rargs)
        if link is not None:
            link.threaded = threaded
        return link

    def link_of(self, k: int, name: str, rargs: list) -> _Link | None:
        s = list(rargs)
        if name == "axpby":
            x, y = s[1], s[3]
            if not (isinstance(x, _Ref) and isinstance(y, _Ref)):
                return None
            n = math.prod(y.shape)
            ox, oy = self.full(x, n), self.full(y, n)
            if ox is None or oy is None or x.dtype != y.dtype:
                return None
            return _Link(k, name, None, {"x": ox, "y": oy},
                         {"alpha": s[0], "beta": s[2]})
        code = s[0][1] if isinstance(s[0], tuple) else None
        if type(code) is not int:
            return None
        if name == "unary":
            out = s[2]
            frame = getattr(out, "shape", ())
            if len(frame) != 2:
                return None
            ops = {"out": self.operand(out, frame, out.dtype, True),
                   "x": self.operand(s[1], frame, out.dtype)}
            scalars = {"p": s[3], "alpha": s[4], "beta": s[5]}
        elif name == "unary_backward":
            dest = s[4]
            frame = getattr(dest, "shape", ())
            if len(frame) != 2:
                return None
            ops = {"dest": self.operand(dest, frame, dest.dtype, True)}
            for role, r in zip(("x", "y", "gout"), s[1:4]):
                ops[role] = self.operand(r, frame, dest.dtype, True)  # all full
            scalars = {"beta": s[5], "p": s[6]}
        elif name == "binary":
            out = s[3]
            frame = getattr(out, "shape", ())
            if len(frame) != 2:
                return None
            ops = {"out": self.operand(out, frame, out.dtype, True),
                   "a": self.operand(s[1], frame, out.dtype),
                   "b": self.operand(s[2], frame, out.dtype)}
            scalars = {}
        else:
            return self.backward_link(k, code, s)
        if any(o is None for o in ops.values()) or len(frame) != 2 or 0 in frame:
            return None
        return _Link(k, name, code, ops, scalars)

    def backward_link(self, k: int, code: int, s: list) -> _Link | None:
        """binary_backward: the sides whose operand has gout's shape (no sum)."""
        gout = s[3]
        frame = getattr(gout, "shape", ())
        if len(frame) != 2 or 0 in frame:
            return None
        dtype = gout.dtype
        ops = {"gout": self.operand(gout, frame, dtype, True),
               "a": self.operand(s[1], frame, dtype), "b": self.operand(s[2], frame, dtype)}
        if any(o is None for o in ops.values()):
            return None
        sides, rest = [], None
        for side, d, need in (("a", s[4], s[6]), ("b", s[7], s[9])):
            if not isinstance(need, tuple) or not bool(need[1]):
                continue
            if not ops[side].full:
                rest = side
                continue
            dest = self.operand(d, frame, dtype, True)
            if dest is None:
                return None
            ops["d" + side] = dest
            sides.append(side)
        if not sides:
            return None
        return _Link(k, "binary_backward", code, ops,
                     {"beta_a": s[5], "beta_b": s[8]}, tuple(sides), rest)

    # ------------------------------------------------------------ chains
    @staticmethod
    def writes(link: _Link) -> set[str]:
        return {"unary": {"out"}, "binary": {"out"}, "unary_backward": {"dest"},
                "axpby": {"y"}}.get(link.kind, {"d" + s for s in link.sides})

    def join(self, chain: Chain, link: _Link) -> bool:
        """Add ``link`` to ``chain`` when its elements map onto the chain's and
        no array it touches is touched otherwise (another view of it, or the
        summed half of a binary_backward, which runs after the loop)."""
        shape = _frame(link)
        broadcast = any(not o.full for o in link.ops.values())
        if chain.links and (shape[0] * shape[1] != chain.frame[0] * chain.frame[1] or
                            broadcast and chain.broadcast and shape != chain.frame):
            return False
        writes = self.writes(link)
        seen = list(chain.access)
        for role, o in link.ops.items():
            w = role in writes
            for q, qkey, qw, after in seen:
                if (w or qw) and self.overlap(o.ref, q) and (
                        after or o.key[0] == "b" or o.key != qkey):
                    return False
            seen.append((o.ref, o.key, w, False))
        residual = None
        if link.rest is not None:    # a binary_backward's summed half: its own call, after
            rargs = self.prog.calls[link.call][2]
            args = list(rargs)
            args[6 if link.rest == "b" else 9] = ("s", False)    # the fused side's need
            d = rargs[7 if link.rest == "b" else 4]
            mine = [link.ops["d" + s].ref for s in link.sides]
            touched = [d, *rargs[1:4]]
            if not isinstance(d, _Ref) or any(self.overlap(x, m) for x in touched
                                              for m in mine):
                return False
            residual = (link.call, args)
            seen += [(x, ("r",), False, True) for x in rargs[1:4]] + [(d, ("r",), True, True)]
        chain.access = seen
        if not chain.links or broadcast and not chain.broadcast:
            chain.frame = shape
        chain.broadcast = chain.broadcast or broadcast
        chain.threaded = chain.threaded or link.threaded
        chain.links.append(link)
        if residual is not None:
            chain.residual.append(residual)
        return True

    def clear_of(self, chain: Chain, k: int) -> bool:
        """Whether call ``k`` touches none of ``chain``'s arrays (it may run first)."""
        arrays = [a for a in self.prog.calls[k][2] if isinstance(a, _Ref)]
        arrays += [a for a in self.prog.calls[k][3].values() if isinstance(a, _Ref)]
        return not any(self.overlap(a, q) for a in arrays for q, _, _, _ in chain.access)


def _frame(link: _Link) -> tuple:
    """A link's (rows, cols): its destination's 2-D shape (axpby: one row)."""
    if link.kind == "axpby":
        return (1, math.prod(link.ops["y"].ref.shape))
    r = link.ops.get("out") or link.ops.get("dest") or link.ops["gout"]
    return r.ref.shape


def plan(prog: _Program) -> FusionPlan:
    """The fused loops of ``prog`` (its device's: ``prog.kern.name``) and the
    order codegen (CPU) or the replay (CUDA) issues everything in."""
    device = getattr(prog.kern, "name", "cpu")
    planner = _Planner(prog, _MODULES[device])
    least = MIN_ELEMENTS if device == "cpu" else CUDA_MIN_ELEMENTS
    out = FusionPlan()
    chain, moved = Chain(), []      # the open chain, and the calls moved ahead of it

    def close() -> None:
        nonlocal chain, moved
        if len(chain.links) >= 2 and chain.frame[0] * chain.frame[1] >= least:
            out.steps += [("call", k, None) for k in moved]
            out.steps.append(("chain", chain))
            out.steps += [("call", k, args) for k, args in chain.residual]
            out.chains.append(chain)
        else:   # nothing fused: the recorded order
            calls = sorted(moved + [link.call for link in chain.links])
            out.steps += [("call", k, None) for k in calls]
        chain, moved = Chain(), []

    for k in range(len(prog.calls)):
        link = planner.link(k)
        if link is not None:
            trial = Chain(list(chain.links), chain.frame, chain.broadcast, chain.threaded,
                          list(chain.residual), list(chain.access), set())
            if planner.join(trial, link):
                chain = trial
                continue
            close()
            trial = Chain()
            if planner.join(trial, link):
                chain = trial
                continue
            out.steps.append(("call", k, None))
            continue
        if chain.links and planner.clear_of(chain, k):
            moved.append(k)
            continue
        close()
        out.steps.append(("call", k, None))
    close()
    _unstored(prog, out)
    if device == "cpu" and FOLD:
        _fold(prog, out, planner)
    return out


# the threaded products a chain right after them may fold into: the role of
# each argument (the product's inputs, its output) by position
_PRODUCTS = {"gemm_mt": ((0, 1), 2), "linear_mt": ((0, 1, 2), 3)}
_MATMUL = "numbagrad.kernels.cpu.matmul"


def _fold(prog: _Program, out: FusionPlan, planner: _Planner) -> None:
    """A chain right after a threaded product (``gemm_mt``, ``linear_mt``)
    that reads the product's output runs inside the product's blocks: each
    thread computes its block of rows (or columns) by the product's own BLAS
    call, then the chain's elements of that block while they are in its
    cache. The blocks and calls are the product's, and the chain's elements
    do not depend on each other, so the bits are the unfused step's. Only
    when the chain's frame is the output's shape, the chain touches the
    output only as those same elements and writes none of the product's
    inputs (so no block reads what another writes)."""
    steps = out.steps
    for i in range(len(steps) - 1, 0, -1):
        step, before = steps[i], steps[i - 1]
        if step[0] != "chain" or before[0] != "call" or before[2] is not None:
            continue
        chain, k = step[1], before[1]
        fn, name, rargs, _ = prog.calls[k]
        if name not in _PRODUCTS or getattr(fn, "__module__", None) != _MATMUL:
            continue
        inputs, at = _PRODUCTS[name]
        res = rargs[at]
        full = planner.full(res, math.prod(getattr(res, "shape", ()))) \
            if isinstance(res, _Ref) else None
        if full is None or res.shape != chain.frame:
            continue
        touched = [(r, key, w) for r, key, w, after in chain.access if not after]
        if not any(key == full.key for _, key, _ in touched) or any(
                planner.overlap(r, res) and key != full.key for r, key, _ in touched) or any(
                w and isinstance(rargs[j], _Ref) and planner.overlap(r, rargs[j])
                for r, _, w in touched for j in inputs):
            continue
        chain.fold = k
        del steps[i - 1]


def fold_source(name: str, product: str, arrays: str) -> str:
    """The folded loop of chain ``name`` (``source``'s) after ``product``
    ("gemm_mt" or "linear_mt"): ``name_fold_mt`` and its serial twin
    ``name_fold_st`` (the same blocks on one thread, as ``gemm_st``), called
    with the product's recorded arguments, then the chain's ``arrays``."""
    if product == "gemm_mt":
        params, inner = "a, b, out, ta, tb, alpha, beta", "a.shape[0] if ta else a.shape[1]"
        whole, check, block = "_gemm", "", "_product_block"
    else:
        params, inner = "x, w, bias, out, has_bias, code, p", "x.shape[1]"
        whole, check, block = "_linear", "    _check_epilogue(code)", "_linear_piece"
    body = ["@njit(error_model='numpy', inline='always')",
            f"def {name}_fold({params}, {arrays}):",
            "    m, n = out.shape",
            f"    parts, step, by_rows = _blocks(m, n, {inner}, _num_threads())",
            "    if parts == 1:",
            f"        {whole}({params})",
            f"        {name}(0, m, 0, n, {arrays})",
            "        return",
            *([check] if check else []),
            "    previous = _set_blas_threads(1)",
            "    for q in prange(parts):",
            "        i0 = q * step",
            "        i1 = min(m if by_rows else n, i0 + step)",
            f"        {block}({params}, i0, i1, by_rows)",
            "        if by_rows:",
            f"            {name}(i0, i1, 0, n, {arrays})",
            "        else:",
            f"            {name}(0, m, i0, i1, {arrays})",
            "    _set_blas_threads(previous)"]
    for suffix, parallel in (("mt", ", parallel=True"), ("st", "")):
        body += ["", "", (f"@njit(cache=True, error_model='numpy'{parallel}, "
                          f"no_cpython_wrapper=True)"),
                 f"def {name}_fold_{suffix}({params}, {arrays}):",
                 f"    {name}_fold({params}, {arrays})"]
    return "\n".join(body) + "\n"


def _unstored(prog: _Program, out: FusionPlan) -> None:
    """The temps a chain writes afresh before anything reads them, through one
    view, that no call and no other chain touches and the step does not
    return: their values stay in registers (no store, no arena slot)."""
    alias = {i: j for j, i in prog.alias}
    users: dict[tuple, set] = {}     # root -> the chains touching it (-1: a call)
    for step in out.steps:
        if step[0] == "call":
            _, k, args = step
            _, _, rargs, rkw = prog.calls[k]
            for a in list(args or rargs) + list(rkw.values()):
                if isinstance(a, _Ref):
                    users.setdefault(_root(a, alias), set()).add(-1)
    for c, chain in enumerate(out.chains):
        for r, _, _, after in chain.access:
            if not after:
                users.setdefault(_root(r, alias), set()).add(c)
    kept = {_root(prog.loss, alias)} | {_root(r, alias) for r in prog.outputs or []}
    for c, chain in enumerate(out.chains):
        first: dict[tuple, bool] = {}     # root -> whether its first access writes afresh
        keys: dict[tuple, set] = {}
        for link in chain.links:
            fresh = _fresh(link)
            for role, o in link.ops.items():
                root = _root(o.ref, alias)
                first.setdefault(root, fresh.get(role, False))
                keys.setdefault(root, set()).add(o.key)
        for root, ok in first.items():
            if ok and root[0] == "tmp" and users.get(root) == {c} and root not in kept \
                    and len(keys[root]) == 1:
                chain.unstored |= keys[root]
                out.dropped.add(root[1])


def _fresh(link: _Link) -> dict[str, bool]:
    """Which of a link's destinations it writes without reading (beta == 0),
    and that no operand of the same link reads first."""
    s = link.scalars
    def zero(v):
        return float(v[1]) == 0.0
    if link.kind == "unary":
        ok = zero(s["beta"]) and link.ops["x"].key != link.ops["out"].key
        return {"out": ok}
    if link.kind == "axpby":
        return {"y": zero(s["beta"]) and link.ops["x"].key != link.ops["y"].key}
    if link.kind == "binary":
        out = link.ops["out"].key
        return {"out": out not in (link.ops["a"].key, link.ops["b"].key)}
    if link.kind == "unary_backward":
        d = link.ops["dest"].key
        return {"dest": zero(s["beta"]) and d not in
                (link.ops["x"].key, link.ops["y"].key, link.ops["gout"].key)}
    reads = {link.ops[r].key for r in ("a", "b", "gout")}
    return {"d" + side: zero(s["beta_" + side]) and link.ops["d" + side].key not in reads
            for side in link.sides}


# ---------------------------------------------------------------- source


class _Spelling:
    """How one device's generated code spells a chain's elements, scalar
    functions, casts and scalar arguments; ``body`` is the per-element code
    both devices share: every link in recording order, each value rounded to
    its array's dtype as a store would round it, a value kept in a register
    where a later link reads it, and no store for ``chain.unstored``.
    ``views``: the arrays the code takes (a full operand as a C view, (rows,
    cols) or 1-D where ``flat``; a broadcast one as recorded); ``scalars``:
    (recorded value, the type the kernel's launcher casts it to)."""

    pad = "            "
    flat = False     # full operands as 1-D views (else (rows, cols))

    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        self.arrays: dict[tuple, int] = {}
        self.views: list[_Ref] = []
        self.scalars: list[tuple] = []

    def array(self, o: _Operand) -> int:
        if o.key not in self.arrays:
            self.arrays[o.key] = len(self.views)
            if o.full:
                r, (rows, cols) = o.ref, self.chain.frame
                shape = (rows * cols,) if self.flat else (rows, cols)
                self.views.append(_Ref(r.kind, r.index, r.off, shape,
                                       _c_strides(shape, r.dtype.itemsize), r.dtype, "C"))
            else:
                self.views.append(o.ref)
        return self.arrays[o.key]

    def element(self, o: _Operand) -> str:
        """The element of operand ``o`` this iteration reads or writes."""
        raise NotImplementedError

    def call(self, kind: str, code: int, dts: str, args: str) -> str:
        """The scalar function ``kind`` of op ``code`` applied to ``args``."""
        raise NotImplementedError

    def cast(self, dts: str) -> str:
        """The function that rounds a value to dtype ``dts``."""
        raise NotImplementedError

    def exact(self, value: str, dts: str) -> str:
        """A scalar function's ``value`` as the type the kernels' dispatch over
        the codes gives it, where a link adds it to what its destination
        holds (rounding the sum only)."""
        return value

    def scalar_type(self, kind: str, role: str, dts: str) -> str:
        """What the ``kind`` kernel's launcher casts its scalar ``role`` to."""
        raise NotImplementedError

    def scalar(self, v: tuple, kind: str, role: str, dts: str) -> str:
        self.scalars.append((v, self.scalar_type(kind, role, dts)))
        return f"k{len(self.scalars) - 1}"

    def _widened(self, value: str, beta: tuple, dts: str) -> str:
        # with beta == 0 the value is only rounded to the dtype, which gives
        # the same bits whatever the type it is computed in
        return value if float(beta[1]) == 0.0 else self.exact(value, dts)

    def body(self) -> list[str]:
        chain, pad = self.chain, self.pad
        regs: dict[tuple, str] = {}
        body: list[str] = []

        def load(o: _Operand) -> str:
            return regs.get(o.key) or self.element(o)

        n = 0
        for link in chain.links:
            ops, code, kind = link.ops, link.code, link.kind
            dts = next(iter(ops.values())).ref.dtype.str
            s = link.scalars
            stores: list[tuple[_Operand, str]] = []
            if kind == "unary":
                p, a, b = (self.scalar(s[x], kind, x, dts) for x in ("p", "alpha", "beta"))
                f = self.call('unary', code, dts, load(ops['x']) + ', ' + p)
                y = f"{a} * {self._widened(f, s['beta'], dts)}"
                stores.append((ops["out"], _accumulate(y, s["beta"], b, ops["out"], load)))
            elif kind == "unary_backward":
                b, p = (self.scalar(s[x], kind, x, dts) for x in ("beta", "p"))
                args = f"{load(ops['x'])}, {load(ops['y'])}, {p}"
                f = self.call('unary_grad', code, dts, args)
                g = f"{load(ops['gout'])} * {self._widened(f, s['beta'], dts)}"
                stores.append((ops["dest"], _accumulate(g, s["beta"], b, ops["dest"], load)))
            elif kind == "binary":
                args = f"{load(ops['a'])}, {load(ops['b'])}"
                stores.append((ops["out"], self.call("binary", code, dts, args)))
            elif kind == "axpby":
                a, b = (self.scalar(s[x], kind, x, dts) for x in ("alpha", "beta"))
                stores.append((ops["y"], _accumulate(f"{a} * {load(ops['x'])}", s["beta"], b,
                                                     ops["y"], load)))
            else:
                for side in link.sides:
                    b = self.scalar(s["beta_" + side], kind, "beta_" + side, dts)
                    args = f"{load(ops['a'])}, {load(ops['b'])}"
                    dv = self._widened(self.call("binary_grad_" + side, code, dts, args),
                                       s["beta_" + side], dts)
                    g = f"0.0 + {load(ops['gout'])} * {dv}"
                    stores.append((ops["d" + side], _accumulate(g, s["beta_" + side], b,
                                                                ops["d" + side], load)))
            # every value of the link first (its operands read before any store)
            names = []
            for o, expr in stores:
                body.append(f"{pad}w{n} = {self.cast(dts)}({expr})")
                names.append(f"w{n}")
                n += 1
            for (o, _), var in zip(stores, names):
                regs[o.key] = var
                if o.key not in chain.unstored:
                    body.append(f"{pad}{self.element(o)} = {var}")
        return body


class _CpuSpelling(_Spelling):
    """The CPU's @njit loops: row ``i`` of each array is ``r<k>``, a column
    ``j``; scalar functions by code (``scalar``), collected in ``functions``."""

    def __init__(self, chain: Chain, functions: dict[str, tuple]) -> None:
        super().__init__(chain)
        self.functions = functions

    def element(self, o: _Operand) -> str:
        k = self.array(o)
        if o.full:
            return f"r{k}[j]"
        return f"r{k}[{'0' if o.ref.shape[1] == 1 else 'j'}]"

    def call(self, kind: str, code: int, dts: str, args: str) -> str:
        name = f"_{kind}_{code}_{dts[1:]}"
        self.functions[name] = (kind, code, dts)
        return f"{name}({args})"

    def cast(self, dts: str) -> str:
        return _DT[dts]

    def exact(self, value: str, dts: str) -> str:
        # A kernel's loop calls the codes' dispatch (kernels/cpu/vmath.py), whose
        # one return type is float64 for float32 elements too (some branches
        # compute in float64): the product with the gradient and the sum with
        # the destination then run in float64, rounded once at the store.
        # The chain calls one branch, which may return float32.
        return f"np.float64({value})" if dts == "<f4" else value

    def scalar_type(self, kind: str, role: str, dts: str) -> str:
        return _DT[dts]      # the CPU kernels take their scalars in the arrays' dtype


def source(chain: Chain, name: str, functions: dict[str, tuple]
           ) -> tuple[str, list[_Ref], list[tuple]]:
    """The @njit function of one chain: its source, the views it takes and its
    scalar arguments with the dtype each is cast to, as the kernels cast
    theirs (``_Spelling``); it is called as ``name(0, rows, 0, cols, *views,
    *scalars)`` (its threaded twin, when the chain has one, as
    ``name_mt(rows, cols, ...)``). ``functions`` gets the scalar functions it
    calls: name -> ``scalar``'s arguments."""
    spell = _CpuSpelling(chain, functions)
    body = spell.body()
    views, scalars = spell.views, spell.scalars
    a = "".join(f"a{k}, " for k in range(len(views)))
    k = ", ".join(f"k{n}" for n in range(len(scalars)))
    # the loop over a block of rows and columns is its own function: inlined
    # into a prange body a loop does not vectorise (kernels/cpu/elementwise.py)
    lines = ["@njit(cache=True, error_model='numpy', no_cpython_wrapper=True)",
             f"def {name}(r0, r1, lo, hi, {a}{k}):",
             "    for i in range(r0, r1):"]
    for key, n in spell.arrays.items():
        v = views[n]
        full = key[0] != "b"
        row = "i" if full or v.shape[0] != 1 else "0"
        cut = "0:1" if not full and v.shape[1] == 1 else "lo:hi"
        lines.append(f"        r{n} = a{n}[{row}, {cut}]")
    lines += ["        for j in range(hi - lo):", *body]
    if chain.threaded:   # the elementwise kernels' blocks, shared among threads
        lines += ["", "",
                  "@njit(cache=True, error_model='numpy', parallel=True, no_cpython_wrapper=True)",
                  f"def {name}_mt(rows, cols, {a}{k}):",
                  "    rb, cb, nr, nc = _grid(rows, cols)",
                  "    for t in prange(nr * nc):",
                  "        r0, c0 = (t // nc) * rb, (t % nc) * cb",
                  f"        {name}(r0, min(r0 + rb, rows), c0, min(c0 + cb, cols), {a}{k})"]
    lines.append("")
    return "\n".join(lines), views, scalars


def _accumulate(value: str, beta: tuple, b: str, dest: _Operand, load) -> str:
    """The kernels' ``v if beta == 0 else v + beta * dest``, the test taken now
    (beta is part of the recorded graph)."""
    if float(beta[1]) == 0.0:
        return value
    return f"({value}) + {b} * {load(dest)}"
