"""What the CPU kernels' serial and multi-threaded twins share.

A kernel ``foo`` with a threaded twin ``foo_mt`` (``parallel=True``, the
same signature, the same bits) is picked by ``kernels.call(kern, "foo", n,
...)`` when n >= ``MT_MIN`` (n: the elements the call touches): one
compare, and both are plain @njit kernels, so ``ng.compile`` records
whichever ran. ``MT_MIN`` is ``PARALLEL_MIN`` below, or never when
``NUMBAGRAD_PARALLEL_MIN`` is 0 or Numba has one thread.

Elementwise kernels split their output into blocks of ``SPAN`` elements,
each computed by the serial kernel's own per-element expression, so the
bits cannot depend on the split. Kernels that sum (the losses, a full
``sum_to``) add ``SPAN``-element spans into float64 partial sums and the
partials in order, in both twins, so they agree bit for bit whatever the
thread count.
"""
from __future__ import annotations

import sys

import numba
from llvmlite import ir
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .. import env_int

# numbagrad sets no OpenMP policy: Numba's workers wait as the runtime's
# default says (libgomp: spin a while, then sleep), as PyTorch's do, and
# importing numbagrad changes no environment variable. Spinning between
# kernels is what a step of many short threaded kernels wants (waking
# passively waiting workers cost 40-50 us a call): the compiled GPT step
# took 24-28 ms so against 29-37 ms with passively waiting workers. It
# is harmless because numbagrad never runs OpenBLAS's own threads
# (matmul.py: one thread pool, Numba's); with them, each pool's spinning
# threads took the core the other's next call needed. An explicit
# OMP_WAIT_POLICY or GOMP_SPINCOUNT is the user's to set.


def _cast_like(array, x):
    """``x`` rounded to ``array``'s dtype (jitted code only)."""
    return array.dtype.type(x)


@overload(_cast_like)
def _cast_like_impl(array, x):
    dt = array.dtype

    def impl(array, x):
        return dt(x)
    return impl


CHUNK = 1 << 14   # the optimizer kernels' elements per parallel task (and sumsq's order)
SPAN = 1 << 12    # elementwise/loss kernels' elements per task; the losses' summation unit

# Measured on the project's 2-core machine with scripts/time_threads.py (2
# threads, best of 3 interleaved blocks; threaded time / serial time):
#   compute-bound (tanh, binary_backward mul, softmax, cross-entropy, a full
#     sum_to): 0.50-0.84 from 2**14 in both dtypes;
#   memory-bound (relu, add, add with a broadcast bias, mse, axpby,
#     scaled_add): float32 1.3-1.7 at 2**14, 0.99-1.23 at 2**15, 0.82-0.95
#     at 2**16, 0.55-0.78 at 2**17; float64 1.1-1.5 at 2**14, 0.78-0.95 at
#     2**15, 0.61-0.66 at 2**16;
#   column sums (a bias gradient): 1.2-2.6 up to 2**17, so sum_to_mt runs
#     them as one task and the bias gradient calls sum_to.
# 2**16 is where every threaded kernel the ops use wins in both dtypes.
# With another process busy on a core a threaded call waits for it (seen:
# ~8 ms per call), so on a loaded machine set NUMBAGRAD_PARALLEL_MIN=0
# (never threaded). The optimizer kernels (optim.py) use this threshold too.
PARALLEL_MIN = env_int("NUMBAGRAD_PARALLEL_MIN", 1 << 16)
NEVER = sys.maxsize
MT_MIN = PARALLEL_MIN if PARALLEL_MIN and numba.config.NUMBA_NUM_THREADS > 1 else NEVER
# Measured while the workers waited passively (the policy before the one
# above), when a threaded call first woke them: 40-50 us here, more than a
# memory-bound kernel's whole work below ~2**20 elements; not measured again
# at the default policy. Then (scripts/time_threads.py, float32, threaded /
# serial): relu 13.6 at 2**16, 1.73 at 2**19, 0.85 at 2**21; add 8.2, 1.27,
# 0.64; relu' 4.4, 1.23, 0.59; mse 4.7, 1.12, 0.60; axpby 17.9, 1.64, 0.84;
# while tanh, softmax, cross-entropy and bce win (0.50-0.73) from 2**16. So
# a memory-bound call (``memory_bound``) takes its threaded twin only from
# NUMBAGRAD_PARALLEL_MIN_MEMORY elements, 2**21 by default.
MT_MIN_MEMORY = env_int("NUMBAGRAD_PARALLEL_MIN_MEMORY", 1 << 21) or NEVER
# kernels whose every call is memory-bound (binary_backward: the add's, the
# mul's; the broadcast operand's sums take its threaded twin from 2**21 too)
MEMORY_BOUND = frozenset({"axpby", "scaled_add", "binary", "binary_backward", "mse"})
_CHEAP: list = []   # [codes.CHEAP_UNARY], once memory_bound has asked


def memory_bound(name: str, args: tuple) -> bool:
    """Whether ``kernels.call(kern, name, n, *args)`` is a memory-bound call,
    threaded only from ``MT_MIN_MEMORY`` elements (asked for calls of at least
    ``MT_MIN`` elements only, so it costs small calls nothing)."""
    if name in MEMORY_BOUND:
        return True
    if name != "unary" and name != "unary_backward":
        return False
    if not _CHEAP:
        # unary codes as cheap as a copy (their records' ``cheap``; the others
        # call libm or, for float32's GELU, vmath's polynomials), read on first
        # use, not imported at the top: the kernels' cache stamps follow this
        # module's imports, and the threading helpers do not depend on the
        # records (``numbagrad._cache``)
        from ..codes import CHEAP_UNARY
        _CHEAP.append(CHEAP_UNARY)
    return args[0] in _CHEAP[0]


@intrinsic
def num_threads(typingctx):
    """Numba's current thread count inside jitted code, as ``numba.get_num_threads()``
    but through the threading layer's ``get_num_threads`` symbol (the one a
    prange's own launch calls), so that a kernel reading it still caches
    (``numba.get_num_threads`` reads a ctypes pointer, which Numba cannot
    cache). Typing it launches Numba's threads, which registers that symbol
    (as numba.get_num_threads does); tests/test_blas_threads.py runs it."""
    numba.get_num_threads()

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(cgutils.intp_t, []),
                                            "get_num_threads")
        return builder.call(fn, [])
    return numba.types.intp(), codegen
