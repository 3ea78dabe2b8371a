"""The fusion plan's chains as CUDA kernels (a CUDA step's replay runs them).

``fusion.plan`` finds the same chains in a CUDA recording as in a CPU one
(``kernels/cuda/elementwise.py``'s calls instead of the CPU's). Each chain
becomes one generated ``@cuda.jit`` kernel, a grid-stride loop with one
thread per element that computes every link in recording order with the
device's own scalar functions (the ladders the elementwise kernels call,
here with a constant code), each value rounded to its array's dtype as the
store would round it, its scalars cast as each kernel's launcher casts
them. So a fused step gives the unfused step's bits: the arithmetic and its
order are the kernels'. One launch replaces the chain's launches, and a
temporary only the chain reads is never written.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .analysis import _Ref
from .fusion import Chain, _Operand, _Spelling

# the type each elementwise launcher casts a scalar to: "dt" the arrays' dtype,
# "float" a Python float (float64 in the kernel)
_CASTS = {("unary", "p"): "dt", ("unary", "alpha"): "dt", ("unary", "beta"): "dt",
          ("unary_backward", "beta"): "float", ("unary_backward", "p"): "dt",
          ("axpby", "alpha"): "float", ("axpby", "beta"): "float",
          ("binary_backward", "beta_a"): "float", ("binary_backward", "beta_b"): "float"}
_NAMES = {"<f4": "float32", "<f8": "float64"}


class _CudaSpelling(_Spelling):
    """A grid-stride loop: element ``t`` of each full operand (a 1-D view),
    (i, j) of a broadcast one; the device ladders with a constant code."""

    pad = "        "
    flat = True

    def element(self, o: _Operand) -> str:
        k = self.array(o)
        if o.full:
            return f"a{k}[t]"
        rows, cols = o.ref.shape
        return f"a{k}[{'0' if rows == 1 else 'i'}, {'0' if cols == 1 else 'j'}]"

    def call(self, kind: str, code: int, dts: str, args: str) -> str:
        return f"_{kind}({code}, {args})"

    def cast(self, dts: str) -> str:
        return _NAMES[dts]

    def scalar_type(self, kind: str, role: str, dts: str) -> str:
        cast = _CASTS[(kind, role)]
        return dts if cast == "dt" else cast


def source(chain: Chain) -> tuple[str, list[_Ref], list[tuple]]:
    """The kernel ``fused(n, cols, *views, *scalars)`` of one chain: its
    source, the views it takes and its scalars with their casts."""
    spell = _CudaSpelling(chain)
    body = spell.body()
    views, scalars = spell.views, spell.scalars
    args = [f"a{k}" for k in range(len(views))] + [f"k{n}" for n in range(len(scalars))]
    lines = [f"def fused(n, cols, {', '.join(args)}):",
             "    t = cuda.grid(1)",
             "    stride = cuda.gridsize(1)",
             "    while t < n:"]
    if chain.broadcast:
        lines += ["        i = t // cols", "        j = t - i * cols"]
    lines += [*body, "        t += stride", ""]
    return "\n".join(lines), views, scalars


def signature(views: list[_Ref], scalars: list[tuple]) -> str:
    """The kernel's argument types as a Numba signature string (for PTX)."""
    def array(v: _Ref) -> str:
        return f"{_NAMES[v.dtype.str]}[{'::1' if len(v.shape) == 1 else ':, :'}]"
    parts = ["int64", "int64", *(array(v) for v in views),
             *("float64" if t == "float" else _NAMES[t] for _, t in scalars)]
    return f"void({', '.join(parts)})"


def python_function(text: str) -> Any:
    """The generated kernel's Python function (not yet ``cuda.jit``-ed)."""
    from numba import cuda, float32, float64

    from ..kernels.cuda import elementwise as ew
    space = {"cuda": cuda, "float32": float32, "float64": float64, "_unary": ew._unary,
             "_unary_grad": ew._unary_grad, "_binary": ew._binary,
             "_binary_grad_a": ew._binary_grad_a, "_binary_grad_b": ew._binary_grad_b}
    exec(compile(text, "<ng.compile fused CUDA chain>", "exec"), space)   # noqa: S102
    return space["fused"]


_kernels: dict[str, Any] = {}     # source -> its cuda.jit kernel (shared by signatures)
_lock = threading.Lock()


def kernel(text: str) -> Any:
    with _lock:
        k = _kernels.get(text)
        if k is None:
            from numba import cuda
            k = _kernels[text] = cuda.jit(python_function(text))
        return k


class Launcher:
    """One chain's kernel as a replayed call: ``launcher(*views)`` launches it
    over the chain's elements (counted by ``launch_count``)."""

    def __init__(self, chain: Chain) -> None:
        self.text, self.views, scalars = source(chain)
        self.kernel = kernel(self.text)
        rows, cols = chain.frame
        self.n, self.cols = rows * cols, cols
        self.scalars = tuple(float(v[1]) if t == "float" else np.dtype(t).type(v[1])
                             for v, t in scalars)
        self.signature = signature(self.views, scalars)

    def __call__(self, *views: Any) -> None:
        from ..kernels.cuda._core import THREADS, _counts, grid
        _counts["launches"] += 1
        self.kernel[grid(self.n), THREADS](self.n, self.cols, *views, *self.scalars)
