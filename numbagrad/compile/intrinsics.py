"""The two LLVM intrinsics the generated step is made of (``_array``, ``_call``).

How kernels are called: through the address of the C wrapper Numba compiles
for every @njit overload (``_call``), the overload eager dispatch picks for
the same argument types. The generated function runs the kernels' own
machine code (bit-identical results by construction), nothing is linked into
it or optimized again (so it compiles in a fraction of a second), and since
addresses, shapes, offsets and integer/boolean arguments live in ``meta``
(float arguments in the float64 ``fmeta``), one compiled function serves
every batch size of a graph and is cached on disk
without depending on the kernels' code. Generated modules import both from
``numbagrad.compile``.
"""
from __future__ import annotations

from typing import Any

import numba
import numpy as np
from llvmlite import ir as llvmir
from numba import types as _nbtypes
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import make_array, populate_array


@intrinsic
def _array(typingctx, meta, index, spec):
    """The array described by ``meta[index:]`` (address, shape, strides in
    bytes) with the type ``spec`` names ("<f4:2:C": dtype, ndim, layout); no
    copy, no owner (used by generated code, for buffers the step keeps alive)."""
    if not isinstance(spec, _nbtypes.StringLiteral) \
            or not isinstance(index, _nbtypes.IntegerLiteral):
        return None
    code, ndim, layout = spec.literal_value.split(":")
    ndim = int(ndim)
    array_type = _nbtypes.Array(numba.from_dtype(np.dtype(code)), ndim, layout)

    def codegen(context, builder, signature, args):
        meta_array = make_array(signature.args[0])(context, builder, args[0])
        k = signature.args[1].literal_value
        intp = context.get_value_type(_nbtypes.intp)

        def load(j):
            return builder.load(builder.gep(meta_array.data,
                                            [context.get_constant(_nbtypes.intp, k + j)]))
        out = make_array(array_type)(context, builder)
        item = context.get_data_type(array_type.dtype)
        populate_array(out, data=builder.inttoptr(load(0), item.as_pointer()),
                       shape=cgutils.pack_array(builder, [load(1 + d) for d in range(ndim)],
                                                intp),
                       strides=cgutils.pack_array(builder,
                                                  [load(1 + ndim + d) for d in range(ndim)], intp),
                       itemsize=context.get_constant(_nbtypes.intp, context.get_abi_sizeof(item)),
                       meminfo=None)
        return out._getvalue()
    return array_type(meta, index, spec), codegen


def _type_text(t: Any) -> str:
    """A kernel argument's numba type as the generated code checks it (an
    array's read-only flag is left out: kernels never write their inputs)."""
    t = _nbtypes.unliteral(t)
    if isinstance(t, _nbtypes.Array):
        return f"{t.dtype}[{t.ndim}{t.layout}]"
    return str(t)


@intrinsic
def _call(typingctx, address, args, expect):
    """Call the compiled kernel whose C wrapper is at ``address`` with the
    tuple ``args``, whose types must read ``expect`` (used by generated code).

    The wrapper is the one Numba builds for every @njit overload; calling it
    runs the machine code eager mode runs, and nothing is linked into (or
    re-optimized with) the generated function."""
    if not isinstance(args, _nbtypes.BaseTuple) or not isinstance(expect,
                                                                  _nbtypes.StringLiteral):
        return None
    got = "|".join(_type_text(t) for t in args.types)
    if got != expect.literal_value:
        raise numba.core.errors.TypingError(
            f"ng.compile: kernel arguments typed {got}, the kernel takes {expect.literal_value}")

    def codegen(context, builder, signature, llargs):
        addr, tup, _ = llargs
        argtys = [_nbtypes.unliteral(t) for t in signature.args[1].types]
        values = cgutils.unpack_tuple(builder, tup, len(argtys))
        fnty = llvmir.FunctionType(context.get_value_type(_nbtypes.none),
                                   [context.get_value_type(t) for t in argtys])
        builder.call(builder.inttoptr(addr, fnty.as_pointer()), values)
        return context.get_dummy_value()
    return _nbtypes.none(address, args, expect), codegen
