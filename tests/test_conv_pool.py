"""The fused conv2d -> relu -> max_pool2d (``ops/conv_pool.py``, reached by
``nn.Sequential``): bit for bit the three ops' values and gradients (both
dtypes, both devices, ties and nans, overlapping and padded windows),
PyTorch's chain to rounding, its fallbacks, its errors before any kernel
runs, the NHWC kernels' threaded twins, and a compiled CNN against eager."""

import re

import numpy as np
import pytest

import numbagrad as ng
from conftest import (KernelNames, compiled_matches_eager, cuda_dev, sequential_like_torch,
                      small_cnn)
from numbagrad import kernels
from numbagrad.kernels import cpu
from numbagrad.ops import conv as conv_ops
from numbagrad.ops.conv_pool import _conv2d_relu_max_pool2d as fused
from numbagrad.ops.pool import _relu_max_pool2d

torch = pytest.importorskip("torch")
F = torch.nn.functional

# (x shape, weight shape, conv keywords, pool keywords): all on the columns path
CASES = [
    ((3, 2, 6, 6), (4, 2, 3, 3), dict(padding=1), dict(kernel_size=2)),
    ((2, 3, 7, 5), (2, 3, 3, 3), dict(padding=1), dict(kernel_size=2)),       # odd: unrolled
    ((2, 4, 6, 6), (3, 4, 3, 3), dict(padding=1), dict(kernel_size=3, pool_stride=1)),  # overlap
    ((1, 4, 7, 7), (5, 4, 3, 3), dict(stride=2, padding=2),
     dict(kernel_size=3, pool_stride=2, pool_padding=1, ceil_mode=True)),
    ((2, 4, 8, 8), (2, 4, 2, 2), dict(dilation=2),
     dict(kernel_size=2, pool_stride=1, pool_dilation=2)),
    ((4, 5, 5), (3, 4, 3, 3), dict(padding=1), dict(kernel_size=2)),          # unbatched
]


def _data(xs, ws, dtype, seed=0):
    """Small integers (exact sums: many tied windows, and relu's zeros) and a nan."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-2, 3, size=xs).astype(dtype)
    x.reshape(-1)[3] = np.nan
    w = rng.integers(-1, 2, size=ws).astype(dtype)
    b = rng.integers(-1, 2, size=ws[0]).astype(dtype)
    return x, w, b


def _run(fn, arrays, g_seed, dev=None):
    """(out, grads by input) of ``fn`` on fresh params, a weighted-sum loss."""
    ps = [ng.param(a) if dev is None else dev.param(a) for a in arrays]
    with ng.grad_tape():
        out = fn(*ps)
        g = np.random.default_rng(g_seed).normal(size=out.shape).astype(arrays[0].dtype)
        loss = (out * (ng.tensor(g) if dev is None else dev.tensor(g))).sum()
    grads = ng.backward(loss)
    host = (lambda a: a) if dev is None else dev.host
    return out.numpy(), [np.asarray(host(grads[p.id])) for p in ps]


def _unfused(conv_kw, pool_kw):
    pool = dict(kernel_size=pool_kw["kernel_size"], stride=pool_kw.get("pool_stride"),
                padding=pool_kw.get("pool_padding", 0),
                dilation=pool_kw.get("pool_dilation", 1),
                ceil_mode=pool_kw.get("ceil_mode", False))
    return lambda x, w, b=None: _relu_max_pool2d(ng.conv2d(x, w, b, **conv_kw), **pool)


def _bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs, ws, conv_kw, pool_kw", CASES)
def test_fused_gives_the_three_ops_bits(xs, ws, conv_kw, pool_kw, dtype):
    x, w, b = _data(xs, ws, dtype)
    for arrays in ((x, w, b), (x, w)):
        seen, unfused = KernelNames(), KernelNames()
        with kernels.observe(seen):
            out, grads = _run(lambda *p: fused(*p, **conv_kw, **pool_kw), arrays, 1)
        assert "conv_relu_max_pool2d_nhwc" in seen.names and "max_pool2d_backward_nhwc" in seen.names
        with kernels.observe(unfused):
            want, want_grads = _run(_unfused(conv_kw, pool_kw), arrays, 1)
        # both reorderings gone, and the bias's fill (the pool adds it)
        assert unfused.names.count("expand_nd") - seen.names.count("expand_nd") == \
            len(arrays)   # (x, w, b): 3, (x, w): 2
        _bits(out, want)
        for got, exp in zip(grads, want_grads):
            _bits(got, exp)


@pytest.mark.parametrize("xs, ws, conv_kw, pool_kw", CASES[:4])
def test_fused_matches_torchs_chain(xs, ws, conv_kw, pool_kw):
    x, w, b = _data(xs, ws, np.float64, seed=2)
    x.reshape(-1)[3] = 0.5                    # (torch propagates a nan's gradient elsewhere)
    out, grads = _run(lambda *p: fused(*p, **conv_kw, **pool_kw), (x, w, b), 3)
    ts = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    tconv = {k: v for k, v in conv_kw.items()}
    want = F.max_pool2d(F.relu(F.conv2d(*ts, **tconv)), pool_kw["kernel_size"],
                        pool_kw.get("pool_stride"), pool_kw.get("pool_padding", 0),
                        pool_kw.get("pool_dilation", 1), pool_kw.get("ceil_mode", False))
    g = np.random.default_rng(3).normal(size=tuple(want.shape))
    (want * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=1e-12, atol=1e-12)
    for got, t in zip(grads, ts):
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_groups_and_the_direct_path_run_as_two_ops(monkeypatch):
    x, w, b = _data((2, 4, 6, 6), (4, 2, 3, 3), np.float64)
    seen = KernelNames()
    with kernels.observe(seen):
        out, grads = _run(lambda *p: fused(*p, padding=1, groups=2, kernel_size=2), (x, w, b), 4)
    assert "relu_max_pool2d" in seen.names and "conv_relu_max_pool2d_nhwc" not in seen.names
    want, want_grads = _run(lambda *p: _relu_max_pool2d(ng.conv2d(*p, padding=1, groups=2), 2),
                            (x, w, b), 4)
    _bits(out, want)
    monkeypatch.setattr(conv_ops, "DIRECT_MIN_OUTPUTS", 1)
    x, w, b = _data((2, 1, 6, 6), (3, 1, 3, 3), np.float64)
    seen = KernelNames()
    with kernels.observe(seen):
        fused(ng.tensor(x), ng.tensor(w), ng.tensor(b), padding=1, kernel_size=2)
    assert "conv2d_direct" in seen.names and "relu_max_pool2d" in seen.names


def test_bad_arguments_raise_before_any_kernel_runs():
    x, w, b = _data((2, 2, 4, 4), (3, 2, 3, 3), np.float64)
    p = ng.param(w)
    before = p.numpy().copy()
    for kw, what in ((dict(kernel_size=9), "max_pool2d: input (the convolution's output"),
                     (dict(kernel_size=2, pool_padding=2), "padding (2, 2) must be at most half"),
                     (dict(kernel_size=0), "kernel_size")):
        seen = KernelNames()
        with kernels.observe(seen), pytest.raises(ValueError, match=re.escape(what)):
            with ng.grad_tape():
                fused(ng.tensor(x), p, ng.tensor(b), padding=1, **kw)
        assert seen.names == [] and np.array_equal(p.numpy(), before)
    with pytest.raises(ValueError, match="conv2d: input .* has 2 channels"):
        fused(ng.tensor(x), ng.tensor(w[:, :1]), kernel_size=2)


@pytest.mark.parametrize("beta", [0.0, 1.0])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nhwc_twins_give_the_serial_bits(dtype, beta):
    """Both NHWC kernels (the 2x2 tiling windows' own path, and any other
    window) give the NCHW kernels' picks and sums on the transpose (of x plus
    the bias, rounded to the dtype, when the pool adds one), ties, nans and
    -inf included, serial and threaded."""
    rng = np.random.default_rng(5)
    for (n, h, w, c), window in (((5, 6, 6, 3), (2, 2, 2, 2, 0, 0, 1, 1)),
                                 ((3, 4, 8, 9), (2, 2, 2, 2, 0, 0, 1, 1)),
                                 ((4, 5, 7, 2), (3, 3, 1, 2, 1, 1, 1, 1))):
        x = rng.integers(-2, 3, size=(n, h, w, c)).astype(dtype)   # ties, relu's zeros
        x[0, 0, 0, 0] = x[1, 1, 1, -1] = x[1, 0, 1, -1] = np.nan
        x[2, 0, :2, 0] = x[2, 1, :2, 0] = -np.inf
        x[2, 2:4, 2:4, 1] = np.inf
        kh, kw, sh, sw, ph, pw, dh, dw = window
        oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
        # a bias of whole numbers keeps ties; one of 1e6 + fractions rounds x + bias
        bias = (rng.integers(-1, 2, size=c) if c % 2 else rng.normal(1e6, 1, size=c)).astype(dtype)
        for has_bias in (0, 1):
            _check_nhwc_twins(x, bias, has_bias, window, (oh, ow), beta, rng)


def _check_nhwc_twins(x, bias, has_bias, window, out_hw, beta, rng):
    """The NHWC pool and its gradient, serial and threaded, against the NCHW
    kernels on the transpose of x (+ bias)."""
    dtype, (n, h, w, c), (oh, ow) = x.dtype, x.shape, out_hw
    results = []
    for suffix in ("", "_mt"):
        out, idx = np.empty((n, c, oh, ow), dtype), np.empty((n, c, oh, ow), np.int64)
        getattr(cpu, "relu_max_pool2d_nhwc" + suffix)(x, bias, has_bias, out, idx, *window)
        g = rng.normal(size=out.shape).astype(dtype) if not results else results[0][2]
        dest = np.full(x.shape, 0.5, dtype)
        getattr(cpu, "max_pool2d_backward_nhwc" + suffix)(g, idx, dest, *window, beta)
        results.append((out, idx, g, dest))
        # the NCHW kernels on the transpose: the same picks and sums
        want, widx = np.empty_like(out), np.empty_like(idx)
        xt = np.ascontiguousarray((x + bias if has_bias else x).transpose(0, 3, 1, 2))
        assert xt.dtype == dtype
        cpu.relu_max_pool2d(xt, want, widx, *window)
        _bits(out, want)
        _bits(idx, widx)
        wdest = np.full(xt.shape, 0.5, dtype)
        cpu.max_pool2d_backward(g, idx, wdest, *window, beta)
        _bits(dest, np.ascontiguousarray(wdest.transpose(0, 2, 3, 1)))
    for a, b in zip(*results):
        _bits(a, b)


def _col2im_reference(cols, dest, sh, sw, ph, pw, dh, dw, beta, cl):
    """col2im by its definition, in NumPy: each element's column entries
    added in float64 in increasing kernel offset (i, j), then beta * dest."""
    if cl:   # (G, N, OH, OW, KH, KW, C/G) -> (G, N, OH, OW, C/G, KH, KW)
        cols = cols.transpose(0, 1, 2, 3, 6, 4, 5)
    groups, n, oh, ow, cg, kh, kw = cols.shape
    _, c, h, w = dest.shape
    acc = np.zeros((n, c, h + 2 * ph, w + 2 * pw))
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + (oh - 1) * sh + 1, sh)
            columns = slice(j * dw, j * dw + (ow - 1) * sw + 1, sw)
            for g in range(groups):
                acc[:, g * cg:(g + 1) * cg, rows, columns] += \
                    cols[g, :, :, :, :, i, j].transpose(0, 3, 1, 2)
    acc = acc[:, :, ph:ph + h, pw:pw + w]
    return (acc if beta == 0 else acc + beta * dest).astype(dest.dtype)


@pytest.mark.parametrize("cl", [False, True], ids=["col2im", "col2im_cl"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_col2im_adds_in_kernel_offset_order(cl, dtype):
    """Values of wide-ranging magnitudes, so that the order of the adds
    shows in float64: both layouts, serial and threaded, strides, dilation,
    padding and groups, both betas."""
    rng = np.random.default_rng(11)
    for (n, c, h, w), (kh, kw), (sh, sw, ph, pw, dh, dw), groups in (
            ((3, 16, 4, 4), (3, 3), (1, 1, 1, 1, 1, 1), 1),
            ((2, 6, 7, 6), (3, 2), (2, 1, 2, 1, 1, 2), 2)):
        oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        tail = (kh, kw, c // groups) if cl else (c // groups, kh, kw)
        cols = (rng.normal(size=(groups, n, oh, ow) + tail)
                * 10.0 ** rng.integers(-8, 9, size=(groups, n, oh, ow) + tail)).astype(dtype)
        for beta in (0.0, 0.5):
            start = rng.normal(size=(n, c, h, w)).astype(dtype)
            want = _col2im_reference(cols, start, sh, sw, ph, pw, dh, dw, beta, cl)
            for suffix in ("", "_mt"):
                dest = start.copy()
                getattr(cpu, ("col2im_cl" if cl else "col2im") + suffix)(
                    cols, dest, sh, sw, ph, pw, dh, dw, beta)
                _bits(dest, want)


@pytest.mark.parametrize("name, args", [
    ("im2col", lambda r: (r.normal(size=(5, 3, 4, 4)), np.empty((1, 5, 4, 4, 3, 3, 3)),
                          1, 1, 1, 1, 1, 1)),
    ("col2im", lambda r: (r.normal(size=(1, 5, 4, 4, 3, 3, 3)), r.normal(size=(5, 3, 4, 4)),
                          1, 1, 1, 1, 1, 1, 1.0)),
    ("col2im_cl", lambda r: (r.normal(size=(2, 5, 3, 4, 2, 3, 4)), r.normal(size=(5, 8, 5, 4)),
                             2, 1, 1, 1, 1, 1, 0.5)),
    ("relu_max_pool2d", lambda r: (r.normal(size=(5, 3, 6, 6)), np.empty((5, 3, 3, 3)),
                                   np.empty((5, 3, 3, 3), np.int64), 2, 2, 2, 2, 0, 0, 1, 1)),
    ("max_pool2d", lambda r: (r.normal(size=(5, 3, 6, 6)), np.empty((5, 3, 4, 4)),
                              np.empty((5, 3, 4, 4), np.int64), 3, 3, 1, 1, 0, 0, 1, 1)),
    ("max_pool2d_backward", lambda r: (r.normal(size=(5, 3, 4, 4)),
                                       r.integers(0, 36, size=(5, 3, 4, 4)),
                                       r.normal(size=(5, 3, 6, 6)), 3, 3, 1, 1, 0, 0, 1, 1, 1.0)),
    ("expand_nd", lambda r: (r.normal(size=(5, 4, 3, 2)).transpose(0, 2, 1, 3),
                             r.normal(size=(5, 3, 4, 2)), 0.5, 1.0)),
    ("expand_nd", lambda r: (r.normal(size=(1, 7)), r.normal(size=(4000, 7)), 1.0, 0.0)),
])
def test_conv_and_pool_twins_give_the_serial_bits(name, args):
    """Every image (plane, leading index) computed as the serial kernel does."""
    results = []
    for suffix in ("", "_mt"):
        a = args(np.random.default_rng(6))
        getattr(cpu, name + suffix)(*a)
        results.append([v for v in a if isinstance(v, np.ndarray)])
    for x, y in zip(*results):
        _bits(x, y)


def _fused_kernel_args(rng, n, cin, side, cout, dtype, has_bias, window, conv=(1, 1, 1)):
    """Arguments of ``conv_relu_max_pool2d_nhwc`` for a 3x3 convolution of n
    images cin x side x side (``conv``: its stride, padding and dilation, the
    same both ways), then a max pool of ``window``."""
    x = rng.normal(size=(n, cin, side, side)).astype(dtype)
    x[0, 0, 0, 0] = np.nan
    w3 = rng.normal(size=(1, cout, cin * 9)).astype(dtype)
    bias = rng.normal(size=cout).astype(dtype)
    s, p, d = conv
    o = (side + 2 * p - d * 2 - 1) // s + 1
    kh, kw, sh, sw, ph, pw, dh, dw = window
    oh, ow = (o + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (o + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    cols = np.full((1, n, o, o, cin, 3, 3), np.nan, dtype)
    prod = np.full((1, n * o * o, cout), np.nan, dtype)
    out = np.full((n, cout, oh, ow), np.nan, dtype)
    idx = np.full((n, cout, oh, ow), -7, np.int64)
    return [x, cols, w3, prod, bias, has_bias, out, idx, s, s, p, p, d, d, *window]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_fused_kernel_makes_the_three_kernels_calls(dtype):
    """The serial kernel: im2col, the GEMM (bgemm's, BLAS or its loop below
    4096 multiply-adds) and the NHWC pool, bit for bit, with and without a
    bias, tiling and overlapping windows."""
    rng = np.random.default_rng(8)
    for (n, cin, side, cout), window, conv in (
            ((4, 3, 6, 5), (2, 2, 2, 2, 0, 0, 1, 1), (1, 1, 1)),
            ((2, 1, 3, 2), (2, 2, 1, 1, 0, 0, 1, 1), (1, 1, 1)),     # the GEMM's loop
            ((3, 2, 7, 4), (3, 3, 2, 2, 1, 1, 1, 1), (1, 1, 1)),     # overlapping windows
            ((2, 3, 9, 4), (2, 2, 1, 1, 0, 0, 2, 2), (2, 2, 2))):    # strided, dilated
        for has_bias in (0, 1):
            args = _fused_kernel_args(rng, n, cin, side, cout, dtype, has_bias, window, conv)
            want = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
            cpu.conv_relu_max_pool2d_nhwc(*args)
            x, cols, w3, prod, bias, _, out, idx = want[:8]
            cpu.im2col(x, cols, *args[8:14])
            length, o = prod.shape[1], cols.shape[2]
            cpu.bgemm(cols.reshape(1, length, -1), w3, prod, 0, 1, 1.0, 0.0, 1, 1, 1, 1)
            cpu.relu_max_pool2d_nhwc(prod.reshape(n, o, o, cout), bias, has_bias, out, idx,
                                     *window)
            for got, exp in zip(args[:8], want[:8]):
                if isinstance(got, np.ndarray):
                    _bits(got, exp)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 7, 64])
def test_the_fused_kernels_threaded_twin_and_its_one_thread_twin(n, dtype):
    """The threaded twin (a block of images per thread; fewer images than
    threads: the three in turn) and the governor's one-thread twin give the
    same bits; both are the serial kernel's values to the GEMM's rounding
    (the blocks are other BLAS calls), its columns and picks exactly."""
    from numbagrad.kernels.cpu import _threads
    from numbagrad.kernels.cpu import conv as cpu_conv
    assert _threads.ONE_THREAD["conv_relu_max_pool2d_nhwc"] is \
        cpu_conv.conv_relu_max_pool2d_nhwc_st
    rng = np.random.default_rng(9)
    for window, conv in (((2, 2, 2, 2, 0, 0, 1, 1), (1, 1, 1)),
                         ((3, 3, 1, 1, 1, 1, 1, 1), (2, 2, 2))):   # overlapping; strided
        base = _fused_kernel_args(rng, n, 4, 8, 8, dtype, 1, window, conv)
        results = []
        for fn in (cpu_conv.conv_relu_max_pool2d_nhwc_mt, cpu_conv.conv_relu_max_pool2d_nhwc_st,
                   cpu.conv_relu_max_pool2d_nhwc):
            args = [a.copy() if isinstance(a, np.ndarray) else a for a in base]
            fn(*args)
            results.append(args[:8])
        for threaded, one in zip(results[0], results[1]):
            if isinstance(threaded, np.ndarray):
                _bits(threaded, one)
        _bits(results[0][1], results[2][1])        # the columns
        tol = 1e-5 if dtype == np.float32 else 1e-12
        for k in (3, 6):                           # the product, the pooled values
            np.testing.assert_allclose(results[0][k], results[2][k], rtol=tol, atol=tol)


def test_the_fused_op_threaded_is_the_three_ops_to_rounding():
    """Above the threaded size the fused op runs its threaded twin: the three
    ops' values and gradients to the GEMMs' rounding, and eager twice gives
    the same bits."""
    x, w, b = (np.random.default_rng(10).normal(size=s) for s in ((32, 4, 10, 10),
                                                                  (8, 4, 3, 3), (8,)))
    conv_kw, pool_kw = dict(padding=1), dict(kernel_size=2)
    assert 32 * 100 * 36 * 8 >= cpu.MT_MIN    # the product's multiply-adds
    out, grads = _run(lambda *p: fused(*p, **conv_kw, **pool_kw), (x, w, b), 11)
    again, again_grads = _run(lambda *p: fused(*p, **conv_kw, **pool_kw), (x, w, b), 11)
    want, want_grads = _run(_unfused(conv_kw, pool_kw), (x, w, b), 11)
    _bits(out, again)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    for got, same, exp in zip(grads, again_grads, want_grads):
        _bits(got, same)
        np.testing.assert_allclose(got, exp, rtol=1e-11, atol=1e-11)


def test_fused_on_cuda_gives_the_cpus_bits():
    dev = cuda_dev()
    conv_kw, pool_kw = dict(padding=1), dict(kernel_size=3, pool_stride=1)
    x, w, b = _data((2, 2, 5, 5), (3, 2, 3, 3), np.float64)
    seen = KernelNames()
    with kernels.observe(seen):
        out, grads = _run(lambda *p: fused(*p, **conv_kw, **pool_kw), (x, w, b), 7, dev)
    assert "conv_relu_max_pool2d_nhwc" in seen.names
    want, want_grads = _run(lambda *p: fused(*p, **conv_kw, **pool_kw), (x, w, b), 7)
    _bits(out, want)
    for got, exp in zip(grads, want_grads):
        np.testing.assert_allclose(got, exp, rtol=1e-12, atol=1e-14)   # (its GEMMs' order)


def _cnn(nn, **kw):
    """Two input channels: both convolutions on the columns path, fused."""
    return small_cnn(nn, 2, **kw)


def test_sequential_runs_conv_relu_pool_as_one_op_like_torch():
    x = np.random.default_rng(1).normal(size=(3, 2, 4, 4))
    names = sequential_like_torch(_cnn, x, np.array([0, 2, 1]))
    assert names.count("conv_relu_max_pool2d_nhwc") == 2 and "relu_max_pool2d" not in names
    assert names.count("max_pool2d_backward_nhwc") == 2


def test_a_compiled_cnn_with_the_fused_op_is_eagers_bits(tmp_path):
    rng = np.random.default_rng(2)
    batches = [(ng.tensor(rng.normal(size=(4, 2, 4, 4)).astype(np.float32)),
                rng.integers(0, 3, size=4)) for _ in range(3)]

    def make():
        model = _cnn(ng.nn, dtype=np.float32, rng=np.random.default_rng(3))
        opt = ng.optim.Adam(model.parameters(), lr=1e-2, accumulate_steps=2)
        return model.parameters(), lambda x, y: ng.cross_entropy(model(x), y), opt
    step = compiled_matches_eager(make, batches * 2, tmp_path)
    assert step.stats[-1]["mode"] == "njit"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_models_run_the_layers_as_written(dtype):
    """The fused ops are outside the op table (not swapped for half-aware
    ones): a half model's Conv2d, ReLU, MaxPool2d run one by one."""
    model = _cnn(ng.nn, dtype=dtype, rng=np.random.default_rng(4))
    x = ng.tensor(np.random.default_rng(5).normal(size=(3, 2, 4, 4)), dtype=dtype)
    out = model(x)   # (the fused ops raised TypeError on half data)
    h = x
    for layer in model._modules.values():
        h = layer(h)
    assert out.dtype == h.dtype and out.numpy().tobytes() == h.numpy().tobytes()
