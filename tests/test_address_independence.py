"""No CPU reduction kernel's bits depend on where its buffers lie.

Each kernel that sums runs with one of its outputs placed 0 to 512 bytes
after the end of one of its inputs, and as far before its start (as
``ng.compile``'s arena, whose slots are 64 bytes apart, places them); every
placement must give the bits of the kernel writing into a separate array.
LLVM's runtime alias checks fall back to a scalar loop when a written
buffer starts close after a read one, which once reordered a vectorised sum.
(CUDA kernels reduce in a fixed grid order, whatever the addresses.)
"""
import numpy as np
import pytest

import numbagrad as ng
from numbagrad.kernels import codes as S

k = ng.kernels.get("cpu")
SHAPES = [(2, 6), (5, 8), (9, 13)]   # (2, 6) float64 reproduced the mse fallback
BASE = 8192
# bytes between the two buffers: adjacent, within and around LLVM's alias
# check windows (a vector of 16 or 64 bytes times an unroll of 4), up to 512
GAPS = (0, 4, 8, 16, 24, 40, 56, 64, 96, 120, 128, 192, 248, 256, 320, 384, 448, 504, 512)


def _mse(mt):
    fn = k.mse_mt if mt else k.mse
    return lambda p, t, loss, r: fn(p, t, loss, r, 1.0 / p.size)


def _bce(mt):
    fn = k.pointwise_loss_mt if mt else k.pointwise_loss
    return lambda x, t, loss, g: fn(S.BCE_LOGITS, x, t, loss, g, 1.0 / x.size)


def _xent(mt):
    fn = k.cross_entropy_mt if mt else k.cross_entropy

    def run(x, loss, g):
        fn(x, np.arange(x.shape[0]) % x.shape[1], loss, g, 1.0 / x.shape[0])
    return run


def _sum_to(mt, beta):
    fn = k.sum_to_mt if mt else k.sum_to
    return lambda x, out: fn(x, out, x.dtype.type(0.5), x.dtype.type(beta))


def _softmax(mt, axis, log):
    fn = k.softmax_mt if mt else k.softmax
    return lambda x, out: fn(x, out, axis, log)


def _softmax_backward(mt, axis, log):
    fn = k.softmax_backward_mt if mt else k.softmax_backward
    return lambda y, g, dest: fn(y, g, dest, 1.0, axis, log)


def _binary_backward(mt, code):
    fn = k.binary_backward_mt if mt else k.binary_backward
    return lambda a, b, g, da, db: fn(code, a, b, g, da, 1.0, True, db, 0.0, True)


def _gemm():
    return lambda a, b, out: k.gemm(a, b, out, False, True, 1.0, 1.0)


def _linear(code):
    return lambda x, w, bias, out: k.linear(x, w, bias, out, True, code, x.dtype.type(0.1))


def shapes_of(name, r, c):
    """(input shapes, output shapes) of one case for an (r, c) problem."""
    if name.startswith(("mse", "bce")):
        return [(r, c), (r, c)], [(), (r, c)]
    if name.startswith("xent"):
        return [(r, c)], [(), (r, c)]
    if name.startswith("sum_to"):
        kind = name.split("-")[1].removesuffix("_mt")
        return [(r, c)], [{"cols": (1, c), "rows": (r, 1), "all": (1, 1)}[kind]]
    if name.startswith("softmax_backward"):
        return [(r, c), (r, c)], [(r, c)]
    if name.startswith("softmax"):
        return [(r, c)], [(r, c)]
    if name.startswith("binary_backward"):
        return [(r, c), (1, c), (r, c)], [(r, c), (1, c)]
    r, c = 2 * r, 2 * c   # GEMMs: (18, 26) takes the BLAS path, the others the loop
    if name.startswith("gemm"):
        return [(r, c), (c + 3, c)], [(r, c + 3)]
    return [(r, c), (c + 3, c), (c + 3,)], [(r, c + 3)]   # linear


CASES = {}
for mt in (False, True):
    tag = "_mt" if mt else ""
    CASES[f"mse{tag}"] = _mse(mt)
    CASES[f"bce{tag}"] = _bce(mt)
    CASES[f"xent{tag}"] = _xent(mt)
    for kind, beta in (("cols", 1.0), ("rows", 0.0), ("all", 1.0)):
        CASES[f"sum_to-{kind}{tag}"] = _sum_to(mt, beta)
    for axis in (0, 1):
        for log in (False, True):
            CASES[f"softmax{'_log' * log}-{axis}{tag}"] = _softmax(mt, axis, log)
            CASES[f"softmax_backward{'_log' * log}-{axis}{tag}"] = _softmax_backward(mt, axis,
                                                                                   log)
    for code in (S.MUL, S.DIV):
        CASES[f"binary_backward-{code}{tag}"] = _binary_backward(mt, code)
CASES["gemm"] = _gemm()
CASES["linear-ident"] = _linear(S.IDENT)
CASES["linear-tanh"] = _linear(S.TANH)


def arena(nbytes=1 << 15):
    raw = np.empty(nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + nbytes]


def at(raw, offset, shape, dtype):
    size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return raw[offset:offset + size].view(dtype).reshape(shape)


def nbytes(shape, dtype):
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def run_case(fn, ins, outs, dtype, place=None):
    """Outputs' bytes with output ``place[1]`` put ``place[2]`` bytes after
    (``place[3]`` 1) or before (-1) input ``place[0]``."""
    ins = [a.copy() for a in ins]
    outs = [a.copy() for a in outs]
    if place is not None:
        i, j, gap, side = place
        raw = arena()
        moved_in = at(raw, BASE, ins[i].shape, dtype)
        moved_in[...] = ins[i]
        start = BASE + nbytes(ins[i].shape, dtype) + gap if side > 0 else \
            BASE - nbytes(outs[j].shape, dtype) - gap
        moved_out = at(raw, start, outs[j].shape, dtype)
        moved_out[...] = outs[j]
        ins[i], outs[j] = moved_in, moved_out
    fn(*ins, *outs)
    return [o.tobytes() for o in outs]


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("name", list(CASES))
def test_reduction_bits_do_not_depend_on_addresses(name, dtype):
    fn = CASES[name]
    rng = np.random.default_rng(0)
    gaps = [g for g in GAPS if g % np.dtype(dtype).itemsize == 0]
    for r, c in SHAPES:
        in_shapes, out_shapes = shapes_of(name, r, c)
        ins = [rng.normal(size=s).astype(dtype) for s in in_shapes]
        outs = [rng.normal(size=s).astype(dtype) for s in out_shapes]   # beta reads them
        want = run_case(fn, ins, outs, dtype)
        for i in range(len(ins)):
            for j, shape in enumerate(out_shapes):
                if shape == ():
                    continue
                for gap in gaps:
                    for side in (1, -1):
                        got = run_case(fn, ins, outs, dtype, (i, j, gap, side))
                        assert got == want, (f"{name} {np.dtype(dtype).name} ({r}, {c}): output "
                                             f"{j} {gap} bytes {'after' if side > 0 else 'before'}"
                                             f" input {i} gives other bits")


@pytest.mark.parametrize("threaded", [False, True], ids=["serial", "mt"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_the_optimizers_norm_does_not_depend_on_addresses(dtype, threaded):
    # sumsq (fastmath: the clipping norm at every window boundary) writes one
    # float64 next to the gradient buffer it reads, as in a compiled arena
    from numbagrad.kernels.cpu import optim as optim_kernels
    fn = optim_kernels._sumsq_parallel if threaded else optim_kernels._sumsq_serial
    rng = np.random.default_rng(3)
    for n in (5, 37, 300, 20000):
        g = rng.normal(size=n).astype(dtype)
        want = np.zeros(1)
        fn(g, want)
        for gap in (x for x in GAPS if x % 8 == 0):
            for side in (1, -1):
                raw = arena(1 << 18)
                moved = at(raw, BASE, (n,), dtype)
                moved[...] = g
                start = BASE + nbytes((n,), dtype) + gap if side > 0 else BASE - 8 - gap
                out = at(raw, start - start % 8, (1,), np.float64)
                fn(moved, out)
                assert out.tobytes() == want.tobytes(), (n, gap, side)
