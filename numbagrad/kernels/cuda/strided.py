"""CUDA kernels over N-d strided arrays (see ``kernels.cpu.strided``): one
kernel source per rank (1 to ``MAX_RANK``), written out with one index per
dim, since a kernel indexes an array with a tuple of fixed length.
"""
from __future__ import annotations

from numba import cuda

from ._core import THREADS, Config, array_type, grid, kernel, launch

MAX_RANK = 6


def _unflatten(rank: int, shape: str, flat: str, prefix: str) -> list[str]:
    """Statements setting ``prefix0..`` to the C-order index of ``flat`` in ``shape``."""
    lines = [f"r = {flat}"]
    for d in range(rank - 1, 0, -1):
        lines += [f"{prefix}{d} = r % {shape}[{d}]", f"r //= {shape}[{d}]"]
    return lines + [f"{prefix}0 = r"]


def _compile(name: str, body: list[str], args: str) -> object:
    source = f"def {name}({args}):\n" + "".join(f"    {line}\n" for line in body)
    space: dict = {"cuda": cuda}
    exec(compile(source, f"<numbagrad strided {name}>", "exec"), space)   # noqa: S102
    return space[name]


def _expand_source(rank: int):
    def factory(config: Config, dtype):
        out_ix = ", ".join(f"i{d}" for d in range(rank))
        x_ix = ", ".join(f"0 if x.shape[{d}] == 1 else i{d}" for d in range(rank))
        body = ["k = cuda.grid(1)", "stride = cuda.gridsize(1)", "while k < out.size:"]
        body += ["    " + s for s in _unflatten(rank, "out.shape", "k", "i")]
        body += [f"    v = alpha * x[{x_ix}]",
                 "    if beta == 0.0:",
                 f"        out[{out_ix}] = v",
                 "    else:",
                 f"        out[{out_ix}] = v + beta * out[{out_ix}]",
                 "    k += stride"]
        return _compile(f"expand_nd{rank}_kernel", body, "x, out, alpha, beta")
    return factory


def _sum_to_source(rank: int):
    def factory(config: Config, dtype):
        dest_ix = ", ".join(f"j{d}" for d in range(rank))
        g_ix = ", ".join(f"i{d}" for d in range(rank))
        body = ["k = cuda.grid(1)", "stride = cuda.gridsize(1)", "while k < dest.size:"]
        body += ["    " + s for s in _unflatten(rank, "dest.shape", "k", "j")]
        body += ["    m = 1"]
        body += [f"    if dest.shape[{d}] == 1:\n            m *= g.shape[{d}]"
                 for d in range(rank)]
        body += ["    acc = 0.0", "    for t in range(m):", "        q = t"]
        for d in range(rank - 1, -1, -1):
            body += [f"        if dest.shape[{d}] == 1:",
                     f"            i{d} = q % g.shape[{d}]",
                     f"            q //= g.shape[{d}]",
                     "        else:",
                     f"            i{d} = j{d}"]
        body += [f"        acc += g[{g_ix}]",
                 "    total = scale * acc",
                 "    if beta == 0.0:",
                 f"        dest[{dest_ix}] = total",
                 "    else:",
                 f"        dest[{dest_ix}] = total + beta * dest[{dest_ix}]",
                 "    k += stride"]
        return _compile(f"sum_to_nd{rank}_kernel", body, "g, dest, scale, beta")
    return factory


for _rank in range(1, MAX_RANK + 1):
    kernel(f"expand_nd{_rank}", lambda dt, r=_rank: (array_type(dt, r, "A"),
                                                      array_type(dt, r, "A"), dt, dt)
           )(_expand_source(_rank))
    kernel(f"sum_to_nd{_rank}", lambda dt, r=_rank: (array_type(dt, r, "A"),
                                                      array_type(dt, r, "A"), dt, dt)
           )(_sum_to_source(_rank))


def _rank(name: str, array) -> int:
    rank = len(array.shape)
    if not 1 <= rank <= MAX_RANK:
        raise ValueError(f"{name}: arrays of rank 1 to {MAX_RANK} on cuda, got shape "
                         f"{array.shape}")
    return rank


def expand_nd(x, out, alpha, beta) -> None:
    """See ``kernels.cpu.expand_nd``."""
    rank = _rank("expand_nd", out)
    if out.size:
        dt = out.dtype.type
        launch(f"expand_nd{rank}", out.dtype, grid(out.size), THREADS, x, out, dt(alpha),
               dt(beta))


def sum_to_nd(g, dest, scale, beta) -> None:
    """See ``kernels.cpu.sum_to_nd``: one thread per destination element."""
    rank = _rank("sum_to_nd", dest)
    if dest.size:
        dt = dest.dtype.type
        launch(f"sum_to_nd{rank}", dest.dtype, grid(dest.size), THREADS, g, dest, dt(scale),
               dt(beta))
