"""The join kernel (see ``kernels.cpu.join``): one launch writes up to eight
pieces, one thread per output element, each reading its piece's element."""
from __future__ import annotations

__all__ = ["concat"]   # the kernels this module registers

from numba import cuda, int64

from ._core import THREADS, Config, array_type, grid, kernel, launch


@kernel("concat", lambda dt: (array_type(dt, 3),) * 9 + (int64,) * 9)
def _concat_source(config: Config, dtype):
    def concat_kernel(out, a0, a1, a2, a3, a4, a5, a6, a7, n0, n1, n2, n3, n4, n5, n6, n7,
                      start):
        c1 = n0
        c2 = c1 + n1
        c3 = c2 + n2
        c4 = c3 + n3
        c5 = c4 + n4
        c6 = c5 + n5
        c7 = c6 + n6
        span = c7 + n7
        inner = out.shape[2]
        k = cuda.grid(1)
        while k < out.shape[0] * span * inner:
            i = k % inner
            j = (k // inner) % span
            o = k // (inner * span)
            if j < c1:
                v = a0[o, j, i]
            elif j < c2:
                v = a1[o, j - c1, i]
            elif j < c3:
                v = a2[o, j - c2, i]
            elif j < c4:
                v = a3[o, j - c3, i]
            elif j < c5:
                v = a4[o, j - c4, i]
            elif j < c6:
                v = a5[o, j - c5, i]
            elif j < c7:
                v = a6[o, j - c6, i]
            else:
                v = a7[o, j - c7, i]
            out[o, start + j, i] = v
            k += cuda.gridsize(1)

    return concat_kernel


def concat(out, a0, a1, a2, a3, a4, a5, a6, a7, n0, n1, n2, n3, n4, n5, n6, n7, start) -> None:
    """See ``kernels.cpu.concat``: one launch."""
    lengths = [int(n) for n in (n0, n1, n2, n3, n4, n5, n6, n7)]
    n = out.shape[0] * sum(lengths) * out.shape[2]
    if n:
        launch("concat", out.dtype, grid(n), THREADS, out, a0, a1, a2, a3, a4, a5, a6, a7,
               *lengths, int(start))
