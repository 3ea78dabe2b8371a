"""The CUDA kernels: agreement with the CPU ones, launch budget, no copies, PTX.

Under CI these run on Numba's CUDA simulator; ``test_kernels_compile_to_ptx``
also compiles every kernel for real Hopper and Ampere GPUs.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import numbagrad as ng
from numbagrad import kernels

pytestmark = pytest.mark.skipif(not ng.cuda_available(), reason="CUDA unusable here")

DTYPES = [np.float32, np.float64]
TOL = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}


@pytest.fixture(scope="module")
def both():
    return kernels.get("cpu"), kernels.get("cuda")


def host(a):
    return a.copy_to_host()


# ------------------------------------------------------------- agreement
@pytest.mark.parametrize("dt", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (15, 17, 1), (1, 33, 15), (33, 3, 17),
                                     (5, 1, 7)])
def test_gemm_agrees_with_cpu_across_tile_edges(both, dt, m, k, n):
    # Every transpose variant, with the forward's (1, 0) and the backward's
    # accumulating (alpha, 1). The simulator's tiles are 4x4; a GPU's 64x64.
    cpu, gpu = both
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    for trans_a, trans_b, alpha, beta in [(False, False, 1.0, 0.0), (False, True, 0.5, 1.0),
                                          (True, False, 1.0, 1.0), (True, True, 2.0, 0.0)]:
        a = rng.normal(size=(k, m) if trans_a else (m, k)).astype(dt)
        b = rng.normal(size=(n, k) if trans_b else (k, n)).astype(dt)
        c = rng.normal(size=(m, n)).astype(dt)
        want = c.copy()
        cpu.gemm(a, b, want, trans_a, trans_b, alpha, beta)
        got = gpu.from_host(c)
        gpu.gemm(gpu.from_host(a), gpu.from_host(b), got, trans_a, trans_b, alpha, beta)
        np.testing.assert_allclose(host(got), want, **TOL[dt],
                                   err_msg=f"trans {trans_a},{trans_b} alpha/beta {alpha},{beta}")


def test_gemm_with_beta_zero_never_reads_the_output(both):
    cpu, gpu = both
    a, b = np.ones((3, 2)), np.ones((2, 5))
    out = gpu.from_host(np.full((3, 5), np.nan))
    gpu.gemm(gpu.from_host(a), gpu.from_host(b), out, False, False, 1.0, 0.0)
    np.testing.assert_array_equal(host(out), np.full((3, 5), 2.0))


@pytest.mark.parametrize("dt", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("shape", [(1,), (15,), (17, 1), (33, 17)])
def test_mse_agrees_with_cpu(both, dt, shape):
    cpu, gpu = both
    rng = np.random.default_rng(len(shape) + shape[0])
    p, t = rng.normal(size=shape).astype(dt), rng.normal(size=shape).astype(dt)
    loss, resid = np.empty((), dt), np.empty(shape, dt)
    cpu.mse(p, t, loss, resid, 1.0 / p.size)
    for _ in range(2):   # twice: the finished-blocks counter must reset itself
        g_loss, g_resid = gpu.empty((), dt), gpu.empty(shape, dt)
        gpu.mse(gpu.from_host(p), gpu.from_host(t), g_loss, g_resid, 1.0 / p.size)
        np.testing.assert_allclose(host(g_loss), loss, **TOL[dt])
        np.testing.assert_allclose(host(g_resid), resid, **TOL[dt])


@pytest.mark.parametrize("dt", DTYPES, ids=["f32", "f64"])
def test_elementwise_and_optimizer_kernels_agree_with_cpu(both, dt):
    cpu, gpu = both
    rng = np.random.default_rng(3)
    sizes = [1, 15, 17, 2, 3]           # 38 elements: more than one grid of threads
    seg = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    live = np.array([1, 1, 0, 1, 1], np.uint8)
    n = int(seg[-1])
    w, g, m, v = (rng.normal(size=n).astype(dt) for _ in range(4))
    v = np.abs(v)
    steps = np.array([0, 3, 1, 2, 0], np.int64)

    x = rng.normal(size=n).astype(dt)
    for fn, args in [("fill", (2.5,)), ("axpby", (0.5, x, 2.0)), ("axpby", (1.5, x, 0.0))]:
        want = w.copy()
        if fn == "fill":
            cpu.fill(want, *args)
            got = gpu.from_host(w)
            gpu.fill(got, *args)
        else:
            alpha, src, beta = args
            cpu.axpby(alpha, src, beta, want)
            got = gpu.from_host(w)
            gpu.axpby(alpha, gpu.from_host(src), beta, got)
        np.testing.assert_allclose(host(got), want, **TOL[dt])

    for momentum in (0.0, 0.9):
        c = [a.copy() for a in (w, g, v)]
        cpu.sgd_update(c[0], c[1], c[2], seg, live, 0.1, momentum, 0.25)
        d = [gpu.from_host(a) for a in (w, g, v)]
        gpu.sgd_update(d[0], d[1], d[2], gpu.from_host(seg), gpu.from_host(live), 0.1,
                       momentum, 0.25)
        for got, want in zip(d, c):
            np.testing.assert_allclose(host(got), want, **TOL[dt])

    c = [a.copy() for a in (w, g, m, v)]
    c_steps = np.empty_like(steps)
    cpu.adam_update(*c, seg, live, steps, c_steps, 0.01, 0.9, 0.999, 1e-8, 0.5)
    d = [gpu.from_host(a) for a in (w, g, m, v)]
    d_steps = gpu.empty(steps.shape, np.int64)
    gpu.adam_update(*d, gpu.from_host(seg), gpu.from_host(live), gpu.from_host(steps),
                    d_steps, 0.01, 0.9, 0.999, 1e-8, 0.5)
    for got, want in zip(d, c):
        np.testing.assert_allclose(host(got), want, **TOL[dt])
    np.testing.assert_array_equal(host(d_steps), c_steps)
    np.testing.assert_array_equal(c_steps, steps + live)


@pytest.mark.parametrize("dt", DTYPES, ids=["f32", "f64"])
def test_a_training_run_agrees_with_cpu(dt):
    rng = np.random.default_rng(4)
    w0, X, Y = rng.normal(size=(5, 17)), rng.normal(size=(17, 6)), rng.normal(size=(5, 6))
    finals = []
    for device in ("cpu", "cuda"):
        W = ng.param(w0, dtype=dt, device=device)
        opt = ng.optim.Adam([W], lr=0.01, accumulate_steps=2)
        x, y = ng.tensor(X, dtype=dt, device=device), ng.tensor(Y, dtype=dt, device=device)
        for _ in range(4):
            with ng.grad_tape():
                loss = ng.mse_loss(W @ x, y)
            loss.backward()
            opt.step()
        finals.append((W.numpy(), loss.item()))
    np.testing.assert_allclose(finals[1][0], finals[0][0], **TOL[dt])
    np.testing.assert_allclose(finals[1][1], finals[0][1], **TOL[dt])


# ------------------------------------------------ launches and transfers
def small_problem(k, nonfinite="raise"):
    rng = np.random.default_rng(5)
    W = ng.param(rng.normal(size=(3, 4)), device="cuda")
    x = ng.tensor(rng.normal(size=(4, 2)), device="cuda")
    y = ng.tensor(rng.normal(size=(3, 2)), device="cuda")
    return W, x, y, ng.optim.SGD([W], lr=0.1, momentum=0.9, accumulate_steps=k,
                                 nonfinite=nonfinite)


# An applied window costs the fused update, plus (by default, nonfinite="raise")
# one reduction whose 8-byte result the host reads to decide the window.
@pytest.mark.parametrize("nonfinite, update_launches", [("raise", 2), ("ignore", 1)])
def test_launch_budget(nonfinite, update_launches):
    W, x, y, opt = small_problem(k=2, nonfinite=nonfinite)
    launches = ng.cuda.launch_count
    for _ in range(2):   # warm-up window
        with ng.grad_tape():
            loss = ng.mse_loss(W @ x, y)
        loss.backward()
        opt.step()
    for applied in (False, True):
        before = launches()
        with ng.grad_tape():
            loss = ng.mse_loss(W @ x, y)
        loss.backward()
        forward_backward = launches() - before
        assert forward_backward <= 4, f"{forward_backward} launches for forward + backward"
        before = launches()
        assert opt.step() is applied
        assert launches() - before == (update_launches if applied else 0)


@pytest.mark.parametrize("nonfinite, window_reads", [("raise", 1), ("ignore", 0)])
def test_a_micro_step_makes_no_host_device_copies(monkeypatch, nonfinite, window_reads):
    """No copies inside a window; at its end only the non-finite check's
    one 8-byte read (none with nonfinite="ignore")."""
    from numba import cuda
    W, x, y, opt = small_problem(k=3, nonfinite=nonfinite)

    def micro_step():
        with ng.grad_tape():
            loss = ng.mse_loss(W @ x, y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(3):
        micro_step()
    copies = []
    array_type = type(W.data)
    for name in ("copy_to_host", "copy_to_device"):
        real = getattr(array_type, name)
        monkeypatch.setattr(array_type, name,
                            lambda self, *a, _real=real, _n=name, **kw:
                            (copies.append((_n, self.nbytes)), _real(self, *a, **kw))[1])
    real_to_device = cuda.to_device
    monkeypatch.setattr(cuda, "to_device",
                        lambda *a, **kw: (copies.append("to_device"), real_to_device(*a, **kw))[1])
    for _ in range(2):      # inside a window
        loss = micro_step()
    assert copies == []
    loss = micro_step()     # closes the window
    assert copies == [("copy_to_host", 8)] * window_reads
    assert kernels.get("cuda").is_device_array(loss.data)   # the loss stays on the device
    copies.clear()
    loss.item()
    assert copies == [("copy_to_host", loss.data.nbytes)]


# ------------------------------------------------------------------ PTX
PTX_SCRIPT = textwrap.dedent("""
    import json, sys
    from numba import cuda
    from numba.cuda import compiler
    import numba.cuda.dispatcher as dispatcher
    from numbagrad.kernels import cuda as kc

    # Device functions ask the driver for the current GPU's compute
    # capability when a kernel that calls them is typed; with no driver here,
    # answer with the architecture being compiled for.
    class Target:
        compute_capability = (9, 0)
    dispatcher.get_current_device = lambda: Target
    ARCHS = [(8, 0), (9, 0)]

    def ptx(fn, sig, archs):
        # Typed and lowered once, for the oldest architecture (its IR is
        # valid on the newer one), then NVVM per architecture; Numba's
        # public compile_ptx, which lowers each time, where its internals differ.
        Target.compute_capability = archs[0]
        try:
            lib, _ = compiler._compile_pyfunc_with_fixup(
                fn, sig, device=False, cc=archs[0], abi="numba", abi_info=None, debug=None,
                lineinfo=False, fastmath=False, opt=None, forceinline=False,
                launch_bounds=None, lto=False)
            return [lib.get_asm_strs(cc=cc)[0] for cc in archs]
        except (AttributeError, TypeError):
            return [cuda.compile_ptx(fn, sig, cc=cc)[0] for cc in archs]

    def source(fn):
        # what, beside the signature, decides a kernel's PTX
        cells = tuple(c.cell_contents if callable(c.cell_contents) else repr(c.cell_contents)
                      for c in fn.__closure__ or ())
        return fn.__code__.co_code, fn.__code__.co_consts, cells

    done = []
    # every kernel for both architectures at the default launch shapes, and
    # at a wide one for sm_90 the kernels whose source those shapes change
    # (they change the tiles and shared-memory sizes, not what the
    # architecture accepts; the simulator's small shapes lie inside the
    # default ones, so the wide shapes are the ones that can exceed a limit)
    default = kc.kernel_sources()
    for config, archs in ((None, ARCHS), (dict(tile=8, wpt=2, threads=1024), [(9, 0)])):
        kernels = default if config is None else [
            k for k, d in zip(kc.kernel_sources(**config), default) if source(k[1]) != source(d[1])]
        for name, fn, sig in kernels:
            for cc, code in zip(archs, ptx(fn, sig, archs)):
                assert ".entry" in code and f"sm_{cc[0]}{cc[1]}" in code, name
                done.append([name, str(sig), cc[0], config or {}])
    print(json.dumps(done))
""")


def test_kernels_compile_to_ptx_for_hopper_and_ampere():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    run = subprocess.run([sys.executable, "-c", PTX_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr[-3000:]
    done = json.loads(run.stdout.strip().splitlines()[-1])
    names = {name for name, *_ in done}
    # Every kernel an op or optimizer launches is in the registry, so compiled here.
    launched = {"gemm", "mse", "pointwise_loss", "cross_entropy", "fill", "axpby", "scaled_add",
                "unary", "unary_backward", "binary", "binary_backward", "sum_to", "softmax",
                "softmax_backward", "sgd_update", "adam_update",
                # the N-d and issue-17 families
                "binary_nd6", "unary_nd6", "softmax3", "cross_entropy3", "concat", "extrema",
                "logsumexp", "variance", "cumsum", "loss_terms", "nll", "clamp", "dropout",
                "dropout_backward", "embedding_backward", "im2col", "col2im", "col2im_cl",
                "max_pool2d", "max_pool2d_backward", "relu_max_pool2d_nhwc",
                "max_pool2d_backward_nhwc", "avg_pool2d", "avg_pool2d_backward",
                "adaptive_avg_pool2d", "adaptive_avg_pool2d_backward", "group_norm",
                "group_norm_backward", "batch_norm", "batch_norm_backward", "attention",
                "attention_backward"}
    assert launched <= names, launched - names
    # (default shapes x 2 archs + the wide shapes x sm_90 where they change the
    # source) x each kernel's dtypes (two floats, the integer ones' ints, one
    # for those whose types are fixed)
    wide = {name for name, _, _, config in done if config}
    assert {"gemm", "bgemm", "sum_all", "cross_entropy", "mse"} <= wide, wide
    for name in names:
        sigs = {sig for n, sig, *_ in done if n == name}
        assert sum(n == name for n, *_ in done) == (2 + (name in wide)) * len(sigs), name
    assert "half_to_float" in names and "float_to_half" in names and "copy_state" in names


# ------------------------------------------------- the op kernels, odd shapes
@pytest.mark.parametrize("dt", DTYPES, ids=["f32", "f64"])
def test_op_kernels_agree_with_cpu_on_odd_shapes(both, dt):
    from numbagrad.kernels import codes
    cpu, gpu = both
    rng = np.random.default_rng(9)
    tol = TOL[dt]

    def check(name, run):
        # run(kern, to_device) -> list of arrays (device ones for cuda)
        want = run(cpu, lambda a: a)
        got = run(gpu, gpu.from_host)
        for g, w in zip(got, want):
            np.testing.assert_allclose(host(g), w, **tol, err_msg=name)

    shape = (17, 15)
    x = rng.normal(size=shape).astype(dt)
    pos = np.abs(x) + 0.5
    # every record, chosen by name (a new record is covered where it lands)
    for code, record in enumerate(codes.UNARY):
        src = pos if record.name in ("log", "sqrt", "rdiv_s", "pow") else x
        for xs in (src, src[:1], src[:, :1]):   # broadcast along rows, columns
            def run(k, d, code=code, xs=xs):
                out, fresh = d(np.ones(shape, dt)), k.empty(shape, dt)
                k.unary(code, d(xs), out, dt(1.5), dt(0.5), dt(2.0))
                k.unary(code, d(xs), fresh, dt(1.5), dt(1.0), dt(0.0))
                # the backward reads the real output (float32 GELU's fast form
                # takes Phi from it)
                y, dest = k.empty(shape, dt), d(np.ones(shape, dt))
                k.unary(code, d(src), y, dt(1.5), dt(1.0), dt(0.0))
                k.unary_backward(code, d(src), y, d(x), dest, 1.0, dt(1.5))
                return [out, fresh, dest]
            check(f"unary {record.name} {xs.shape}", run)
    b = (rng.normal(size=shape) ** 2 + 1).astype(dt)
    for code, record in enumerate(codes.BINARY):
        for sa, sb in [((17, 15), (17, 15)), ((17, 15), (1, 15)), ((17, 1), (1, 15)),
                       ((1, 1), (17, 15))]:
            a_, b_ = x[:sa[0], :sa[1]].copy(), b[:sb[0], :sb[1]].copy()

            def run(k, d, code=code, a_=a_, b_=b_):
                out = k.empty(shape, dt)
                k.binary(code, d(a_), d(b_), out)
                da, db = d(np.ones_like(a_)), d(np.zeros_like(b_))
                k.binary_backward(code, d(a_), d(b_), d(x), da, 1.0, True, db, 0.0, True)
                return [out, da, db]
            check(f"binary {record.name} {sa} {sb}", run)
    for out_shape in [(1, 15), (17, 1), (1, 1)]:
        def run(k, d, out_shape=out_shape):
            out = d(np.ones(out_shape, dt))
            k.sum_to(d(x), out, dt(0.25), dt(1.0))
            return [out]
        check(f"sum_to {out_shape}", run)
    for axis in (0, 1):
        for log in (False, True):
            def run(k, d, axis=axis, log=log):
                y, dest = k.empty(shape, dt), d(np.ones(shape, dt))
                k.softmax(d(x), y, axis, log)
                k.softmax_backward(y, d(b), dest, 1.0, axis, log)
                return [y, dest]
            check(f"softmax axis {axis} log {log}", run)
    labels = rng.integers(0, 15, 17)
    target = rng.uniform(size=shape).astype(dt)

    def run(k, d):
        loss, grad = k.empty((), dt), k.empty(shape, dt)
        k.cross_entropy(d(x * 30), d(labels), loss, grad, 1 / 17)
        loss2, grad2 = k.empty((), dt), k.empty(shape, dt)
        k.pointwise_loss(codes.BCE_LOGITS, d(x * 300), d(target), loss2, grad2, 1.0)
        dest = d(np.ones(shape, dt))
        k.scaled_add(loss, grad, 2.0, dest)
        out, act = k.empty((17, 4), dt), k.empty((17, 4), dt)
        k.linear(d(x), d(b[:4]), d(b[0, :4].copy()), out, True, codes.IDENT, dt(0.0))
        k.linear(d(x), d(b[:4]), d(b[0, :4].copy()), act, True, codes.LEAKY_RELU, dt(0.2))
        return [loss, grad, loss2, grad2, dest, out, act]
    check("losses, scaled_add, linear", run)
