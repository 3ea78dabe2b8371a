"""Micro-benchmark: one training micro-step, numbagrad next to its peers.

A micro-step is a forward pass, the loss, backward into the gradient
accumulator, then ``optimizer.step()`` with ``accumulate_steps=K`` (so one
call in K applies the update). The cases:

- linear: ``W @ X`` against ``Y`` with the MSE loss, SGD (momentum 0.9) or
  Adam, float32 or float64, at four sizes (``CASES``);
- MLP: 64-64-10 on a batch of 32 (digits-sized) and 784-1024-1024-10 on a
  batch of 256, ReLU, cross-entropy, Adam, float32.

Peers, all from the same weights and data, doing the same update:
numbagrad, ``numbagrad compiled`` (``ng.compile``, when it exists), a
hand-written NumPy loop with preallocated buffers, PyTorch eager and JAX
(``jax.jit`` + ``optax.MultiSteps``) when importable, and the GEMM floor: the
matrix products no micro-step can avoid, timed alone.

The peers of a row are timed interleaved, round by round (A B C D, B C D A,
...), each sample a whole number of accumulation windows, so a burst of load
on a shared machine hits all of them. Per peer: best, median and spread
(interquartile range / median) of the rounds; ratios are of best times from
the same rounds. A row whose spread is large, with a time below its floor,
or whose floor runs faster on one BLAS thread than on all (threads waiting
for cores that other processes hold) is marked, and the run ends with a
warning to rerun with ``--repeat`` (and ``--threads 1``, which pins every
library's thread pools). Then: the first micro-step in a fresh process, the
allreduce share of a 2-rank window, and the verdict on the issues' targets.

    python scripts/bench.py --quick              # the README's main job
    python scripts/bench.py --json out.json --plot out.png
"""
from __future__ import annotations

import argparse
import gc
import importlib
import itertools
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
import numbagrad as ng

# After numbagrad, which sets OMP_WAIT_POLICY=PASSIVE (unless set) before any
# OpenMP runtime loads: torch's then waits passively too. Imported first, its
# runtime spins after each op, and Numba's workers, which may share it, spin
# on the cores the next GEMM needs (measured: the 784-1024-1024-10 step 2x slower).
try:
    import torch
except ImportError:
    torch = None

K = 4
LR, MOMENTUM, BETAS, EPS = 1e-3, 0.9, (0.9, 0.999), 1e-8
SPREAD_LIMIT = 0.20          # a cell whose IQR / median exceeds this marks its row

CASES = {
    "tiny": {"kind": "linear", "shape": (2, 3, 1)},           # (d_out, d_in, batch)
    "small": {"kind": "linear", "shape": (64, 64, 32)},
    "medium": {"kind": "linear", "shape": (256, 512, 128), "stall_check": True},
    "large": {"kind": "linear", "shape": (1024, 1024, 512), "stall_check": True},
    "mlp-small": {"kind": "mlp", "layers": (64, 64, 10), "batch": 32},
    "mlp-large": {"kind": "mlp", "layers": (784, 1024, 1024, 10), "batch": 256,
                  "stall_check": True},
}
# stall_check: the floor is also timed on one BLAS thread; when that beats all
# threads by STALL_LIMIT, the BLAS threads are waiting for cores others hold.
STALL_LIMIT = 1.25
MLP_ROW = ("float32", "adam")        # the one (dtype, optimizer) an MLP case runs
QUICK_CASES = ["tiny", "small", "large", "mlp-small", "mlp-large"]
QUICK_FLOAT32_ONLY = ("large",)      # --quick keeps under a minute on two cores:
QUICK_ROUNDS = {"large": 3, "mlp-large": 3}    # fewer rounds for the slow cases



def _jax():
    """(jax, jax.numpy, optax), or None when not installed."""
    try:
        jax = importlib.import_module("jax")
        optax = importlib.import_module("optax")
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)     # float64 rows stay float64
    return jax, importlib.import_module("jax.numpy"), optax


def describe(case: str) -> str:
    c = CASES[case]
    if c["kind"] == "linear":
        d_out, d_in, batch = c["shape"]
        return f"linear {d_out}x{d_in} (d_out x d_in), batch {batch}, MSE"
    return (f"MLP {'-'.join(map(str, c['layers']))}, batch {c['batch']}, ReLU, "
            f"cross-entropy")


def short_size(case: str) -> str:
    c = CASES[case]
    if c["kind"] == "linear":
        d_out, d_in, batch = c["shape"]
        return f"{d_out}x{d_in} b{batch}"
    return f"{'-'.join(map(str, c['layers']))} b{c['batch']}"


def rows_of(case: str, dtypes, optimizers, quick: bool = False) -> list[tuple[str, str]]:
    if CASES[case]["kind"] == "mlp":
        return [MLP_ROW]
    if quick and case in QUICK_FLOAT32_ONLY:
        dtypes = [d for d in dtypes if d == "float32"] or dtypes
    return [(d, o) for d in dtypes for o in optimizers]


# ------------------------------------------------------------------ problems
def problem(case: str, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A linear case's W (d_out, d_in), X (d_in, batch), Y (d_out, batch)."""
    d_out, d_in, batch = CASES[case]["shape"]
    rng = np.random.default_rng(0)
    W = (rng.normal(size=(d_out, d_in)) / np.sqrt(d_in)).astype(dtype)
    X = rng.normal(size=(d_in, batch)).astype(dtype)
    Y = rng.normal(size=(d_out, batch)).astype(dtype)
    return W, X, Y


def mlp_problem(case: str, dtype) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """An MLP case's [W1, b1, W2, b2, ...] (W (out, in), as torch), x (batch,
    d_in) and integer labels (batch,)."""
    sizes, batch = CASES[case]["layers"], CASES[case]["batch"]
    rng = np.random.default_rng(0)
    params = []
    for d_in, d_out in itertools.pairwise(sizes):
        params.append((rng.normal(size=(d_out, d_in)) * np.sqrt(2.0 / d_in)).astype(dtype))
        bound = 1.0 / np.sqrt(d_in)
        params.append(rng.uniform(-bound, bound, size=d_out).astype(dtype))
    x = rng.normal(size=(batch, sizes[0])).astype(dtype)
    labels = rng.integers(0, sizes[-1], size=batch).astype(np.int64)
    return params, x, labels


def initial_weights(case: str, dtype) -> list[np.ndarray]:
    """Every peer's starting weights, in the order ``.weights()`` returns them."""
    if CASES[case]["kind"] == "linear":
        return [problem(case, dtype)[0]]
    return mlp_problem(case, dtype)[0]


# ------------------------------------------------------------------ peers
# Each maker returns a zero-argument micro-step (or None when the peer cannot
# run here) with ``.weights()`` -> the current weights as host arrays (in
# ``initial_weights`` order) and optionally ``.sync()`` for asynchronous peers.
def _ng_setup(case, dtype, opt_kind, device):
    """(loss_fn, inputs, optimizer, weights) for the eager and compiled peers."""
    def optimizer(params):
        if opt_kind == "sgd":
            return ng.optim.SGD(params, lr=LR, momentum=MOMENTUM, accumulate_steps=K)
        return ng.optim.Adam(params, lr=LR, betas=BETAS, eps=EPS, accumulate_steps=K)

    if CASES[case]["kind"] == "linear":
        w0, x0, y0 = problem(case, dtype)
        W = ng.param(w0, device=device)
        X, Y = ng.tensor(x0, device=device), ng.tensor(y0, device=device)
        matmul, mse_loss = ng.matmul, ng.mse_loss

        def loss_fn(x, y):
            return mse_loss(matmul(W, x), y)
        return loss_fn, (X, Y), optimizer([W]), lambda: [W.numpy()]

    params, x0, labels = mlp_problem(case, dtype)
    nn, layers, names = ng.nn, [], []
    for i in range(len(params) // 2):
        if layers:
            layers.append(nn.ReLU())
        d_out, d_in = params[2 * i].shape
        names += [f"{len(layers)}.weight", f"{len(layers)}.bias"]
        layers.append(nn.Linear(d_in, d_out, dtype=dtype, device=device,
                                rng=np.random.default_rng(1)))
    model = nn.Sequential(*layers)
    model.load_state_dict(dict(zip(names, params)))
    x = ng.tensor(x0, device=device)
    cross_entropy = ng.cross_entropy

    def loss_fn(x, labels):
        return cross_entropy(model(x), labels)

    def weights():
        state = model.state_dict()
        return [state[n] for n in names]
    return loss_fn, (x, labels), optimizer(model.parameters()), weights


def numbagrad_step(case, dtype, opt_kind, device) -> Callable[[], None]:
    """ng ops recorded on ``ng.grad_tape()``, ``loss.backward()``, ``opt.step()``."""
    loss_fn, (a, b), opt, weights = _ng_setup(case, dtype, opt_kind, device)
    tape = ng.grad_tape

    def micro_step():
        with tape():
            loss = loss_fn(a, b)
        loss.backward()
        opt.step()
    micro_step.weights = weights
    return micro_step


def compiled_step(case, dtype, opt_kind, device) -> Callable[[], None] | None:
    """``step = ng.compile(loss_fn, optimizer=opt)``; ``step(x, y)`` runs the
    forward, backward and ``opt.step()`` (issue 10). None until ng.compile exists."""
    if not hasattr(ng, "compile"):
        return None
    loss_fn, (a, b), opt, weights = _ng_setup(case, dtype, opt_kind, device)
    step = ng.compile(loss_fn, optimizer=opt)

    def micro_step():
        step(a, b)
    micro_step.weights = weights
    return micro_step


class _NumpyOptimizer:
    """PyTorch's SGD (momentum) / Adam on one flat weight array, accumulating
    K micro-steps' gradients in ``g`` (the mean is applied), no allocations."""

    def __init__(self, w: np.ndarray, g: np.ndarray, opt_kind: str) -> None:
        self.w, self.g, self.kind = w, g, opt_kind
        self.m, self.v, self.tmp = np.zeros_like(w), np.zeros_like(w), np.empty_like(w)
        self.pos = self.t = 0

    def step(self) -> None:
        self.pos += 1
        if self.pos < K:
            return
        self.pos = 0
        w, g, m, v, tmp = self.w, self.g, self.m, self.v, self.tmp
        np.multiply(g, 1.0 / K, out=g)
        if self.kind == "sgd":
            m *= MOMENTUM
            m += g
            np.multiply(m, LR, out=tmp)
        else:
            self.t += 1
            m *= BETAS[0]
            np.multiply(g, 1 - BETAS[0], out=tmp)
            m += tmp
            v *= BETAS[1]
            np.multiply(g, g, out=tmp)
            tmp *= 1 - BETAS[1]
            v += tmp
            np.sqrt(v, out=tmp)
            tmp /= math.sqrt(1 - BETAS[1] ** self.t)
            tmp += EPS
            np.divide(m, tmp, out=tmp)
            tmp *= LR / (1 - BETAS[0] ** self.t)
        w -= tmp
        g.fill(0)


def numpy_step(case, dtype, opt_kind, device) -> Callable[[], None]:
    """The same math by hand in NumPy, with preallocated buffers (on the host
    also for ``--device cuda``)."""
    if CASES[case]["kind"] == "mlp":
        return numpy_mlp_step(case, dtype, opt_kind)
    W, X, Y = problem(case, dtype)
    P, G, T = np.empty_like(Y), np.zeros_like(W), np.empty_like(W)
    opt = _NumpyOptimizer(W.reshape(-1), G.reshape(-1), opt_kind)
    c = 2.0 / Y.size

    def micro_step():
        np.matmul(W, X, out=P)
        np.subtract(P, Y, out=P)                 # residual
        loss = np.vdot(P, P) / P.size            # noqa: F841 (computed, as a step must)
        np.multiply(P, c, out=P)                 # d loss / d pred
        np.matmul(P, X.T, out=T)
        np.add(G, T, out=G)
        opt.step()
    micro_step.weights = lambda: [W.copy()]
    return micro_step


def numpy_mlp_step(case, dtype, opt_kind) -> Callable[[], None]:
    """Hand-written MLP: weights and gradients are views of two flat arrays
    (one optimizer pass updates them all); every buffer is made once."""
    params, x, labels = mlp_problem(case, dtype)
    batch = x.shape[0]
    flat_w = np.concatenate([p.ravel() for p in params])
    flat_g = np.zeros_like(flat_w)
    views_w, views_g, at = [], [], 0
    for p in params:
        views_w.append(flat_w[at:at + p.size].reshape(p.shape))
        views_g.append(flat_g[at:at + p.size].reshape(p.shape))
        at += p.size
    Ws, bs, gWs, gbs = views_w[0::2], views_w[1::2], views_g[0::2], views_g[1::2]
    n = len(Ws)
    acts = [x] + [np.empty((batch, W.shape[0]), dtype) for W in Ws]  # post-ReLU; last: logits
    deltas = [np.empty((batch, W.shape[0]), dtype) for W in Ws]      # d loss / d pre-activation
    masks = [np.empty((batch, W.shape[0]), bool) for W in Ws[:-1]]
    tmp_w = [np.empty_like(W) for W in Ws]
    tmp_b = [np.empty_like(b) for b in bs]
    row_max = np.empty((batch, 1), dtype)
    row_sum = np.empty((batch, 1), dtype)
    rows = np.arange(batch)
    opt = _NumpyOptimizer(flat_w, flat_g, opt_kind)

    def micro_step():
        for i in range(n):
            z = acts[i + 1]
            np.matmul(acts[i], Ws[i].T, out=z)
            z += bs[i]
            if i < n - 1:
                np.maximum(z, 0, out=z)
        logits, d = acts[n], deltas[n - 1]
        np.max(logits, axis=1, keepdims=True, out=row_max)
        np.subtract(logits, row_max, out=d)
        np.exp(d, out=d)
        np.sum(d, axis=1, keepdims=True, out=row_sum)
        loss = float(np.mean(np.log(row_sum[:, 0]) + row_max[:, 0]  # noqa: F841
                             - logits[rows, labels]))
        d /= row_sum                               # softmax
        d[rows, labels] -= 1
        d *= 1.0 / batch                           # d loss / d logits
        for i in range(n - 1, -1, -1):
            d = deltas[i]
            np.matmul(d.T, acts[i], out=tmp_w[i])
            gWs[i] += tmp_w[i]
            np.sum(d, axis=0, out=tmp_b[i])
            gbs[i] += tmp_b[i]
            if i > 0:
                np.matmul(d, Ws[i], out=deltas[i - 1])
                np.greater(acts[i], 0, out=masks[i - 1])
                np.multiply(deltas[i - 1], masks[i - 1], out=deltas[i - 1])
        opt.step()
    micro_step.weights = lambda: [p.copy() for p in views_w]
    return micro_step


def torch_step(case, dtype, opt_kind, device) -> Callable[[], None] | None:
    """PyTorch eager: ``(loss / K).backward()``, ``opt.step()`` and
    ``opt.zero_grad()`` every K calls."""
    if torch is None or (device == "cuda" and not torch.cuda.is_available()):
        return None
    dev = "cuda" if device == "cuda" else "cpu"
    if CASES[case]["kind"] == "linear":
        w0, x0, y0 = problem(case, dtype)
        W = torch.tensor(w0, device=dev, requires_grad=True)
        a, b = torch.tensor(x0, device=dev), torch.tensor(y0, device=dev)
        params = [W]
        mse = torch.nn.functional.mse_loss

        def loss_fn(x, y):
            return mse(W @ x, y)
    else:
        ws, x0, labels = mlp_problem(case, dtype)
        layers = []
        for i in range(len(ws) // 2):
            if layers:
                layers.append(torch.nn.ReLU())
            lin = torch.nn.Linear(ws[2 * i].shape[1], ws[2 * i].shape[0],
                                  dtype=getattr(torch, str(np.dtype(dtype))), device=dev)
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(ws[2 * i]))
                lin.bias.copy_(torch.from_numpy(ws[2 * i + 1]))
            layers.append(lin)
        model = torch.nn.Sequential(*layers)
        params = list(model.parameters())
        a, b = torch.tensor(x0, device=dev), torch.tensor(labels, device=dev)
        ce = torch.nn.functional.cross_entropy

        def loss_fn(x, y):
            return ce(model(x), y)
    if opt_kind == "sgd":
        opt = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
    else:
        opt = torch.optim.Adam(params, lr=LR, betas=BETAS, eps=EPS)
    state = {"pos": 0}

    def micro_step():
        (loss_fn(a, b) / K).backward()
        state["pos"] += 1
        if state["pos"] == K:
            state["pos"] = 0
            opt.step()
            opt.zero_grad()
    micro_step.weights = lambda: [p.detach().cpu().numpy().copy() for p in params]
    return micro_step


def jax_step(case, dtype, opt_kind, device) -> Callable[[], None] | None:
    """``jax.jit`` of value_and_grad + an ``optax.MultiSteps`` update (which
    applies the mean of K micro-steps' gradients), buffers donated."""
    mods = _jax()
    if mods is None:
        return None
    jax, jnp, optax = mods
    platform_ = "gpu" if device == "cuda" else "cpu"
    try:
        dev = jax.devices(platform_)[0]
    except RuntimeError:
        return None
    if CASES[case]["kind"] == "linear":
        w0, x0, y0 = problem(case, dtype)
        params = [w0]

        def loss_fn(p, x, y):
            return jnp.mean((p[0] @ x - y) ** 2)
    else:
        params, x0, y0 = mlp_problem(case, dtype)

        def loss_fn(p, x, labels):
            h = x
            for i in range(0, len(p), 2):
                h = h @ p[i].T + p[i + 1]
                if i + 2 < len(p):
                    h = jax.nn.relu(h)
            return optax.softmax_cross_entropy_with_integer_labels(h, labels).mean()
    base = (optax.sgd(LR, momentum=MOMENTUM) if opt_kind == "sgd"
            else optax.adam(LR, b1=BETAS[0], b2=BETAS[1], eps=EPS))
    tx = optax.MultiSteps(base, every_k_schedule=K, accumulator_dtype=np.dtype(dtype))
    put = lambda a: jax.device_put(a, dev)
    p = [put(w) for w in params]
    x, y = put(x0), put(y0)
    value_and_grad = jax.value_and_grad(loss_fn)

    def step(p, s, x, y):
        loss, grads = value_and_grad(p, x, y)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss
    step = jax.jit(step, donate_argnums=(0, 1))
    state = {"p": p, "s": tx.init(p)}

    def micro_step():
        state["p"], state["s"], _ = step(state["p"], state["s"], x, y)
    micro_step.sync = lambda: jax.block_until_ready(state["p"])
    micro_step.warmup_calls = 1        # the first call compiles both branches of the window
    micro_step.weights = lambda: [np.array(w) for w in state["p"]]
    return micro_step


def floor_gemms(case: str, dtype) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(a, b, out) for each GEMM a micro-step cannot avoid: the forward
    products and each weight's gradient (and the gradient flowing into each
    hidden layer); random data of the right shapes and layouts."""
    rng = np.random.default_rng(0)

    def rand(*shape):
        return rng.normal(size=shape).astype(dtype)
    if CASES[case]["kind"] == "linear":
        W, X, _ = problem(case, dtype)
        P, G = np.empty((W.shape[0], X.shape[1]), dtype), np.empty_like(W)
        return [(W, X, P), (P, X.T, G)]
    sizes, batch = CASES[case]["layers"], CASES[case]["batch"]
    Ws = [rand(o, i) for i, o in itertools.pairwise(sizes)]
    acts = [rand(batch, s) for s in sizes]
    out = [(acts[i], Ws[i].T, acts[i + 1]) for i in range(len(Ws))]          # forward
    for i in range(len(Ws) - 1, -1, -1):
        delta = rand(batch, sizes[i + 1])
        out.append((delta.T, acts[i], np.empty_like(Ws[i])))                # dW
        if i > 0:
            out.append((delta, Ws[i], np.empty((batch, sizes[i]), dtype)))  # d input
    return out


def floor_step(case, dtype, opt_kind, device) -> Callable[[], None] | None:
    """Only the unavoidable GEMMs, into preallocated outputs (NumPy's BLAS;
    cuBLAS through PyTorch for ``--device cuda``)."""
    gemms = floor_gemms(case, dtype)
    if device == "cuda":
        if torch is None or not torch.cuda.is_available():
            return None
        gemms = [tuple(torch.as_tensor(np.ascontiguousarray(t), device="cuda") if i < 2
                       else torch.empty(t.shape, dtype=getattr(torch, str(np.dtype(dtype))),
                                        device="cuda") for i, t in enumerate(g)) for g in gemms]
        matmul = torch.matmul
    else:
        matmul = np.matmul

    def micro_step():
        for a, b, out in gemms:
            matmul(a, b, out=out)
    micro_step.warmup_calls = 1
    return micro_step


_CONTROLLER = []


def one_blas_thread(fn: Callable[[], None]) -> Callable[[], None] | None:
    """``fn`` run with every BLAS limited to one thread (threadpoolctl), or
    None when the BLAS runs one thread anyway or threadpoolctl is missing."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    if not _CONTROLLER:
        _CONTROLLER.append(ThreadpoolController())
    ctl = _CONTROLLER[0]
    if all(lib.num_threads <= 1 for lib in ctl.select(user_api="blas").lib_controllers):
        return None

    def micro_step():
        with ctl.limit(limits=1, user_api="blas"):
            fn()
    micro_step.warmup_calls = 1
    return micro_step


PEERS = {"numbagrad": numbagrad_step, "numbagrad compiled": compiled_step,
         "numpy": numpy_step, "torch": torch_step, "jax": jax_step, "floor": floor_step}
SUBJECTS = ("numbagrad", "numbagrad compiled")      # the ones whose ratios are reported
SHORT = {"numbagrad": "ng", "numbagrad compiled": "ngc", "numpy": "numpy", "torch": "torch",
         "jax": "jax", "floor": "floor"}
DESCRIPTION = {
    "numbagrad": "ng ops on ng.grad_tape(), loss.backward(), opt.step()",
    "numbagrad compiled": "step = ng.compile(loss_fn, optimizer=opt); step(x, y)",
    "numpy": "the same math written by hand in NumPy, preallocated buffers",
    "torch": "PyTorch eager, (loss / K).backward(), opt.step() + zero_grad() every K",
    "jax": "jax.jit(value_and_grad + optax.MultiSteps update), donated buffers",
    "floor": "only the GEMMs a micro-step cannot avoid (forward, weight and hidden "
             "gradients), NumPy's BLAS, timed alone: a lower bound, not a competitor",
}


def available_peers() -> list[str]:
    """The peers this machine can run (a row may still lack one)."""
    names = ["numbagrad"]
    if hasattr(ng, "compile"):
        names.append("numbagrad compiled")
    names.append("numpy")
    if torch is not None:
        names.append("torch")
    if _jax() is not None:
        names.append("jax")
    return names + ["floor"]


# ------------------------------------------------------------------ timing
def sync_for(device: str) -> Callable[[], None]:
    if device != "cuda":
        return lambda: None

    def sync():
        ng.cuda.synchronize()
        if torch is not None and torch.cuda.is_available():
            torch.cuda.synchronize()
    return sync


WARMUP_S = 0.02


def _run(fn: Callable[[], None], n: int, sync: Callable[[], None]) -> float:
    """Seconds per call over n calls, the device and the peer drained."""
    done = getattr(fn, "sync", None)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    if done is not None:
        done()
    sync()
    return (time.perf_counter() - start) / n


def summarize(samples: list[float], calls: int) -> dict:
    q1, med, q3 = np.percentile(samples, [25, 50, 75])
    return {"best_s": min(samples), "median_s": float(med), "q1_s": float(q1),
            "q3_s": float(q3), "spread": float((q3 - q1) / med) if med > 0 else 0.0,
            "samples_s": list(samples), "calls_per_sample": calls}


def interleaved(fns: dict[str, Callable[[], None]], repeats: int, min_time: float,
                sync: Callable[[], None]) -> dict[str, dict]:
    """Time every peer in rounds (A B C D, B C D A, ...); each sample runs a
    whole number of K-call windows for at least ``min_time`` seconds.

    Each peer first runs a warm-up (``fn.warmup_calls``, default one window:
    compiles, fills pools and optimizer state), a window, and, when that was
    short, one run of ``WARMUP_S`` (JAX's dispatch needs a few hundred calls
    in a row to reach its steady speed); then a calibration pass; when
    that pass is already one sample's worth of a slow call (>= 1 ms a call)
    it counts as the peer's first-round sample, as the calibration passes
    themselves run peer after peer like a round."""
    calls: dict[str, int] = {}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for name, fn in fns.items():
        _run(fn, getattr(fn, "warmup_calls", K), sync)
        window = K * _run(fn, K, sync)
        if window < WARMUP_S:
            _run(fn, K * int(WARMUP_S / window), sync)
        n = K
        while True:
            per_call = _run(fn, n, sync)
            if n * per_call >= min(2e-3, min_time) or n >= 1 << 16:
                break
            n *= 4
        calls[name] = K * max(1, math.ceil(min_time / (max(per_call, 1e-9) * K)))
        if calls[name] == n and per_call >= 1e-3 and repeats > 1:
            samples[name].append(per_call)
    names = list(fns)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if len(samples[name]) < repeats:
                samples[name].append(_run(fns[name], calls[name], sync))
    return {name: summarize(samples[name], calls[name]) for name in names}


def measure(fn: Callable[[], None], repeats: int, min_time: float,
            sync: Callable[[], None]) -> tuple[float, float]:
    """(best, median) seconds per call of one callable alone."""
    s = interleaved({"fn": fn}, repeats, min_time, sync)["fn"]
    return s["best_s"], s["median_s"]


def transient_bytes(fn: Callable[[], None], steps: int = K) -> int:
    """Most memory (traced by tracemalloc) one call of a warm ``fn`` needs."""
    worst = 0
    tracemalloc.start()
    try:
        for _ in range(steps):
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            fn()
            worst = max(worst, tracemalloc.get_traced_memory()[1] - base)
    finally:
        tracemalloc.stop()
    return worst


def rounds_of(case: str, args) -> int:
    if args.quick and not args.repeats_given:
        return QUICK_ROUNDS.get(case, args.repeats)
    return args.repeats


def measure_row(case: str, dtype: str, opt_kind: str, args, peers: list[str]) -> dict:
    start = time.perf_counter()
    sync = sync_for(args.device)
    fns, notes = {}, {}
    for name in peers:
        try:
            fn = PEERS[name](case, np.dtype(dtype), opt_kind, args.device)
        except Exception as exc:  # a broken peer is reported, not fatal
            if name == "numbagrad":
                raise
            fn, notes[name] = None, f"{type(exc).__name__}: {exc}"
        if fn is not None:
            fns[name] = fn
    if args.device == "cpu" and CASES[case].get("stall_check") and "floor" in fns:
        single = one_blas_thread(fns["floor"])
        if single is not None:
            fns["floor 1 thread"] = single
    # Every framework's import lives in this one process: freezing what exists
    # keeps the collector from walking all of them in each peer's collections.
    gc.collect()
    gc.freeze()
    stats = interleaved(fns, rounds_of(case, args), args.min_time, sync)
    row = {"case": case, "size": describe(case), "shape": CASES[case].get("shape"),
           "layers": CASES[case].get("layers"), "batch": CASES[case].get("batch"),
           "dtype": dtype, "optimizer": opt_kind, "k": K, "device": args.device,
           "rounds": rounds_of(case, args)}
    for name in peers:
        row[name] = stats.get(name)
    row["floor_1_thread"] = stats.get("floor 1 thread")
    if notes:
        row["errors"] = notes
    if args.device == "cpu":
        for name in ("numbagrad", "numbagrad compiled", "numpy"):
            if name in fns:
                row[name.replace(" ", "_") + "_bytes"] = transient_bytes(fns[name])
    best = {n: s["best_s"] for n, s in stats.items()}
    row["ratios"] = {f"{a}/{b}": best[a] / best[b] for a in SUBJECTS if a in best
                     for b in peers if b in best and b not in SUBJECTS}
    flags = [f"{n} spread {100 * s['spread']:.0f}%" for n, s in stats.items()
             if s["spread"] > SPREAD_LIMIT]
    if "floor 1 thread" in best and best["floor 1 thread"] * STALL_LIMIT < best["floor"]:
        flags.append(f"BLAS threads stalled (floor {fmt_us(best['floor'])} µs, "
                     f"{fmt_us(best['floor 1 thread'])} µs on one thread)")
    if "floor" in best:   # the floor is NumPy's BLAS: only peers on the same BLAS
        flags += [f"{n} below its floor ({best[n] / best['floor']:.2f}x)"
                  for n in ("numbagrad", "numbagrad compiled", "numpy")
                  if n in best and best[n] < best["floor"] and args.device == "cpu"]
    row["flags"] = flags
    row["seconds"] = time.perf_counter() - start
    return row


# ------------------------------------------------------------------ other sections
FIRST_STEP = """
import time
t0 = time.perf_counter()
import numpy as np
import numbagrad as ng
W = ng.param(np.ones((2, 3)))
opt = ng.optim.Adam([W], lr=1e-3, accumulate_steps=1)
with ng.grad_tape():
    loss = ng.mse_loss(W @ ng.tensor(np.ones((3, 1))), np.zeros((2, 1)))
loss.backward()
opt.step()
print(time.perf_counter() - t0)
"""


def first_step_times() -> dict[str, dict[str, float]]:
    """Import + first micro-step in fresh processes: cold, then warm cache."""
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=ROOT)
        for label in ("cold", "warm"):
            start = time.perf_counter()
            run = subprocess.run([sys.executable, "-c", FIRST_STEP], env=env, check=True,
                                 capture_output=True, text=True, stdin=subprocess.DEVNULL)
            out[label] = {"process_s": time.perf_counter() - start,
                          "import_and_step_s": float(run.stdout.strip().splitlines()[-1])}
    return out


def dp_allreduce_share(ranks: int = 2) -> dict | None:
    """Run scripts/train_dp.py --bench on local MPI ranks; None if no MPI."""
    here = os.path.dirname(os.path.abspath(__file__))
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) \
        or shutil.which("mpiexec")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        mpiexec = None
    if mpiexec is None:
        print("  skipped: mpi4py or mpiexec missing (pip install numbagrad[mpi] mpich)")
        return None
    threads = str(max(1, (os.cpu_count() or 1) // ranks))
    env = dict(os.environ, OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads,
               UCX_TLS="self,sm", UCX_NET_DEVICES="lo", HYDRA_IFACE="lo")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "dp.json")
        run_ = subprocess.run([mpiexec, "-n", str(ranks), sys.executable, "-m", "mpi4py",
                               os.path.join(here, "train_dp.py"), "--bench", "--json", out],
                              env=env, capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL, check=False)
        if run_.returncode != 0:
            print("  failed:\n" + run_.stderr[-2000:])
            return None
        print("  " + run_.stdout.strip().splitlines()[-1])
        with open(out) as fh:
            result = json.load(fh)
    return {"ranks": ranks, "share": result["allreduce_share"], "threads_per_rank": threads}


# ------------------------------------------------------------------ machine
def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh
                        if ln.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    blas = []
    try:
        from threadpoolctl import threadpool_info
        blas = [{k: lib.get(k) for k in ("user_api", "internal_api", "version",
                                          "num_threads", "architecture", "filepath")}
                for lib in threadpool_info()]
    except ImportError:
        pass
    versions = {"python": platform.python_version(), "numbagrad": ng.__version__}
    for mod in ("numpy", "numba", "llvmlite", "scipy", "torch", "jax", "jaxlib", "optax"):
        m = sys.modules.get(mod)
        if m is None and mod in ("jax", "jaxlib", "optax") and _jax() is not None:
            m = importlib.import_module(mod)
        versions[mod] = getattr(m, "__version__", None) if m is not None else None
    return {"cpu": cpu, "cores": os.cpu_count(), "usable_cores": usable,
            "platform": platform.platform(), "blas": blas, "versions": versions,
            "torch_threads": torch.get_num_threads() if torch is not None else None}


def blas_summary(info: dict) -> str:
    """NumPy's BLAS (the floor's), as threadpoolctl names it."""
    blas = [lib for lib in info["blas"] if lib["user_api"] == "blas"]
    mine = [lib for lib in blas if "numpy" in (lib["filepath"] or "")] or blas
    if not mine:
        return "BLAS unknown (pip install threadpoolctl)"
    return f"{mine[0]['internal_api']} {mine[0]['version']} ({mine[0]['num_threads']} threads)"


# ------------------------------------------------------------------ report
def fmt_us(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    us = seconds * 1e6
    return f"{us:.2f}" if us < 10 else f"{us:.1f}" if us < 100 else f"{us:.0f}"


def fmt_ratio(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}x" if value < 0.1 else f"{value:.2f}x"


def columns(peers: list[str]) -> list[tuple[str, str, int]]:
    """(header line 1, header line 2, width) of every table column."""
    cols = [("", "dtype", 7), ("", "opt", 4)]
    cols += [(n if n != "numbagrad compiled" else "ng compiled", "best/med µs", 13)
             for n in peers]
    cols += [(f"{SHORT[a]}/", SHORT[b], 7) for a in SUBJECTS if a in peers
             for b in peers if b not in SUBJECTS]
    cols += [("spread", "IQR/med", 7), ("ng B", "/step", 7), ("np B", "/step", 8), ("", "", 1)]
    return cols


def table_cells(row: dict, peers: list[str]) -> list[str]:
    cells = [row["dtype"], row["optimizer"]]
    for n in peers:
        s = row.get(n)
        cells.append("n/a" if s is None else f"{fmt_us(s['best_s'])}/{fmt_us(s['median_s'])}")
    cells += [fmt_ratio(row["ratios"].get(f"{a}/{b}")) for a in SUBJECTS if a in peers
              for b in peers if b not in SUBJECTS]
    spreads = [row[n]["spread"] for n in peers if row.get(n)]
    cells.append(f"{100 * max(spreads):.0f}%" if spreads else "n/a")
    cells += [str(row.get("numbagrad_bytes", "n/a")), str(row.get("numpy_bytes", "n/a")),
              "!" if row["flags"] else ""]
    return cells


def line(cells: list[str], cols) -> str:
    first = cells[0].ljust(cols[0][2]) + " " + cells[1].ljust(cols[1][2])
    return (first + " " + " ".join(c.rjust(w) for c, (_, _, w) in zip(cells[2:], cols[2:]))
            ).rstrip()


def legend(args, peers: list[str]) -> list[tuple[str, str]]:
    """(column, meaning) for every column of the table, as printed."""
    items = [
        ("micro-step", (f"forward, loss, backward into the gradient accumulator, then "
                        f"optimizer.step() with accumulate_steps={K}; one call in {K} "
                        f"applies the update")),
        ("best/med µs", (f"µs per micro-step: the best and the median of {args.repeats} rounds;"
                         f" a row's peers run interleaved so load bursts hit them all")),
    ]
    items += [(n, DESCRIPTION[n]) for n in peers]
    items += [
        ("ng/X", ("numbagrad's best time / X's best time, same rounds: below 1.00x numbagrad "
                  "is faster; ng/floor near 1.00x is the best possible")),
        ("spread", (f"the widest interquartile range / median among the row's peers "
                    f"(timing noise); over {100 * SPREAD_LIMIT:.0f}% marks the row")),
        ("ng B, np B", ("bytes numbagrad / the NumPy loop allocate in one steady-state "
                        "micro-step (tracemalloc; n/a for PyTorch, JAX, CUDA)")),
        ("!", (f"noisy row: a spread over {100 * SPREAD_LIMIT:.0f}%, a time below the floor, "
               f"or BLAS threads stalling (the floor faster on one thread); unreliable")),
    ]
    if "numbagrad compiled" in peers:
        items.insert(-3, ("ngc/X", "the same ratios for numbagrad compiled"))
    return items


def print_legend(items: list[tuple[str, str]]) -> None:
    print("\nHow to read the table (lower is better in every column but the case line):")
    for key, text in items:
        print(f"  {key:<19} {text}")


def print_header(cols) -> None:
    print()
    print(line([c[0] for c in cols], cols))
    print(line([c[1] for c in cols], cols))


# ------------------------------------------------------------------ verdict
# (label, case, subject, peer, limit): subject/peer best-time ratio must be <= limit
TARGETS = [
    ("tiny linear step", "tiny", "numbagrad", "numpy", 1.5),
    ("tiny linear step", "tiny", "numbagrad", "torch", 0.1),
    ("large linear step", "large", "numbagrad", "floor", 1.15),
    ("large linear step", "large", "numbagrad", "torch", 1.0),
    ("MLP 64-64-10 b32", "mlp-small", "numbagrad", "numpy", 1.0),
    ("MLP 784-1024-1024-10 b256", "mlp-large", "numbagrad", "floor", 1.15),
    ("MLP 784-1024-1024-10 b256", "mlp-large", "numbagrad", "torch", 0.7),
    ("tiny linear, compiled", "tiny", "numbagrad compiled", "numpy", 0.6),
    ("tiny linear, compiled", "tiny", "numbagrad compiled", "torch", 0.03),
    ("MLP 64-64-10, compiled", "mlp-small", "numbagrad compiled", "numpy", 0.5),
    ("MLP 64-64-10, compiled", "mlp-small", "numbagrad compiled", "torch", 0.15),
    ("MLP 64-64-10, compiled", "mlp-small", "numbagrad compiled", "jax", 0.35),
    ("large linear, compiled", "large", "numbagrad compiled", "floor", 1.10),
    ("large linear, compiled", "large", "numbagrad compiled", "torch", 1.0),
    ("large linear, compiled", "large", "numbagrad compiled", "jax", 1.0),
    ("MLP 784-1024-1024-10, compiled", "mlp-large", "numbagrad compiled", "floor", 1.10),
    ("MLP 784-1024-1024-10, compiled", "mlp-large", "numbagrad compiled", "torch", 1.0),
    ("MLP 784-1024-1024-10, compiled", "mlp-large", "numbagrad compiled", "jax", 1.0),
]
PEER_NAME = {"numpy": "NumPy loop", "torch": "PyTorch eager", "jax": "JAX jit",
             "floor": "GEMM floor"}


def verdict(rows: list[dict], peers: list[str]) -> list[dict]:
    """Each target's worst ratio over the case's rows (every dtype and
    optimizer run), leaving out noisy rows unless all are; compiled targets
    only when the compiled peer ran."""
    out = []
    for label, case, subject, peer, limit in TARGETS:
        if subject not in peers:
            continue
        found = [(r["ratios"][f"{subject}/{peer}"], r) for r in rows
                 if r["case"] == case and f"{subject}/{peer}" in r["ratios"]]
        entry = {"target": label, "case": case, "subject": subject, "peer": peer,
                 "limit": limit, "ratio": None, "status": "not measured", "row": None,
                 "rows": 0, "noisy_rows_left_out": 0, "best_row_ratio": None, "noisy": False}
        clean = [(v, r) for v, r in found if not r["flags"]]
        if found:
            use = clean or found
            value, row = max(use, key=lambda t: t[0])
            entry.update(ratio=value, status="met" if value <= limit else "missed",
                         row=f"{row['dtype']} {row['optimizer']}", noisy=not clean,
                         rows=len(use), noisy_rows_left_out=len(found) - len(use),
                         best_row_ratio=min(v for v, _ in use))
        out.append(entry)
    return out


def print_verdict(entries: list[dict]) -> None:
    print("\nVerdict: the issues' targets; each ratio is the worst over the case's rows "
          "(noisy rows left out when others are clean)")
    for e in entries:
        what = f"{e['subject']} / {PEER_NAME[e['peer']]}"
        head = f"  {e['target']:<31} {what:<35} <= {fmt_ratio(e['limit']):<6}"
        if e["ratio"] is None:
            print(f"{head} {'':>7}  not measured (case {e['case']} not run)")
            continue
        where = e["row"]
        if e["rows"] > 1:
            where += (f", worst of {e['rows']}{' clean' if not e['noisy'] else ''} rows, best "
                      f"{fmt_ratio(e['best_row_ratio'])}")
        if e["noisy_rows_left_out"]:
            where += f"; {e['noisy_rows_left_out']} noisy left out"
        if e["noisy"]:
            where += "; noisy: unreliable"
        print(f"{head} {fmt_ratio(e['ratio']):>7}  {e['status']:<6} ({where})")
    measured = [e for e in entries if e["ratio"] is not None]
    met = sum(e["status"] == "met" for e in measured)
    print(f"  {met} of {len(measured)} measured targets met"
          + (f"; {len(entries) - len(measured)} not measured" if len(measured) < len(entries)
             else ""))


# ------------------------------------------------------------------ plot
def plot(result: dict, path: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not importable: no plot written")
        return False
    rows, peers = result["rows"], [p for p in result["peers"] if p != "floor"]
    cases = [c for c in CASES if any(r["case"] == c for r in rows)]
    ncol = min(3, len(cases))
    nrow = math.ceil(len(cases) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 4.2 * nrow), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.8 / len(peers)
    for ax, case in zip(axes.flat, cases):
        mine = [r for r in rows if r["case"] == case]
        for j, name in enumerate(peers):
            xs, best, med, lo, hi = [], [], [], [], []
            for i, r in enumerate(mine):
                s = r.get(name)
                if s is None:
                    continue
                xs.append(i + (j - (len(peers) - 1) / 2) * width)
                best.append(s["best_s"] * 1e6)
                med.append(s["median_s"] * 1e6)
                lo.append((s["median_s"] - s["q1_s"]) * 1e6)
                hi.append((s["q3_s"] - s["median_s"]) * 1e6)
            color = colors[j % len(colors)]
            ax.bar(xs, best, width, color=color, label=name if case == cases[0] else None)
            ax.errorbar(xs, med, yerr=[lo, hi], fmt="o", markersize=3, capsize=2,
                        color="black", elinewidth=1)
        for i, r in enumerate(mine):
            if r.get("floor"):
                ax.hlines(r["floor"]["best_s"] * 1e6, i - 0.45, i + 0.45, colors="black",
                          linestyles="--", label="GEMM floor" if case == cases[0] and i == 0
                          else None)
        ax.set_yscale("log")
        ax.set_ylabel("µs per micro-step (lower is better)")
        ax.set_xticks(range(len(mine)), [f"{r['dtype']}\n{r['optimizer']}"
                                         + ("\n! noisy" if r["flags"] else "") for r in mine],
                      fontsize=8)
        ax.set_title(f"{case}: {short_size(case)}", fontsize=10)
    for ax in list(axes.flat)[len(cases):]:
        ax.axis("off")
    m = result["machine"]
    fig.suptitle(f"numbagrad micro-step (accumulate_steps={K}, device {rows[0]['device']}) "
                 f"on {m['cpu']}, {m['usable_cores']} cores, {blas_summary(m)}\n"
                 f"bars: best of the interleaved rounds (what the "
                 f"ratios use); dots and whiskers: median and interquartile range; dashed: "
                 f"GEMM floor (best)", fontsize=10)
    fig.legend(loc="lower center", ncol=len(peers) + 1, fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 0.93))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot written to {path}")
    return True


# ------------------------------------------------------------------ main
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"cases {' '.join(QUICK_CASES)} (large in float32 only), "
                             f"short rounds: under a minute on two cores")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--cases", nargs="+", default=None, choices=list(CASES))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"],
                        choices=["float32", "float64"], help="of the linear cases")
    parser.add_argument("--optimizers", nargs="+", default=["sgd", "adam"],
                        choices=["sgd", "adam"], help="of the linear cases")
    parser.add_argument("--repeat", "--repeats", dest="repeats", type=int, default=None,
                        help="interleaved rounds per row (default 9; 5 with --quick, 3 for "
                             "its large cases)")
    parser.add_argument("--min-time", type=float, default=None,
                        help="seconds each sample runs at least (whole windows)")
    parser.add_argument("--threads", type=int, default=None,
                        help="limit every peer's thread pools (BLAS, OpenMP, torch, XLA) to N; "
                             "default: each library's own default")
    parser.add_argument("--no-first-step", action="store_true",
                        help="skip the fresh-process first-step timings")
    parser.add_argument("--no-dp", action="store_true",
                        help="skip the 2-rank MPI allreduce-share measurement")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--plot", metavar="PATH")
    args = parser.parse_args(argv)
    args.cases = args.cases or (QUICK_CASES if args.quick else list(CASES))
    args.repeats_given = args.repeats is not None
    args.repeats = args.repeats or (5 if args.quick else 9)
    args.min_time = args.min_time if args.min_time is not None else (
        0.01 if args.quick else 0.05)
    return args


def limit_threads(n: int) -> None:
    """Every peer's thread pools to n threads (before JAX is imported)."""
    if n == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_cpu_multi_thread_eigen=false"
                                   " intra_op_parallelism_threads=1").strip()
    if torch is not None:
        torch.set_num_threads(n)
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(n)
    except ImportError:
        print("threadpoolctl not installed: --threads cannot limit the BLAS")


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    if args.threads:
        limit_threads(args.threads)
    peers = available_peers()
    info = machine_info()
    v = info["versions"]
    print(f"numbagrad micro-step benchmark on {info['cpu']}, {info['usable_cores']} of "
          f"{info['cores']} cores, NumPy's BLAS {blas_summary(info)}")
    print("numbagrad {numbagrad} | numpy {numpy} | numba {numba} | torch {torch} | "
          "jax {jax} | optax {optax}".format(**{k: v.get(k) or "not installed" for k in v})
          + f" | device {args.device} | {args.repeats} rounds of >= {args.min_time * 1e3:g} ms"
          + (f" | threads limited to {args.threads}" if args.threads else ""))
    if "numbagrad compiled" not in peers:
        print("(ng.compile not in this numbagrad: no 'numbagrad compiled' column)")
    items = legend(args, peers)
    print_legend(items)
    cols = columns(peers)
    print_header(cols)
    rows = []
    for case in args.cases:
        rounds = rounds_of(case, args)
        print(f"{case}: {describe(case)}"
              + (f" ({rounds} rounds)" if rounds != args.repeats else ""), flush=True)
        for dtype, opt_kind in rows_of(case, args.dtypes, args.optimizers, args.quick):
            row = measure_row(case, dtype, opt_kind, args, peers)
            rows.append(row)
            print(line(table_cells(row, peers), cols), flush=True)
            for name, err in row.get("errors", {}).items():
                print(f"    ({name} could not run: {err})")
    result = {"machine": info, "settings": {"repeats": args.repeats, "min_time_s": args.min_time,
                                            "k": K, "device": args.device,
                                            "spread_limit": SPREAD_LIMIT, "quick": args.quick,
                                            "threads": args.threads},
              "peers": peers, "legend": dict(items), "rows": rows}
    if not args.no_first_step and args.device == "cpu":
        print("\nfirst micro-step in a fresh process (2 runs: empty then filled Numba cache; "
              "takes 10-30 s)...", flush=True)
        start = time.perf_counter()
        result["first_step"] = first_step_times()
        result["first_step"]["seconds"] = time.perf_counter() - start
        for label in ("cold", "warm"):
            t = result["first_step"][label]
            print(f"  {label} Numba cache: import+step {t['import_and_step_s']:.2f} s, "
                  f"whole process {t['process_s']:.2f} s")
    if not args.no_dp and args.device == "cpu":
        print("\nallreduce share of a data-parallel window (2 MPI ranks, 1024x1024 float32 "
              "Adam, k=4; takes about 10 s)...", flush=True)
        start = time.perf_counter()
        result["data_parallel"] = dp_allreduce_share()
        if result["data_parallel"]:
            result["data_parallel"]["seconds"] = time.perf_counter() - start
    result["verdict"] = verdict(rows, peers)
    print_verdict(result["verdict"])
    noisy = [r for r in rows if r["flags"]]
    result["warning"] = None
    if noisy:
        why = "; ".join(f"{r['case']} {r['dtype']} {r['optimizer']}: {r['flags'][0]}"
                        for r in noisy[:3]) + ("; ..." if len(noisy) > 3 else "")
        stalled = any("stalled" in f for r in noisy for f in r["flags"])
        result["warning"] = (
            f"WARNING: the machine was noisy, {len(noisy)} of {len(rows)} rows are marked ! "
            f"({why}): rerun with --repeat {2 * args.repeats + 1}"
            + (" --threads 1" if stalled and not args.threads else "")
            + " or on an idle machine")
        print("\n" + result["warning"])
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
        print(f"json written to {args.json}")
    if args.plot:
        plot(result, args.plot)
    return result


if __name__ == "__main__":
    main()
