"""CUDA kernels over N-d strided arrays (see ``kernels.cpu.strided``): one
kernel source per rank (1 to ``MAX_RANK``), written out with one index per
dim, since a kernel indexes an array with a tuple of fixed length; the N-d
elementwise ones at ``MAX_RANK`` only, their operands padded with size-1 dims.
"""
from __future__ import annotations

# the kernels this module registers
__all__ = ["binary_nd", "binary_nd_backward", "expand_nd", "sum_to_nd", "unary_nd",
           "unary_nd_backward"]

from numba import cuda, float64, int64, types

from .. import codes
from ._core import THREADS, Config, array_type, checked_code, grid, kernel, launch
from .elementwise import _binary, _binary_grad_a, _binary_grad_b, _unary, _unary_grad

MAX_RANK = 6


def _unflatten(rank: int, shape: str, flat: str, prefix: str) -> list[str]:
    """Statements setting ``prefix0..`` to the C-order index of ``flat`` in ``shape``."""
    lines = [f"r = {flat}"]
    for d in range(rank - 1, 0, -1):
        lines += [f"{prefix}{d} = r % {shape}[{d}]", f"r //= {shape}[{d}]"]
    return lines + [f"{prefix}0 = r"]


def _compile(name: str, body: list[str], args: str) -> object:
    source = f"def {name}({args}):\n" + "".join(f"    {line}\n" for line in body)
    space: dict = {"cuda": cuda, "_binary": _binary, "_unary": _unary, "_unary_grad": _unary_grad,
                   "_binary_grad_a": _binary_grad_a, "_binary_grad_b": _binary_grad_b}
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


def _ix(rank: int, array: str = "", prefix: str = "i") -> str:
    """The index of element ``prefix0..`` in ``array`` broadcast (dims of size 1
    read at 0), or as is without ``array``."""
    if not array:
        return ", ".join(f"{prefix}{d}" for d in range(rank))
    return ", ".join(f"0 if {array}.shape[{d}] == 1 else {prefix}{d}" for d in range(rank))


def _grid_loop(rank: int, shape: str, count: str) -> list[str]:
    return (["k = cuda.grid(1)", "stride = cuda.gridsize(1)", f"while k < {count}:"]
            + ["    " + s for s in _unflatten(rank, shape, "k", "i")])


def _binary_nd_source(rank: int):
    def factory(config: Config, dtype):
        body = _grid_loop(rank, "out.shape", "out.size")
        body += [f"    out[{_ix(rank)}] = _binary(code, a[{_ix(rank, 'a')}], b[{_ix(rank, 'b')}])",
                 "    k += stride"]
        return _compile(f"binary_nd{rank}_kernel", body, "code, a, b, out")
    return factory


def _unary_nd_source(rank: int):
    def factory(config: Config, dtype):
        body = _grid_loop(rank, "out.shape", "out.size")
        body += [f"    v = alpha * _unary(code, x[{_ix(rank, 'x')}], p)",
                 "    if beta == 0.0:",
                 f"        out[{_ix(rank)}] = v",
                 "    else:",
                 f"        out[{_ix(rank)}] = v + beta * out[{_ix(rank)}]",
                 "    k += stride"]
        return _compile(f"unary_nd{rank}_kernel", body, "code, x, out, p, alpha, beta")
    return factory


def _unary_nd_backward_source(rank: int):
    def factory(config: Config, dtype):
        ix = _ix(rank)
        body = _grid_loop(rank, "dest.shape", "dest.size")
        body += [f"    g = gout[{ix}] * _unary_grad(code, x[{ix}], y[{ix}], p)",
                 "    if beta == 0.0:",
                 f"        dest[{ix}] = g",
                 "    else:",
                 f"        dest[{ix}] = g + beta * dest[{ix}]",
                 "    k += stride"]
        return _compile(f"unary_nd_backward{rank}_kernel", body, "code, x, y, gout, dest, beta, p")
    return factory


def _reduced(rank: int, dest: str, which: int, beta: str) -> list[str]:
    """One thread's element ``j0..`` of gradient ``dest`` (of operand ``which``):
    gout * d/d(operand) summed over the dims ``dest`` is broadcast along, in
    C order (``sum_to_nd``'s)."""
    grad = "_binary_grad_a" if which == 0 else "_binary_grad_b"
    lines = ["m = 1"]
    for d in range(rank):
        lines += [f"if {dest}.shape[{d}] == 1:", f"    m *= gout.shape[{d}]"]
    lines += ["acc = 0.0", "for t in range(m):", "    q = t"]
    for d in range(rank - 1, -1, -1):
        lines += [f"    if {dest}.shape[{d}] == 1:",
                  f"        i{d} = q % gout.shape[{d}]",
                  f"        q //= gout.shape[{d}]",
                  "    else:",
                  f"        i{d} = j{d}"]
    at = f"{dest}[{_ix(rank, prefix='j')}]"
    lines += [f"    acc += gout[{_ix(rank)}] * {grad}(code, a[{_ix(rank, 'a')}], "
              f"b[{_ix(rank, 'b')}])",
              f"if {beta} == 0.0:",
              f"    {at} = acc",
              "else:",
              f"    {at} = acc + {beta} * {at}"]
    return lines


def _binary_nd_backward_source(rank: int):
    def factory(config: Config, dtype):
        # Threads [0, na) write da, the next nb threads db: one launch for both.
        body = ["na = da.size if need_a else 0", "nb = db.size if need_b else 0",
                "k = cuda.grid(1)", "stride = cuda.gridsize(1)", "while k < na + nb:",
                "    if k < na:"]
        body += ["        " + s for s in _unflatten(rank, "da.shape", "k", "j")]
        body += ["        " + s for s in _reduced(rank, "da", 0, "beta_a")]
        body += ["    else:"]
        body += ["        " + s for s in _unflatten(rank, "db.shape", "k - na", "j")]
        body += ["        " + s for s in _reduced(rank, "db", 1, "beta_b")]
        body += ["    k += stride"]
        return _compile(f"binary_nd_backward{rank}_kernel", body,
                        "code, a, b, gout, da, beta_a, need_a, db, beta_b, need_b")
    return factory


for _rank in range(1, MAX_RANK + 1):
    kernel(f"expand_nd{_rank}", lambda dt, r=_rank: (array_type(dt, r, "A"),
                                                      array_type(dt, r, "A"), dt, dt)
           )(_expand_source(_rank))
    kernel(f"sum_to_nd{_rank}", lambda dt, r=_rank: (array_type(dt, r, "A"),
                                                      array_type(dt, r, "A"), dt, dt)
           )(_sum_to_source(_rank))


# The elementwise N-d kernels: one source each, at MAX_RANK (the launchers
# add leading size-1 dims), so the few of them compile once per dtype.
kernel(f"binary_nd{MAX_RANK}", lambda dt: (int64, *(array_type(dt, MAX_RANK, "A"),) * 3)
       )(_binary_nd_source(MAX_RANK))
kernel(f"unary_nd{MAX_RANK}", lambda dt: (int64, *(array_type(dt, MAX_RANK, "A"),) * 2, dt, dt,
                                          dt))(_unary_nd_source(MAX_RANK))
kernel(f"unary_nd_backward{MAX_RANK}", lambda dt: (int64, *(array_type(dt, MAX_RANK, "A"),) * 4,
                                                   float64, dt)
       )(_unary_nd_backward_source(MAX_RANK))
kernel(f"binary_nd_backward{MAX_RANK}", lambda dt: (
    int64, *(array_type(dt, MAX_RANK, "A"),) * 4, float64, types.boolean,
    array_type(dt, MAX_RANK, "A"), float64, types.boolean))(_binary_nd_backward_source(MAX_RANK))


def _padded(array):
    """``array`` with leading size-1 dims up to MAX_RANK (a view)."""
    from .indexing import as_strided    # (indexing imports this module)
    pad = MAX_RANK - len(array.shape)
    if pad == 0:
        return array
    return as_strided(array, (1,) * pad + tuple(array.shape), (0,) * pad + tuple(array.strides),
                      0)


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


def binary_nd(code, a, b, out) -> None:
    """See ``kernels.cpu.binary_nd``."""
    code = checked_code("binary_nd", code, codes.N_BINARY)
    _rank("binary_nd", out)
    if out.size:
        launch(f"binary_nd{MAX_RANK}", out.dtype, grid(out.size), THREADS, int(code), _padded(a),
               _padded(b), _padded(out))


def unary_nd(code, x, out, p, alpha, beta) -> None:
    """See ``kernels.cpu.unary_nd``."""
    code = checked_code("unary_nd", code, codes.N_UNARY)
    _rank("unary_nd", out)
    if out.size:
        dt = out.dtype.type
        launch(f"unary_nd{MAX_RANK}", out.dtype, grid(out.size), THREADS, int(code), _padded(x),
               _padded(out), dt(p), dt(alpha), dt(beta))


def unary_nd_backward(code, x, y, gout, dest, beta, p) -> None:
    """See ``kernels.cpu.unary_nd_backward``."""
    code = checked_code("unary_nd_backward", code, codes.N_UNARY)
    _rank("unary_nd_backward", dest)
    if dest.size:
        launch(f"unary_nd_backward{MAX_RANK}", dest.dtype, grid(dest.size), THREADS, int(code),
               _padded(x), _padded(y), _padded(gout), _padded(dest), float(beta),
               dest.dtype.type(p))


def binary_nd_backward(code, a, b, gout, da, beta_a, need_a, db, beta_b, need_b) -> None:
    """See ``kernels.cpu.binary_nd_backward``: one thread per gradient element."""
    code = checked_code("binary_nd_backward", code, codes.N_BINARY)
    _rank("binary_nd_backward", gout)
    n = (da.size if need_a else 0) + (db.size if need_b else 0)
    if n:
        launch(f"binary_nd_backward{MAX_RANK}", gout.dtype, grid(n), THREADS, int(code),
               _padded(a), _padded(b), _padded(gout), _padded(da), float(beta_a), bool(need_a),
               _padded(db), float(beta_b), bool(need_b))
