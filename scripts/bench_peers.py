"""The benchmark's peers, each run in a process of its own (``bench.py``).

A peer is a maker ``(case, dtype, optimizer, device) -> micro_step`` (or None
when it cannot run here); ``micro_step()`` runs one training micro-step and
``micro_step.weights()`` returns the weights as host arrays. Every maker
imports its own library when called, so a process imports only the
libraries of the peers it runs, with their defaults (threads, OpenMP wait
policy, BLAS): importing numbagrad next to PyTorch or JAX changed their
speed, and the other way round. ``python scripts/bench_peers.py --serve
GROUP`` serves one group of peers (``GROUPS``) to ``bench.py`` over its
stdin and stdout, one JSON object a line. The cases come from ``bench_cases``.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import itertools
import json
import math
import os
import sys
import time
import tracemalloc
from collections.abc import Callable

import numpy as np
from bench_cases import CASES, EXTRA_KINDS, K, cnn_features
from gpt_model import GPTConfig, nanogpt_init, param_shapes

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)           # this checkout's numbagrad

LR, MOMENTUM, BETAS, EPS = 1e-3, 0.9, (0.9, 0.999), 1e-8


def _jax():
    """(jax, jax.numpy, optax), or None when not installed."""
    try:
        jax = importlib.import_module("jax")
        optax = importlib.import_module("optax")
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)     # float64 rows stay float64
    return jax, importlib.import_module("jax.numpy"), optax


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


def bmm_problem(case: str, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A bmm case's learned A (batch, n, k) and B (batch, k, m), and the
    target Y (batch, n, m) of the MSE of A @ B."""
    batch, n, k, m = CASES[case]["shape"]
    rng = np.random.default_rng(0)
    A = (rng.normal(size=(batch, n, k)) / np.sqrt(k)).astype(dtype)
    B = rng.normal(size=(batch, k, m)).astype(dtype)
    Y = rng.normal(size=(batch, n, m)).astype(dtype)
    return A, B, Y


def cnn_problem(case: str, dtype) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """A CNN case's [conv1.w, conv1.b, conv2.w, conv2.b, fc.w, fc.b] (torch's
    layouts: conv (out, in, 3, 3), linear (out, in)), images x (batch, 1, side,
    side) and integer labels (batch,)."""
    c = CASES[case]
    c0, c1, c2 = c["channels"]
    rng = np.random.default_rng(0)
    params = []
    for shape in ((c1, c0, 3, 3), (c2, c1, 3, 3), (c["classes"], cnn_features(case))):
        fan_in = int(np.prod(shape[1:]))
        params.append((rng.normal(size=shape) * np.sqrt(2.0 / fan_in)).astype(dtype))
        bound = 1.0 / np.sqrt(fan_in)
        params.append(rng.uniform(-bound, bound, size=shape[0]).astype(dtype))
    x = rng.normal(size=(c["batch"], c0, c["image"], c["image"])).astype(dtype)
    labels = rng.integers(0, c["classes"], size=c["batch"]).astype(np.int64)
    return params, x, labels


# --- attention: the problem
def attention_problem(case: str, dtype) -> tuple[np.ndarray, ...]:
    """An attention case's learned Q, K, V (batch, heads, T, d) and the target
    Y of the MSE of causal scaled-dot-product attention."""
    shape = CASES[case]["shape"]
    rng = np.random.default_rng(0)
    return tuple(rng.normal(size=shape).astype(dtype) for _ in range(4))


# --- dqn: the problem, the Q-network and the TD loss (scripts/train_rl.py uses them too)
def dqn_problem(case: str, dtype) -> tuple[list[np.ndarray], list[np.ndarray], tuple]:
    """A DQN case's Q-network [W1, b1, W2, b2, W3, b3] (W (out, in), as torch),
    the target network's (other weights, never trained) and a replay batch
    (s, a, r, s2, discount): states (batch, 4), actions (batch, 1) int64,
    rewards and discounts (gamma where the episode went on, 0 where it ended)
    (batch, 1)."""
    sizes, batch = CASES[case]["layers"], CASES[case]["batch"]
    rng = np.random.default_rng(0)
    nets = []
    for _ in range(2):
        params = []
        for d_in, d_out in itertools.pairwise(sizes):
            params.append((rng.normal(size=(d_out, d_in)) * np.sqrt(2.0 / d_in)).astype(dtype))
            bound = 1.0 / np.sqrt(d_in)
            params.append(rng.uniform(-bound, bound, size=d_out).astype(dtype))
        nets.append(params)
    s, s2 = (rng.normal(size=(batch, sizes[0])).astype(dtype) for _ in range(2))
    a = rng.integers(0, sizes[-1], size=(batch, 1)).astype(np.int64)
    r = rng.uniform(0, 1, size=(batch, 1)).astype(dtype)
    discount = (0.99 * (rng.random(size=(batch, 1)) > 0.1)).astype(dtype)
    return nets[0], nets[1], (s, a, r, s2, discount)


# the state-dict names of ``dqn_model``'s parameters, in ``dqn_problem``'s order
DQN_NAMES = tuple(f"{i}.{p}" for i in (0, 2, 4) for p in ("weight", "bias"))


def dqn_model(nn, case: str, **kw):
    """A DQN case's Q-network in ``nn`` (``ng.nn`` or ``torch.nn``; ``kw`` goes
    to the Linear layers): Linear, ReLU, Linear, ReLU, Linear."""
    layers: list = []
    for d_in, d_out in itertools.pairwise(CASES[case]["layers"]):
        if layers:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(d_in, d_out, **kw))
    return nn.Sequential(*layers)


def ng_td_loss(ng, qnet, target) -> Callable:
    """DQN's loss(s, a, r, s2, discount) in numbagrad: smooth L1 between Q(s, a)
    (``gather``) and r + discount * max_a' Q_target(s2, a') (``max``). The
    target network's params must have ``requires_grad=False``: no gradient
    reaches them, and ``ng.compile`` reads their current values on every call."""
    gather, amax, smooth_l1_loss = ng.gather, ng.amax, ng.smooth_l1_loss

    def loss_fn(s, a, r, s2, discount):
        best = amax(target(s2), axis=1, keepdims=True)
        return smooth_l1_loss(gather(qnet(s), 1, a), best * discount + r)
    return loss_fn


def torch_td_loss(torch, qnet, target) -> Callable:
    """``ng_td_loss`` in PyTorch (the target computed without a graph)."""
    smooth_l1_loss = torch.nn.functional.smooth_l1_loss

    def loss_fn(s, a, r, s2, discount):
        with torch.no_grad():
            best = torch.amax(target(s2), dim=1, keepdim=True)
        return smooth_l1_loss(torch.gather(qnet(s), 1, a), best * discount + r)
    return loss_fn


def _ng_dqn(case, dtype, device):
    """(loss_fn, batch, qnet) of a DQN case in ``ng.nn`` with ``dqn_problem``'s weights."""
    import numbagrad as ng
    qparams, tparams, batch = dqn_problem(case, dtype)
    qnet, target = (dqn_model(ng.nn, case, dtype=dtype, device=device,
                              rng=np.random.default_rng(1)) for _ in range(2))
    qnet.load_state_dict(dict(zip(DQN_NAMES, qparams)))
    target.load_state_dict(dict(zip(DQN_NAMES, tparams)))
    for p in target.parameters():
        p.requires_grad = False
    data = tuple(b if b.dtype == np.int64 else ng.tensor(b, device=device) for b in batch)
    return ng_td_loss(ng, qnet, target), data, qnet


def _torch_dqn(torch, case, dtype, dev):
    """(loss_fn, batch, qnet) of a DQN case in ``torch.nn`` with ``dqn_problem``'s weights."""
    qparams, tparams, batch = dqn_problem(case, dtype)
    kw = {"dtype": getattr(torch, str(np.dtype(dtype))), "device": dev}
    qnet, target = dqn_model(torch.nn, case, **kw), dqn_model(torch.nn, case, **kw)
    qnet.load_state_dict({n: torch.from_numpy(p) for n, p in zip(DQN_NAMES, qparams)})
    target.load_state_dict({n: torch.from_numpy(p) for n, p in zip(DQN_NAMES, tparams)})
    target.requires_grad_(False)
    data = tuple(torch.tensor(b, device=dev) for b in batch)
    return torch_td_loss(torch, qnet, target), data, qnet


def _jax_dqn_loss(jax, jnp, optax):
    """A DQN case's loss(p, batch, target_params) in JAX (``ng_td_loss``'s math)."""
    def mlp(p, h):
        for i in range(0, len(p), 2):
            h = h @ p[i].T + p[i + 1]
            if i + 2 < len(p):
                h = jax.nn.relu(h)
        return h

    def loss_fn(p, batch, tp):
        s, a, r, s2, discount = batch
        y = jax.lax.stop_gradient(jnp.max(mlp(tp, s2), axis=1, keepdims=True) * discount + r)
        q = jnp.take_along_axis(mlp(p, s), a, axis=1)
        return optax.huber_loss(q, y, delta=1.0).mean()      # smooth L1 with beta 1
    return loss_fn


def dqn_floor_gemms(case: str, rand) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """A DQN case's GEMMs: the Q-network's and the target network's forward
    products, the Q-network's weight gradients and its two hidden gradients."""
    sizes, batch = CASES[case]["layers"], CASES[case]["batch"]
    out = []
    for _ in range(2):      # Q(s) and Q_target(s2)
        out += [(rand(batch, i), rand(o, i).T, np.empty((batch, o), rand(1).dtype))
                for i, o in itertools.pairwise(sizes)]
    for k, (i, o) in reversed(list(enumerate(itertools.pairwise(sizes)))):
        delta = rand(batch, o)
        out.append((delta.T, rand(batch, i), np.empty((o, i), delta.dtype)))
        if k > 0:
            out.append((delta, rand(o, i), np.empty((batch, i), delta.dtype)))
    return out
# --- gpt: the problem
GPT_BETAS, GPT_WEIGHT_DECAY, GPT_CLIP = (0.9, 0.99), 0.1, 1.0   # train_gpt.py's AdamW


def gpt_config(case: str) -> GPTConfig:
    c = CASES[case]
    return GPTConfig(c["vocab"], c["block"], c["n_layer"], c["n_head"], c["n_embd"], 0.0)


def gpt_names(case: str) -> list[str]:
    """The GPT's params in ``named_parameters`` order (the tied head is ``wte``)."""
    return [n for n in param_shapes(gpt_config(case)) if n != "lm_head.weight"]


def gpt_problem(case: str, dtype) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """A GPT case's nanoGPT-initialised state dict (seed 0), inputs and targets
    (batch, block) of random characters."""
    c = CASES[case]
    rng = np.random.default_rng(0)
    x, y = (rng.integers(0, c["vocab"], (c["batch"], c["block"])) for _ in range(2))
    return nanogpt_init(gpt_config(case), 0, dtype), x, y


# --- lstm: the problem and the model (the same names in ``ng.nn`` and ``torch.nn``)
def lstm_names(case: str) -> list[str]:
    """The LSTM case's state-dict names, in ``named_parameters`` order."""
    return [f"lstm.{kind}_l{layer}" for layer in range(CASES[case]["num_layers"])
            for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")] + \
        ["head.weight", "head.bias"]


def lstm_problem(case: str, dtype) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """An LSTM case's weights (PyTorch's init, U(-1/sqrt(fan), 1/sqrt(fan)), seed 0)
    by state-dict name, inputs x (seq, batch, input) and targets y (batch, out)."""
    c = CASES[case]
    rng = np.random.default_rng(0)
    h, gates = c["hidden"], 4 * c["hidden"]
    shapes = {}
    for layer in range(c["num_layers"]):
        width = c["input"] if layer == 0 else h
        shapes.update({f"lstm.weight_ih_l{layer}": (gates, width),
                       f"lstm.weight_hh_l{layer}": (gates, h),
                       f"lstm.bias_ih_l{layer}": (gates,), f"lstm.bias_hh_l{layer}": (gates,)})
    state = {n: (rng.uniform(-1, 1, s) / np.sqrt(h)).astype(dtype) for n, s in shapes.items()}
    state["head.weight"] = (rng.uniform(-1, 1, (c["out"], h)) / np.sqrt(h)).astype(dtype)
    state["head.bias"] = (rng.uniform(-1, 1, c["out"]) / np.sqrt(h)).astype(dtype)
    x = rng.normal(size=(c["seq"], c["batch"], c["input"])).astype(dtype)
    y = rng.normal(size=(c["batch"], c["out"])).astype(dtype)
    return state, x, y


def lstm_model(nn, case: str, **kw):
    """An LSTM case's model in ``nn`` (``ng.nn`` or ``torch.nn``; ``kw`` goes to
    both layers): ModuleDict(lstm=LSTM(input, hidden, num_layers), head=Linear(hidden, out))."""
    c = CASES[case]
    return nn.ModuleDict({"lstm": nn.LSTM(c["input"], c["hidden"], c["num_layers"], **kw),
                          "head": nn.Linear(c["hidden"], c["out"], **kw)})


def initial_weights(case: str, dtype) -> list[np.ndarray]:
    """Every peer's starting weights, in the order ``.weights()`` returns them."""
    if CASES[case]["kind"] == "linear":
        return [problem(case, dtype)[0]]
    if CASES[case]["kind"] == "bmm":
        return list(bmm_problem(case, dtype)[:2])
    if CASES[case]["kind"] == "cnn":
        return cnn_problem(case, dtype)[0]
    if CASES[case]["kind"] == "attention":
        return list(attention_problem(case, dtype)[:3])
    if CASES[case]["kind"] == "dqn":
        return dqn_problem(case, dtype)[0]
    if CASES[case]["kind"] == "gpt":
        state = gpt_problem(case, dtype)[0]
        return [state[n] for n in gpt_names(case)]
    if CASES[case]["kind"] == "lstm":
        state = lstm_problem(case, dtype)[0]
        return [state[n] for n in lstm_names(case)]
    return mlp_problem(case, dtype)[0]


# ------------------------------------------------------------------ peers
# Each maker returns a zero-argument micro-step (or None when the peer cannot
# run here) with ``.weights()`` -> the current weights as host arrays (in
# ``initial_weights`` order) and optionally ``.sync()`` for asynchronous peers.
def _ng_setup(case, dtype, opt_kind, device):
    """(loss_fn, inputs, optimizer, weights) for the eager and compiled peers."""
    import numbagrad as ng
    if CASES[case]["kind"] == "gpt":
        return _ng_gpt_setup(case, dtype, device)

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
    if CASES[case]["kind"] == "bmm":
        a0, b0, y0 = bmm_problem(case, dtype)
        A, B = ng.param(a0, device=device), ng.param(b0, device=device)
        matmul, mse_loss = ng.matmul, ng.mse_loss

        def loss_fn(y):
            return mse_loss(matmul(A, B), y)
        return (loss_fn, (ng.tensor(y0, device=device),), optimizer([A, B]),
                lambda: [A.numpy(), B.numpy()])
    if CASES[case]["kind"] == "cnn":
        model, x, labels = _ng_cnn(case, dtype, device)
        cross_entropy = ng.cross_entropy

        def loss_fn(x, labels):
            return cross_entropy(model(x), labels)

        def weights():
            state = model.state_dict()
            return [state[n] for n in CNN_NAMES]
        return loss_fn, (x, labels), optimizer(model.parameters()), weights
    if CASES[case]["kind"] == "attention":
        *qkv, y0 = attention_problem(case, dtype)
        Q, K_, V = (ng.param(a, device=device) for a in qkv)
        sdpa, mse_loss = ng.scaled_dot_product_attention, ng.mse_loss

        def loss_fn(y):
            return mse_loss(sdpa(Q, K_, V, is_causal=True), y)
        return (loss_fn, (ng.tensor(y0, device=device),), optimizer([Q, K_, V]),
                lambda: [Q.numpy(), K_.numpy(), V.numpy()])
    if CASES[case]["kind"] == "dqn":
        loss_fn, data, qnet = _ng_dqn(case, dtype, device)

        def weights():
            state = qnet.state_dict()
            return [state[n] for n in DQN_NAMES]
        return loss_fn, data, optimizer(qnet.parameters()), weights
    if CASES[case]["kind"] == "lstm":
        state, x0, y0 = lstm_problem(case, dtype)
        model = lstm_model(ng.nn, case, dtype=dtype, device=device,
                           rng=np.random.default_rng(1))
        model.load_state_dict(state)
        lstm, head, mse_loss = model["lstm"], model["head"], ng.mse_loss

        def loss_fn(x, y):
            out, _ = lstm(x)
            return mse_loss(head(out[-1]), y)

        def weights():
            now = model.state_dict()
            return [now[n] for n in lstm_names(case)]
        return (loss_fn, (ng.tensor(x0, device=device), ng.tensor(y0, device=device)),
                optimizer(model.parameters()), weights)

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


# the state-dict names of ``cnn_model``'s parameters, in ``cnn_problem``'s order
CNN_NAMES = tuple(f"{i}.{p}" for i in (0, 3, 7) for p in ("weight", "bias"))


def cnn_model(nn, case: str, **kw):
    """A CNN case's layers in ``nn`` (``ng.nn`` or ``torch.nn``: the same names
    and arguments; ``kw`` goes to the layers with weights): Conv2d(1, 16, 3,
    padding=1), ReLU, MaxPool2d(2), Conv2d(16, 32, 3, padding=1), ReLU,
    MaxPool2d(2), Flatten, Linear(128, 10)."""
    c0, c1, c2 = CASES[case]["channels"]
    return nn.Sequential(nn.Conv2d(c0, c1, 3, padding=1, **kw), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(c1, c2, 3, padding=1, **kw), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(cnn_features(case), CASES[case]["classes"],
                                                 **kw))


def _ng_cnn(case, dtype, device):
    """(model, x, labels) of a CNN case in ``ng.nn``, loaded with ``cnn_problem``'s weights."""
    import numbagrad as ng
    params, x0, labels = cnn_problem(case, dtype)
    model = cnn_model(ng.nn, case, dtype=dtype, device=device, rng=np.random.default_rng(1))
    model.load_state_dict(dict(zip(CNN_NAMES, params)))
    return model, ng.tensor(x0, device=device), labels


# --- gpt: numbagrad
def _ng_gpt_setup(case, dtype, device):
    """A GPT case's (loss_fn, inputs, AdamW with clipping, weights) in numbagrad."""
    import numbagrad as ng
    from gpt_model import GPT
    state, x, y = gpt_problem(case, dtype)
    model = GPT(gpt_config(case), dtype=dtype, device=device)
    model.load_state_dict(state)
    opt = ng.optim.AdamW(model.parameters(), lr=LR, betas=GPT_BETAS, eps=EPS,
                         weight_decay=GPT_WEIGHT_DECAY, accumulate_steps=K,
                         max_grad_norm=GPT_CLIP)

    def loss_fn(x, y):
        return model(x, y)[1]

    def weights():
        now = model.state_dict()
        return [now[n] for n in gpt_names(case)]
    return loss_fn, (x, y), opt, weights


def numbagrad_step(case, dtype, opt_kind, device) -> Callable[[], None]:
    """ng ops recorded on ``ng.grad_tape()``, ``loss.backward()``, ``opt.step()``."""
    import numbagrad as ng
    loss_fn, data, opt, weights = _ng_setup(case, dtype, opt_kind, device)
    tape = ng.grad_tape

    def micro_step():
        with tape():
            loss = loss_fn(*data)
        loss.backward()
        opt.step()
    micro_step.weights = weights
    return micro_step


def compiled_step(case, dtype, opt_kind, device) -> Callable[[], None] | None:
    """``step = ng.compile(loss_fn, optimizer=opt)``; ``step(x, y)`` runs the
    forward, backward and ``opt.step()``."""
    import numbagrad as ng
    loss_fn, data, opt, weights = _ng_setup(case, dtype, opt_kind, device)
    step = ng.compile(loss_fn, optimizer=opt)

    def micro_step():
        step(*data)
    # ng.compile checks its 2nd, 4th, 8th... call against an eager recording: on the
    # CPU warm up past the dense early checks, or short rounds time them (a GPT
    # step's were 60x its steady time); not on CUDA, whose simulator the tests run
    micro_step.warmup_calls = 16 * K if device == "cpu" else K
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
    if CASES[case]["kind"] == "bmm":
        return numpy_bmm_step(case, dtype, opt_kind)
    if CASES[case]["kind"] == "cnn":
        return None          # no hand-written NumPy convolution: the table says n/a
    if CASES[case]["kind"] == "gpt":
        return None          # nor a NumPy transformer
    if CASES[case]["kind"] == "attention":
        return numpy_attention_step(case, dtype, opt_kind)
    if CASES[case]["kind"] in ("dqn", "lstm"):
        return None          # no hand-written NumPy DQN or LSTM: the table says n/a
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


def numpy_bmm_step(case, dtype, opt_kind) -> Callable[[], None]:
    """Hand-written bmm: A and B are views of one flat weight array, their
    gradients of one flat gradient array; every buffer is made once."""
    a0, b0, Y = bmm_problem(case, dtype)
    flat_w = np.concatenate([a0.ravel(), b0.ravel()])
    flat_g = np.zeros_like(flat_w)
    A, B = flat_w[:a0.size].reshape(a0.shape), flat_w[a0.size:].reshape(b0.shape)
    gA, gB = flat_g[:a0.size].reshape(a0.shape), flat_g[a0.size:].reshape(b0.shape)
    P, tA, tB = np.empty_like(Y), np.empty_like(A), np.empty_like(B)
    opt = _NumpyOptimizer(flat_w, flat_g, opt_kind)
    c = 2.0 / Y.size

    def micro_step():
        np.matmul(A, B, out=P)
        np.subtract(P, Y, out=P)                 # residual
        loss = np.vdot(P, P) / P.size            # noqa: F841 (computed, as a step must)
        np.multiply(P, c, out=P)                 # d loss / d (A @ B)
        np.matmul(P, B.transpose(0, 2, 1), out=tA)
        np.add(gA, tA, out=gA)
        np.matmul(A.transpose(0, 2, 1), P, out=tB)
        np.add(gB, tB, out=gB)
        opt.step()
    micro_step.weights = lambda: [A.copy(), B.copy()]
    return micro_step


# --- attention: NumPy by hand
def numpy_attention_step(case, dtype, opt_kind) -> Callable[[], None]:
    """Hand-written causal attention: the (T, T) probabilities materialised,
    Q, K, V views of one flat weight array; every buffer is made once."""
    *qkv, Y = attention_problem(case, dtype)
    flat_w = np.concatenate([a.ravel() for a in qkv])
    flat_g = np.zeros_like(flat_w)
    n = Y.size
    Q, K_, V = (flat_w[i * n:(i + 1) * n].reshape(Y.shape) for i in range(3))
    gQ, gK, gV = (flat_g[i * n:(i + 1) * n].reshape(Y.shape) for i in range(3))
    t, d = Y.shape[-2:]
    scale = np.dtype(dtype).type(1.0 / math.sqrt(d))
    future = np.triu(np.ones((t, t), bool), 1)
    P = np.empty(Y.shape[:-1] + (t,), dtype)
    dP, O, tmp = np.empty_like(P), np.empty_like(Y), np.empty_like(Y)
    rows = np.empty(Y.shape[:-1] + (1,), dtype)
    opt = _NumpyOptimizer(flat_w, flat_g, opt_kind)
    c = 2.0 / n

    def micro_step():
        np.matmul(Q, K_.swapaxes(-1, -2), out=P)
        np.multiply(P, scale, out=P)
        P[..., future] = -np.inf
        np.max(P, axis=-1, keepdims=True, out=rows)
        np.subtract(P, rows, out=P)
        np.exp(P, out=P)
        np.sum(P, axis=-1, keepdims=True, out=rows)
        np.divide(P, rows, out=P)                # softmax
        np.matmul(P, V, out=O)
        np.subtract(O, Y, out=O)                 # residual
        loss = np.vdot(O, O) / n                 # noqa: F841 (computed, as a step must)
        np.multiply(O, c, out=O)                 # d loss / d out
        np.matmul(P.swapaxes(-1, -2), O, out=tmp)
        np.add(gV, tmp, out=gV)
        np.matmul(O, V.swapaxes(-1, -2), out=dP)
        np.multiply(dP, P, out=dP)
        np.sum(dP, axis=-1, keepdims=True, out=rows)
        np.multiply(P, rows, out=P)
        np.subtract(dP, P, out=dP)               # d loss / d scores, up to the scale
        np.multiply(dP, scale, out=dP)
        np.matmul(dP, K_, out=tmp)
        np.add(gQ, tmp, out=gQ)
        np.matmul(dP.swapaxes(-1, -2), Q, out=tmp)
        np.add(gK, tmp, out=gK)
        opt.step()
    micro_step.weights = lambda: [Q.copy(), K_.copy(), V.copy()]
    return micro_step


def numpy_mlp_step(case, dtype, opt_kind) -> Callable[[], None]:
    """Hand-written MLP: weights and gradients are views of two flat arrays
    (one optimizer pass updates them all); every buffer is made once."""
    params, x, labels = mlp_problem(case, dtype)
    batch = x.shape[0]
    flat_w, flat_g, views_w, views_g = _flat(params)
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


def torch_step(case, dtype, opt_kind, device, compiled: bool = False
               ) -> Callable[[], None] | None:
    """PyTorch eager: ``(loss / K).backward()``, ``opt.step()`` and
    ``opt.zero_grad()`` every K calls; ``compiled``: the loss function (model
    and loss, forward and backward) through ``torch.compile`` (inductor)."""
    torch = _torch()
    if torch is None or (device == "cuda" and not torch.cuda.is_available()):
        return None
    dev = "cuda" if device == "cuda" else "cpu"
    if CASES[case]["kind"] == "gpt":
        return _torch_gpt_step(torch, case, dtype, dev, compiled)
    if CASES[case]["kind"] == "linear":
        w0, x0, y0 = problem(case, dtype)
        W = torch.tensor(w0, device=dev, requires_grad=True)
        a, b = torch.tensor(x0, device=dev), torch.tensor(y0, device=dev)
        params = [W]
        mse = torch.nn.functional.mse_loss

        def loss_fn(x, y):
            return mse(W @ x, y)
        data = (a, b)
    elif CASES[case]["kind"] == "bmm":
        a0, b0, y0 = bmm_problem(case, dtype)
        A = torch.tensor(a0, device=dev, requires_grad=True)
        B = torch.tensor(b0, device=dev, requires_grad=True)
        params, data = [A, B], (torch.tensor(y0, device=dev),)
        mse = torch.nn.functional.mse_loss

        def loss_fn(y):
            return mse(A @ B, y)
    elif CASES[case]["kind"] == "cnn":
        model, data = _torch_cnn(torch, case, dtype, dev)
        params = list(model.parameters())
        ce = torch.nn.functional.cross_entropy

        def loss_fn(x, y):
            return ce(model(x), y)
    elif CASES[case]["kind"] == "attention":
        *qkv, y0 = attention_problem(case, dtype)
        params = [torch.tensor(a, device=dev, requires_grad=True) for a in qkv]
        data = (torch.tensor(y0, device=dev),)
        mse, sdpa = torch.nn.functional.mse_loss, torch.nn.functional.scaled_dot_product_attention

        def loss_fn(y):
            return mse(sdpa(*params, is_causal=True), y)
    elif CASES[case]["kind"] == "dqn":
        loss_fn, data, qnet = _torch_dqn(torch, case, dtype, dev)
        params = list(qnet.parameters())
    elif CASES[case]["kind"] == "lstm":
        state, x0, y0 = lstm_problem(case, dtype)
        model = lstm_model(torch.nn, case, dtype=getattr(torch, str(np.dtype(dtype))),
                           device=dev)
        model.load_state_dict({n: torch.from_numpy(a) for n, a in state.items()})
        params = list(model.parameters())
        data = (torch.tensor(x0, device=dev), torch.tensor(y0, device=dev))
        lstm, head, mse = model["lstm"], model["head"], torch.nn.functional.mse_loss

        def loss_fn(x, y):
            out, _ = lstm(x)
            return mse(head(out[-1]), y)
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
        data = (a, b)
    if compiled:
        loss_fn = torch.compile(loss_fn)
    if opt_kind == "sgd":
        opt = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
    else:
        opt = torch.optim.Adam(params, lr=LR, betas=BETAS, eps=EPS)
    state = {"pos": 0}

    def micro_step():
        (loss_fn(*data) / K).backward()
        state["pos"] += 1
        if state["pos"] == K:
            state["pos"] = 0
            opt.step()
            opt.zero_grad()
    micro_step.weights = lambda: [p.detach().cpu().numpy().copy() for p in params]
    micro_step.torch = torch
    return micro_step


def _torch_cnn(torch, case, dtype, dev):
    """(model, (x, labels)) of a CNN case in ``torch.nn``, with ``cnn_problem``'s weights."""
    params, x0, labels = cnn_problem(case, dtype)
    model = cnn_model(torch.nn, case, dtype=getattr(torch, str(np.dtype(dtype))), device=dev)
    model.load_state_dict({n: torch.from_numpy(p) for n, p in zip(CNN_NAMES, params)})
    return model, (torch.tensor(x0, device=dev), torch.tensor(labels, device=dev))


# --- gpt: PyTorch
def _torch_gpt_step(torch, case, dtype, dev, compiled):
    """The GPT's PyTorch twin: ``(loss / K).backward()``; every K calls
    ``clip_grad_norm_``, AdamW's step and ``zero_grad``."""
    from gpt_model import TorchGPT
    state, x0, y0 = gpt_problem(case, dtype)
    model = TorchGPT(gpt_config(case), dtype=dtype, device=dev)
    model.load_state_dict({n: torch.from_numpy(a) for n, a in state.items()})
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=LR, betas=GPT_BETAS, eps=EPS,
                            weight_decay=GPT_WEIGHT_DECAY)
    x, y = torch.tensor(x0, device=dev), torch.tensor(y0, device=dev)

    def loss_fn(x, y):
        return model(x, y)[1]
    if compiled:
        loss_fn = torch.compile(loss_fn)
    pos = [0]

    def micro_step():
        (loss_fn(x, y) / K).backward()
        pos[0] += 1
        if pos[0] == K:
            pos[0] = 0
            torch.nn.utils.clip_grad_norm_(params, GPT_CLIP)
            opt.step()
            opt.zero_grad()
    micro_step.weights = lambda: [p.detach().cpu().numpy().copy() for p in params]
    micro_step.torch = torch
    return micro_step


def torch_compiled_step(case, dtype, opt_kind, device) -> Callable[[], None] | None:
    """``torch_step`` with the loss function through ``torch.compile``."""
    return torch_step(case, dtype, opt_kind, device, compiled=True)


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
    if CASES[case]["kind"] == "gpt":
        return _jax_gpt_step(jax, jnp, optax, case, dtype, dev)
    if CASES[case]["kind"] == "lstm":
        return _jax_lstm_step(jax, jnp, optax, case, dtype, opt_kind, dev)
    if CASES[case]["kind"] == "linear":
        w0, x0, y0 = problem(case, dtype)
        params = [w0]

        def loss_fn(p, x, y):
            return jnp.mean((p[0] @ x - y) ** 2)
    elif CASES[case]["kind"] == "bmm":
        a0, b0, y0 = bmm_problem(case, dtype)
        params, x0 = [a0, b0], None

        def loss_fn(p, x, y):
            return jnp.mean((p[0] @ p[1] - y) ** 2)
    elif CASES[case]["kind"] == "cnn":
        params, x0, y0 = cnn_problem(case, dtype)
        loss_fn = _jax_cnn_loss(jax, jnp, optax)
    elif CASES[case]["kind"] == "attention":
        *qkv, y0 = attention_problem(case, dtype)
        params, x0 = list(qkv), None
        t, d = y0.shape[-2:]
        causal = np.tril(np.ones((t, t), bool))

        def loss_fn(p, x, y):
            s = jnp.where(causal, p[0] @ jnp.swapaxes(p[1], -1, -2) / math.sqrt(d), -jnp.inf)
            return jnp.mean((jax.nn.softmax(s, axis=-1) @ p[2] - y) ** 2)
    elif CASES[case]["kind"] == "dqn":
        params, y0, x0 = dqn_problem(case, dtype)     # x: the batch, y: the target's params
        loss_fn = _jax_dqn_loss(jax, jnp, optax)
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
    x, y = (None if x0 is None else put(x0)), put(y0)
    return _jax_micro_step(jax, optax, loss_fn, tx, p, x, y,
                           lambda p: [np.array(w) for w in p])


def _jax_micro_step(jax, optax, loss_fn, tx, p, x, y, weights) -> Callable[[], None]:
    """The micro-step ``jax.jit(value_and_grad(loss_fn) + tx.update)`` on
    params ``p`` (a pytree), buffers donated; ``weights(p)``: its NumPy arrays."""
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
    micro_step.weights = lambda: weights(state["p"])
    return micro_step


# --- gpt: JAX
def _jax_gpt_loss(jax, jnp, optax, c: GPTConfig):
    """The GPT's mean cross-entropy loss(p, x, y) in JAX, p a dict by state-dict name."""
    def layer_norm(h, w, b):
        mu = h.mean(-1, keepdims=True)
        var = ((h - mu) ** 2).mean(-1, keepdims=True)
        return (h - mu) / jnp.sqrt(var + 1e-5) * w + b

    def linear(h, p, name):
        return h @ p[name + ".weight"].T + p[name + ".bias"]

    def loss_fn(p, x, y):
        b, t = x.shape
        e, heads = c.n_embd, c.n_head
        causal = jnp.tril(jnp.ones((t, t), bool))
        h = p["transformer.wte.weight"][x] + p["transformer.wpe.weight"][:t]
        for i in range(c.n_layer):
            pre = f"transformer.h.{i}."
            a = layer_norm(h, p[pre + "ln_1.weight"], p[pre + "ln_1.bias"])
            q, k, v = linear(a, p, pre + "attn.c_attn").reshape(b, t, 3, heads, e // heads) \
                .transpose(2, 0, 3, 1, 4)
            s = jnp.where(causal, q @ jnp.swapaxes(k, -1, -2) / math.sqrt(e // heads), -jnp.inf)
            o = (jax.nn.softmax(s, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, t, e)
            h = h + linear(o, p, pre + "attn.c_proj")
            a = layer_norm(h, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"])
            h = h + linear(jax.nn.gelu(linear(a, p, pre + "mlp.c_fc"), approximate=False), p,
                           pre + "mlp.c_proj")
        h = layer_norm(h, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"])
        logits = h @ p["transformer.wte.weight"].T
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss_fn


def _jax_gpt_step(jax, jnp, optax, case, dtype, dev):
    """``jax.jit`` of value_and_grad + ``optax.MultiSteps`` over clip_by_global_norm
    and adamw (every param decayed, as torch.optim.AdamW), buffers donated."""
    state, x0, y0 = gpt_problem(case, dtype)
    names = gpt_names(case)
    loss_fn = _jax_gpt_loss(jax, jnp, optax, gpt_config(case))
    base = optax.chain(optax.clip_by_global_norm(GPT_CLIP),
                       optax.adamw(LR, b1=GPT_BETAS[0], b2=GPT_BETAS[1], eps=EPS,
                                   weight_decay=GPT_WEIGHT_DECAY))
    tx = optax.MultiSteps(base, every_k_schedule=K, accumulator_dtype=np.dtype(dtype))
    p = {n: jax.device_put(state[n], dev) for n in names}
    x, y = jax.device_put(x0, dev), jax.device_put(y0, dev)
    return _jax_micro_step(jax, optax, loss_fn, tx, p, x, y,
                           lambda p: [np.array(p[n]) for n in names])


# --- lstm: JAX
def _jax_lstm_loss(jax, jnp, case: str):
    """An LSTM case's loss(p, x, y) in JAX, p a dict by state-dict name: per layer
    one input projection, then ``lax.scan`` over the steps (PyTorch's gates i, f,
    g, o), the head on the last step's output, MSE."""
    layers = CASES[case]["num_layers"]

    def layer(p, k, x):
        w_ih, w_hh = p[f"lstm.weight_ih_l{k}"], p[f"lstm.weight_hh_l{k}"]
        proj = x @ w_ih.T + p[f"lstm.bias_ih_l{k}"] + p[f"lstm.bias_hh_l{k}"]

        def cell(carry, xp):
            h, c = carry
            i, f, g, o = jnp.split(xp + h @ w_hh.T, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c), h
        zeros = jnp.zeros((x.shape[1], w_hh.shape[1]), x.dtype)
        return jax.lax.scan(cell, (zeros, zeros), proj)[1]

    def loss_fn(p, x, y):
        for k in range(layers):
            x = layer(p, k, x)
        pred = x[-1] @ p["head.weight"].T + p["head.bias"]
        return jnp.mean((pred - y) ** 2)
    return loss_fn


def _jax_lstm_step(jax, jnp, optax, case, dtype, opt_kind, dev):
    """``jax.jit`` of value_and_grad + ``optax.MultiSteps`` of the case's optimizer."""
    state, x0, y0 = lstm_problem(case, dtype)
    names = lstm_names(case)
    base = (optax.sgd(LR, momentum=MOMENTUM) if opt_kind == "sgd"
            else optax.adam(LR, b1=BETAS[0], b2=BETAS[1], eps=EPS))
    tx = optax.MultiSteps(base, every_k_schedule=K, accumulator_dtype=np.dtype(dtype))
    p = {n: jax.device_put(state[n], dev) for n in names}
    x, y = jax.device_put(x0, dev), jax.device_put(y0, dev)
    return _jax_micro_step(jax, optax, _jax_lstm_loss(jax, jnp, case), tx, p, x, y,
                           lambda p: [np.array(p[n]) for n in names])


def _jax_cnn_loss(jax, jnp, optax):
    """A CNN case's loss(p, x, labels) in JAX, NCHW as PyTorch: 3x3 convolutions
    padded by 1, ReLU, 2x2 max pools, flatten, linear, cross-entropy."""
    def conv(h, w, b):
        out = jax.lax.conv_general_dilated(h, w, (1, 1), ((1, 1), (1, 1)),
                                           dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return jax.nn.relu(out + b[None, :, None, None])

    def pool(h):
        return jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2),
                                     "VALID")

    def loss_fn(p, x, labels):
        h = pool(conv(pool(conv(x, p[0], p[1])), p[2], p[3]))
        logits = h.reshape(h.shape[0], -1) @ p[4].T + p[5]
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return loss_fn


# --- tinygrad, HIPS autograd and mygrad: the linear and MLP cases only (EXTRA_KINDS)


def _tinygrad():
    """tinygrad on its CPU backend (``DEV=CPU`` unless ``DEV`` already names a CPU
    renderer, e.g. ``CPU:LLVM``), or None when not installed. Set before its import:
    tinygrad reads ``DEV`` once."""
    if not os.environ.get("DEV", "").startswith("CPU"):
        os.environ["DEV"] = "CPU"
    try:
        return importlib.import_module("tinygrad")
    except ImportError:
        return None


def _flat(params: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, list, list]:
    """(flat weights, flat zero gradients, views of each param in both): one
    ``_NumpyOptimizer`` pass then updates every param."""
    flat_w = np.concatenate([p.ravel() for p in params])
    flat_g = np.zeros_like(flat_w)
    views_w, views_g, at = [], [], 0
    for p in params:
        views_w.append(flat_w[at:at + p.size].reshape(p.shape))
        views_g.append(flat_g[at:at + p.size].reshape(p.shape))
        at += p.size
    return flat_w, flat_g, views_w, views_g


def _linear_or_mlp(case: str, dtype) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """(initial params, input, target) of a linear case (target Y) or an MLP
    case (integer labels)."""
    if CASES[case]["kind"] == "linear":
        w0, x0, y0 = problem(case, dtype)
        return [w0], x0, y0
    return mlp_problem(case, dtype)


def _accumulating_step(make_grads: Callable[[list], Callable[[], list]],
                       params: list[np.ndarray], opt_kind: str) -> Callable[[], None]:
    """The micro-step of a NumPy autograd library: ``grads = make_grads(views)``
    (views of one flat copy of ``params``); each call adds ``grads()`` (the
    library's forward and backward at the current weights) into the
    accumulator, then ``_NumpyOptimizer.step`` (the mean of K micro-steps'
    gradients applied every K calls, as the NumPy loop's); neither library
    has an optimizer of its own."""
    flat_w, flat_g, views_w, views_g = _flat(params)
    opt = _NumpyOptimizer(flat_w, flat_g, opt_kind)
    grads = make_grads(views_w)

    def micro_step():
        for acc, g in zip(views_g, grads()):
            acc += g
        opt.step()
    micro_step.weights = lambda: [v.copy() for v in views_w]
    return micro_step


def autograd_step(case, dtype, opt_kind, device) -> Callable[[], None] | None:
    """HIPS autograd: ``value_and_grad(loss)(params, x, y)`` on ``autograd.numpy``;
    the gradients accumulated and applied as the NumPy loop's (CPU only)."""
    if device != "cpu" or CASES[case]["kind"] not in EXTRA_KINDS:
        return None
    try:
        autograd = importlib.import_module("autograd")
        anp = importlib.import_module("autograd.numpy")
        logsumexp = importlib.import_module("autograd.scipy.special").logsumexp
    except ImportError:
        return None
    params, x, y = _linear_or_mlp(case, dtype)
    if CASES[case]["kind"] == "linear":
        def loss_fn(p, x, y):
            return anp.mean((anp.dot(p[0], x) - y) ** 2)
    else:
        rows = np.arange(len(y))

        def loss_fn(p, x, labels):
            h = x
            for i in range(0, len(p), 2):
                h = anp.dot(h, p[i].T) + p[i + 1]
                if i + 2 < len(p):
                    h = anp.maximum(h, 0.0)
            return anp.mean(logsumexp(h, axis=1) - h[rows, labels])
    value_and_grad = autograd.value_and_grad(loss_fn)

    def make_grads(views):
        return lambda: value_and_grad(views, x, y)[1]
    return _accumulating_step(make_grads, params, opt_kind)


def mygrad_step(case, dtype, opt_kind, device) -> Callable[[], None] | None:
    """mygrad: ``loss.backward()`` on ``mg.Tensor``s that share the weights'
    memory (``copy=False``), the ``.grad`` arrays accumulated and applied as the
    NumPy loop's (CPU only)."""
    if device != "cpu" or CASES[case]["kind"] not in EXTRA_KINDS:
        return None
    try:
        mg = importlib.import_module("mygrad")
        relu = importlib.import_module("mygrad.nnet.activations").relu
        softmax_crossentropy = importlib.import_module("mygrad.nnet.losses").softmax_crossentropy
    except ImportError:
        return None
    params, x, y = _linear_or_mlp(case, dtype)
    matmul, mean = mg.matmul, mg.mean
    if CASES[case]["kind"] == "linear":
        def loss_fn(p):
            return mean((matmul(p[0], x) - y) ** 2)
    else:
        def loss_fn(p):
            h = x
            for i in range(0, len(p), 2):
                h = matmul(h, p[i].T) + p[i + 1]
                if i + 2 < len(p):
                    h = relu(h)
            return softmax_crossentropy(h, y)        # the mean over the batch

    def make_grads(views):
        tensors = [mg.Tensor(v, copy=False) for v in views]   # the weights, not copies

        def run():
            loss_fn(tensors).backward()               # frees the graph, unlocks the weights
            return [t.grad for t in tensors]
        return run
    return _accumulating_step(make_grads, params, opt_kind)


def tinygrad_step(case, dtype, opt_kind, device) -> Callable[[], None] | None:
    """tinygrad on its CPU backend, its own optimizer, two ``TinyJit``s as its
    training examples use it: every call ``(loss / K).gradient(*params)`` added
    into preallocated gradients; every K calls ``opt.step()`` and the
    gradients zeroed. Its optimizer state is kept in the weights' dtype
    (``OPTIM_DTYPE``), its learning rate in float32 even for float64 weights."""
    if device != "cpu" or CASES[case]["kind"] not in EXTRA_KINDS:
        return None
    tg = _tinygrad()
    if tg is None:
        return None
    from tinygrad.device import Device
    from tinygrad.helpers import Context, getenv
    from tinygrad.nn import optim
    Tensor, TinyJit = tg.Tensor, tg.TinyJit
    params0, x0, y0 = _linear_or_mlp(case, dtype)
    params = [Tensor(w).contiguous().realize() for w in params0]
    if CASES[case]["kind"] == "linear":
        x, y = Tensor(x0).realize(), Tensor(y0).realize()

        def loss_fn(x, y):
            return ((params[0] @ x - y) ** 2).mean()
    else:
        x, y = Tensor(x0).realize(), Tensor(y0.astype(np.int32)).realize()

        def loss_fn(x, labels):
            h = x
            for i in range(0, len(params), 2):
                h = h @ params[i].T + params[i + 1]
                if i + 2 < len(params):
                    h = h.relu()
            return h.sparse_categorical_crossentropy(labels)
    grads = [Tensor.zeros(*p.shape, dtype=p.dtype).contiguous().realize() for p in params]
    for p, g in zip(params, grads):
        p.grad = g                                     # what the optimizer reads
    os.environ["OPTIM_DTYPE"] = str(np.dtype(dtype))  # its state in the weights' dtype
    getenv.cache_clear()                               # (read through a cached getenv)
    opt = (optim.SGD(params, lr=LR, momentum=MOMENTUM) if opt_kind == "sgd"
           else optim.Adam(params, lr=LR, b1=BETAS[0], b2=BETAS[1], eps=EPS))

    @TinyJit
    def accumulate(x, y):
        loss = loss_fn(x, y)
        Tensor.realize(*[a.assign(a + g) for a, g in
                         zip(grads, (loss / K).gradient(*params))])
        return loss.realize()

    @TinyJit
    def update():
        with Context(TRAINING=1):
            opt.step()
        Tensor.realize(*[a.assign(a.zeros_like()) for a in grads])
        return params[0]
    pos = [0]

    def micro_step():
        accumulate(x, y)
        pos[0] += 1
        if pos[0] == K:
            pos[0] = 0
            update()
    device_ = Device[Device.DEFAULT]
    micro_step.sync = device_.synchronize
    micro_step.warmup_calls = 3 * K           # TinyJit captures on the second call of each
    micro_step.weights = lambda: [p.numpy().copy() for p in params]
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
    if CASES[case]["kind"] == "bmm":          # per slice: A @ B, dA = G @ B^T, dB = A^T @ G
        A, B, Y = bmm_problem(case, dtype)
        P, gA, gB = np.empty_like(Y), np.empty_like(A), np.empty_like(B)
        return [g for i in range(len(A))
                for g in ((A[i], B[i], P[i]), (P[i], B[i].T, gA[i]), (A[i].T, P[i], gB[i]))]
    if CASES[case]["kind"] == "cnn":
        return cnn_floor_gemms(case, rand)
    if CASES[case]["kind"] == "dqn":
        return dqn_floor_gemms(case, rand)
    if CASES[case]["kind"] == "gpt":
        return gpt_floor_gemms(case, rand)
    if CASES[case]["kind"] == "lstm":
        return lstm_floor_gemms(case, rand)
    if CASES[case]["kind"] == "attention":     # per slice: S, O; dV, dP, dQ, dK
        *_, Y = attention_problem(case, dtype)
        t = Y.shape[-2]
        flat = Y.reshape(-1, *Y.shape[-2:])
        Q, K_, V, G = (rand(*flat.shape) for _ in range(4))
        P, dS = rand(len(flat), t, t), rand(len(flat), t, t)
        out, grad = np.empty_like(flat), np.empty_like(flat)
        return [g for i in range(len(flat))
                for g in ((Q[i], K_[i].T, P[i]), (P[i], V[i], out[i]), (P[i].T, G[i], grad[i]),
                          (G[i], V[i].T, dS[i]), (dS[i], K_[i], grad[i]),
                          (dS[i].T, Q[i], grad[i]))]
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


def cnn_floor_gemms(case: str, rand) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """A CNN case's GEMMs on im2col rows (N*H*W, C_in*9), as numbagrad's
    convolution runs them: per convolution the forward and the weight gradient
    (and the gradient into the second one's columns; the images need none),
    then the linear layer's forward, weight and input gradients."""
    c = CASES[case]
    batch, side, (c0, c1, c2) = c["batch"], c["image"], c["channels"]
    out = []
    for i, (cin, cout) in enumerate(((c0, c1), (c1, c2))):
        length = batch * (side // 2 ** i) ** 2
        W, cols, g = rand(cout, 9 * cin), rand(length, 9 * cin), rand(length, cout)
        out += [(cols, W.T, np.empty_like(g)), (g.T, cols, np.empty_like(W))]
        if i:
            out.append((g, W, np.empty_like(cols)))
    features, classes = cnn_features(case), c["classes"]
    W, x, g = rand(classes, features), rand(batch, features), rand(batch, classes)
    return out + [(x, W.T, np.empty_like(g)), (g.T, x, np.empty_like(W)),
                  (g, W, np.empty_like(x))]


# --- gpt: the GEMM floor
def gpt_floor_gemms(case: str, rand) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """A GPT case's GEMMs over its B*T rows: per linear layer (c_attn, c_proj,
    c_fc, mlp c_proj, then the tied head) the forward, the weight gradient and
    the input gradient; per attention slice (batch x head) S = Q K^T, O = P V,
    dV, dP, dQ, dK."""
    c = CASES[case]
    rows, e, t = c["batch"] * c["block"], c["n_embd"], c["block"]
    d, slices = e // c["n_head"], c["batch"] * c["n_head"]

    def linear(d_in, d_out):
        x, W, g = rand(rows, d_in), rand(d_out, d_in), rand(rows, d_out)
        return [(x, W.T, np.empty_like(g)), (g.T, x, np.empty_like(W)),
                (g, W, np.empty_like(x))]
    out = []
    for _ in range(c["n_layer"]):
        out += linear(e, 3 * e) + linear(e, e) + linear(e, 4 * e) + linear(4 * e, e)
        Q, K_, V, G = (rand(slices, t, d) for _ in range(4))
        P, dS, grad = rand(slices, t, t), rand(slices, t, t), np.empty((slices, t, d), Q.dtype)
        for i in range(slices):
            out += [(Q[i], K_[i].T, P[i]), (P[i], V[i], grad[i]), (P[i].T, G[i], grad[i]),
                    (G[i], V[i].T, dS[i]), (dS[i], K_[i], grad[i]), (dS[i].T, Q[i], grad[i])]
    return out + linear(e, c["vocab"])


# --- lstm: the GEMM floor
def lstm_floor_gemms(case: str, rand) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """An LSTM case's GEMMs: per layer the input projection over all seq * batch
    rows, its weight gradient and (above the first layer) its input gradient,
    per step after the first (h_0 is zero) h @ W_hh^T forward and the gradient
    into h, and dW_hh as one product over those steps; then the head's
    forward, weight and input gradients."""
    c = CASES[case]
    rows, batch, h, gates = c["seq"] * c["batch"], c["batch"], c["hidden"], 4 * c["hidden"]
    out = []
    for layer in range(c["num_layers"]):
        width = c["input"] if layer == 0 else h
        x, w, g = rand(rows, width), rand(gates, width), rand(rows, gates)
        out += [(x, w.T, np.empty_like(g)), (g.T, x, np.empty_like(w))]
        if layer:
            out.append((g, w, np.empty_like(x)))
        w_hh, hs, gs = rand(gates, h), rand(batch, h), rand(batch, gates)
        for _ in range(c["seq"] - 1):
            out += [(hs, w_hh.T, np.empty_like(gs)), (gs, w_hh, np.empty_like(hs))]
        steps = rows - batch
        out.append((rand(steps, gates).T, rand(steps, h), np.empty_like(w_hh)))
    w, x, g = rand(c["out"], h), rand(batch, h), rand(batch, c["out"])
    return out + [(x, w.T, np.empty_like(g)), (g.T, x, np.empty_like(w)),
                  (g, w, np.empty_like(x))]


def scipy_gemm(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> Callable[[], None]:
    """A call of ``out = a @ b`` through SciPy's BLAS, the library (and so the
    kernel) numbagrad's CPU matmul calls, without copies: row-major
    ``out = a @ b`` is column-major ``out.T = b.T @ a.T``; a C-ordered operand
    X is passed as the Fortran-ordered X.T, a transposed view as itself with
    the transpose flag. On OpenBLAS's own threads or on one thread, whichever
    ran this product faster here (``faster``): numbagrad splits its products
    over its own threads in ways no size threshold describes (by output
    blocks, along a long inner dimension, by the images of a fused
    convolution), so the floor takes each GEMM at the BLAS's best."""
    from scipy.linalg import blas
    gemm = blas.sgemm if out.dtype == np.float32 else blas.dgemm

    def operand(x):
        return (x.T, 0) if x.flags.c_contiguous else (x, 1)
    (bb, tb), (aa, ta) = operand(b), operand(a)
    c = out.T

    def call():
        gemm(1.0, bb, aa, beta=0.0, c=c, trans_a=tb, trans_b=ta, overwrite_c=1)
    local = _blas_threads_local()
    if local is None:
        return call

    def one_thread_call():
        previous = local(1)
        call()
        local(previous)
    return faster([call, one_thread_call])


def faster(calls: list[Callable[[], None]], trials: int = 9, clock=time.perf_counter
           ) -> Callable[[], None]:
    """The call of ``calls`` (each doing the same work) whose best of
    ``trials`` timed calls, taken in turn after one warm-up call each, is the
    shortest."""
    for call in calls:
        call()
    best = [math.inf] * len(calls)
    for _ in range(trials):
        for i, call in enumerate(calls):
            start = clock()
            call()
            best[i] = min(best[i], clock() - start)
    return calls[best.index(min(best))]


def _blas_threads_local():
    """OpenBLAS's ``openblas_set_num_threads_local`` in SciPy's BLAS (ctypes),
    or None where that BLAS has none."""
    import ctypes

    import scipy.linalg.cython_blas as cython_blas
    try:
        fn = ctypes.CDLL(cython_blas.__file__).openblas_set_num_threads_local
    except (AttributeError, OSError):
        return None
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
    return fn


def floor_step(case, dtype, opt_kind, device) -> Callable[[], None] | None:
    """Only the unavoidable GEMMs, into preallocated outputs: SciPy's BLAS,
    which numbagrad's kernels call, each GEMM on one thread or on OpenBLAS's
    own, whichever ran it faster (``scipy_gemm``); cuBLAS through PyTorch for
    ``--device cuda``."""
    gemms = floor_gemms(case, dtype)
    if device == "cuda":
        torch = _torch()
        if torch is None or not torch.cuda.is_available():
            return None
        gemms = [tuple(torch.as_tensor(np.ascontiguousarray(t), device="cuda") if i < 2
                       else torch.empty(t.shape, dtype=getattr(torch, str(np.dtype(dtype))),
                                        device="cuda") for i, t in enumerate(g)) for g in gemms]
        calls = [lambda a=a, b=b, out=out: torch.matmul(a, b, out=out) for a, b, out in gemms]
        sync = torch.cuda.synchronize
    else:
        calls, sync = [scipy_gemm(a, b, out) for a, b, out in gemms], None

    def micro_step():
        for call in calls:
            call()
    micro_step.warmup_calls = 1
    if sync is not None:
        micro_step.sync = sync
    return micro_step


PEERS = {"numbagrad": numbagrad_step, "numbagrad compiled": compiled_step,
         "numpy": numpy_step, "torch": torch_step, "torch compiled": torch_compiled_step,
         "jax": jax_step, "floor": floor_step, "tinygrad": tinygrad_step,
         "autograd": autograd_step, "mygrad": mygrad_step}
# The processes: a library's peers share one (numbagrad eager and compiled; the
# NumPy loop and the GEMM floor, both NumPy and SciPy only).
GROUPS = {"numbagrad": ("numbagrad", "numbagrad compiled"), "numpy": ("numpy", "floor"),
          "torch": ("torch",), "torch compiled": ("torch compiled",), "jax": ("jax",),
          "tinygrad": ("tinygrad",), "autograd": ("autograd",), "mygrad": ("mygrad",)}
GROUP_OF = {peer: group for group, peers in GROUPS.items() for peer in peers}
# The libraries a group imports, for its versions and for availability checks.
LIBRARIES = {"numbagrad": ("numbagrad", "numba", "llvmlite", "numpy", "scipy"),
             "numpy": ("numpy", "scipy"), "torch": ("torch",), "torch compiled": ("torch",),
             "jax": ("jax", "jaxlib", "optax"), "tinygrad": ("tinygrad",),
             "autograd": ("autograd", "numpy", "scipy"), "mygrad": ("mygrad", "numpy")}
PRELOAD = {"numbagrad": ("numbagrad",), "numpy": ("numpy", "scipy.linalg"),
           "torch": ("torch",), "torch compiled": ("torch",), "jax": ("jax",),
           "tinygrad": ("tinygrad",), "autograd": ("autograd",), "mygrad": ("mygrad",)}
# the modules whose import needs set-up first (JAX's float64, tinygrad's CPU backend)
IMPORTERS = {"jax": lambda: _jax(), "tinygrad": lambda: _tinygrad()}


def _torch():
    """torch, or None when not installed."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        return None


# ------------------------------------------------------------------ timing primitives
WARMUP_S = 0.02


def run_calls(fn: Callable[[], None], n: int, sync: Callable[[], None] | None = None) -> float:
    """Seconds per call over n calls, the device and the peer drained."""
    done = getattr(fn, "sync", None)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    if done is not None:
        done()
    if sync is not None:
        sync()
    return (time.perf_counter() - start) / n


def calibrate(fn: Callable[[], None], min_time: float, repeats: int,
              sync: Callable[[], None] | None = None) -> tuple[int, float | None]:
    """(calls per sample, a first sample or None) for ``fn``.

    First a warm-up (``fn.warmup_calls``, default one window: compiles, fills
    pools and optimizer state), a window, and, when that was short, one run
    of ``WARMUP_S`` (JAX's dispatch needs a few hundred calls in a row to
    reach its steady speed); then a calibration pass. A sample runs a whole
    number of K-call windows for at least ``min_time`` seconds; when the
    calibration pass is already one sample's worth of a slow call (>= 1 ms a
    call) it is returned as the first sample."""
    run_calls(fn, getattr(fn, "warmup_calls", K), sync)
    window = K * run_calls(fn, K, sync)
    if window < WARMUP_S:
        run_calls(fn, K * int(WARMUP_S / window), sync)
    n = K
    while True:
        per_call = run_calls(fn, n, sync)
        if n * per_call >= min(2e-3, min_time) or n >= 1 << 16:
            break
        n *= 4
    calls = K * max(1, math.ceil(min_time / (max(per_call, 1e-9) * K)))
    first = per_call if calls == n and per_call >= 1e-3 and repeats > 1 else None
    return calls, first


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


def _proc_status_kb(key: str) -> int | None:
    """A ``/proc/self/status`` field in kB (Linux), or None."""
    try:
        with open("/proc/self/status") as fh:
            for text in fh:
                if text.startswith(key + ":"):
                    return int(text.split()[1])
    except OSError:
        pass
    return None


def peak_memory(fn: Callable[[], None], steps: int = K) -> dict[str, int | None]:
    """The memory a warm ``fn`` needs over ``steps`` calls (one window):
    ``traced_bytes``, the most a call allocates through tracemalloc (NumPy's
    and numbagrad's buffers; not PyTorch's own allocator); ``peak_rss_bytes``,
    the process's resident peak over the window (Linux: its high-water mark
    reset first; everything this process holds, libraries included); and
    ``window_rss_bytes``, that peak above the resident size just before the
    window (freed heap returned to the system first). None where unknown."""
    import ctypes
    traced = transient_bytes(fn, steps)
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    before = _proc_status_kb("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")                  # resets VmHWM to the current resident size
    except OSError:
        before = None
    for _ in range(steps):
        fn()
    sync = getattr(fn, "sync", None)
    if sync is not None:
        sync()
    peak = _proc_status_kb("VmHWM") if before is not None else None
    return {"traced_bytes": traced,
            "peak_rss_bytes": None if peak is None else 1024 * peak,
            "window_rss_bytes": None if peak is None else 1024 * (peak - before)}


_CONTROLLER = []


def _controller():
    """threadpoolctl's controller of this process (made once), or None."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    if not _CONTROLLER:
        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0]


def one_blas_thread(fn: Callable[[], None]) -> Callable[[], None] | None:
    """``fn`` run with every BLAS limited to one thread (threadpoolctl), or
    None when the BLAS runs one thread anyway or threadpoolctl is missing."""
    ctl = _controller()
    if ctl is None or all(lib.num_threads <= 1 for lib in
                          ctl.select(user_api="blas").lib_controllers):
        return None

    def micro_step():
        with ctl.limit(limits=1, user_api="blas"):
            fn()
    micro_step.warmup_calls = 1
    return micro_step


def limit_threads(n: int) -> None:
    """This process's thread pools to n threads (XLA's before JAX is imported)."""
    if n == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_cpu_multi_thread_eigen=false"
                                   " intra_op_parallelism_threads=1").strip()
    for key in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "NUMBA_NUM_THREADS"):
        os.environ[key] = str(n)


def blas_libraries() -> list[dict]:
    """The BLAS and OpenMP libraries this process has loaded (threadpoolctl)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return [{k: lib.get(k) for k in ("user_api", "internal_api", "version", "num_threads",
                                      "architecture", "filepath")}
            for lib in threadpool_info()]


def versions(group: str) -> dict[str, str | None]:
    """The versions of the libraries ``group`` imports (from their metadata)."""
    from importlib import metadata
    out = {}
    for name in LIBRARIES[group]:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


# ------------------------------------------------------------------ serving
class Server:
    """One process's peers: built per row, calibrated, then sampled on request."""

    def __init__(self, group: str) -> None:
        self.group, self.fns, self.calls = group, {}, {}
        self.sync: Callable[[], None] | None = None
        self.threads: dict[str, int] = {}

    def setup(self, case: str, dtype: str, opt: str, device: str, peers: list[str],
              stall_check: bool = False) -> dict:
        self.fns, self.calls, self.threads, errors = {}, {}, {}, {}
        for name in peers:
            try:
                fn = PEERS[name](case, np.dtype(dtype), opt, device)
            except Exception as exc:  # a broken peer is reported, not fatal
                fn, errors[name] = None, f"{type(exc).__name__}: {exc}"
            if fn is not None:
                self.fns[name] = fn
        if stall_check and device == "cpu" and "floor" in self.fns:
            single = one_blas_thread(self.fns["floor"])
            if single is not None:
                self.fns["floor 1 thread"] = single
        self.sync = self._device_sync(device)
        gc.collect()
        return {"peers": list(self.fns), "errors": errors}

    def _device_sync(self, device: str) -> Callable[[], None] | None:
        if device != "cuda":
            return None
        if self.group == "numbagrad":
            import numbagrad as ng
            return ng.cuda.synchronize
        torch = _torch() if self.group in ("torch", "torch compiled", "numpy") else None
        if torch is None or not torch.cuda.is_available():
            return None
        return torch.cuda.synchronize

    def prepare(self, name: str, min_time: float, repeats: int) -> dict:
        """Warm up and calibrate ``name``; PyTorch on 1 and 2 threads and on its
        default count (at most that), keeping the fastest (and reporting it)."""
        fn = self.fns[name]
        torch = getattr(fn, "torch", None)
        if torch is None:
            self.calls[name], first = calibrate(fn, min_time, repeats, self.sync)
            return {"calls": self.calls[name], "first": first}
        tried = {}
        default = torch.get_num_threads()
        for n in sorted({1, min(2, default), default}, reverse=True):
            torch.set_num_threads(n)
            calls, first = calibrate(fn, min_time, repeats, self.sync)
            tried[n] = (run_calls(fn, calls, self.sync), calls, first)
        best = min(tried, key=lambda n: tried[n][0])
        torch.set_num_threads(best)
        self.calls[name], self.threads[name] = tried[best][1], best
        return {"calls": tried[best][1], "first": tried[best][2], "threads": best,
                "tried_s": {str(n): t[0] for n, t in tried.items()}}

    def sample(self, name: str) -> float:
        return run_calls(self.fns[name], self.calls[name], self.sync)

    def bytes(self, name: str) -> int:
        return transient_bytes(self.fns[name])

    def memory(self, name: str) -> dict[str, int | None]:
        return peak_memory(self.fns[name])

    def info(self) -> dict:
        return {"group": self.group, "versions": versions(self.group),
                "blas": blas_libraries(), "pid": os.getpid(),
                "env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OPENBLAS_CORETYPE",
                                                       "OPENBLAS_L2_SIZE")}}


def serve(group: str) -> None:
    """Answer ``bench.py``'s requests, one JSON object a line, until "quit".
    The protocol keeps this process's stdout: anything a library prints goes
    to stderr instead."""
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    for name in PRELOAD[group]:        # imported up front: its BLAS shows in "info"
        IMPORTERS.get(name, lambda: importlib.import_module(name))()
    server = Server(group)
    for raw in sys.stdin:
        request = json.loads(raw)
        cmd = request.pop("cmd")
        if cmd == "quit":
            break
        try:
            reply = {"ok": getattr(server, cmd)(**request)}
        except Exception as exc:  # reported to the parent, which decides
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        proto.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="serve one group of benchmark peers")
    parser.add_argument("--serve", required=True, choices=list(GROUPS))
    parser.add_argument("--threads", type=int, default=None)
    ns = parser.parse_args()
    if ns.threads:
        limit_threads(ns.threads)
    serve(ns.serve)
