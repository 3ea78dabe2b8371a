"""The benchmark's cases and rows: what a micro-step trains, which rows and
peers a case runs, and how a case is named in the table and the plot.

``CASES`` and ``K`` are read by the peer processes too (``bench_peers.py``),
so this module (and ``bench_machine``, which it imports) needs only the
standard library.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

from bench_machine import installed

K = 4       # accumulate_steps of every peer: one call in K applies the update

CASES = {
    "tiny": {"kind": "linear", "shape": (2, 3, 1)},           # (d_out, d_in, batch)
    "small": {"kind": "linear", "shape": (64, 64, 32)},
    "medium": {"kind": "linear", "shape": (256, 512, 128), "stall_check": True},
    "large": {"kind": "linear", "shape": (1024, 1024, 512), "stall_check": True},
    "mlp-small": {"kind": "mlp", "layers": (64, 64, 10), "batch": 32},
    "mlp-large": {"kind": "mlp", "layers": (784, 1024, 1024, 10), "batch": 256,
                  "stall_check": True},
    "bmm": {"kind": "bmm", "shape": (48, 64, 32, 64)},        # (batch, n, k, m)
    # digits-sized images: 1x8x8 -> conv 16 -> pool -> conv 32 -> pool -> 32x2x2 = 128 -> 10
    "cnn": {"kind": "cnn", "channels": (1, 16, 32), "image": 8, "classes": 10, "batch": 64},
}
MLP_ROW = ("float32", "adam")        # the one (dtype, optimizer) an MLP or bmm case runs
QUICK_CASES = ["tiny", "small", "large", "mlp-small", "mlp-large", "bmm", "cnn"]
QUICK_FLOAT32_ONLY = ("large",)      # --quick keeps to a few minutes on two cores:
QUICK_ROUNDS = {"large": 3, "mlp-large": 3, "cnn": 3, "attention": 3}   # the slow cases

# --- attention: causal SDPA forward and backward, q, k, v learned (batch, heads, T, d)
CASES["attention"] = {"kind": "attention", "shape": (12, 4, 64, 32)}
QUICK_CASES += ["attention"]

# --- dqn: a DQN update, Q-network 4-64-64-2 (CartPole's), Q(s, a) by gather, the
# target network's max, smooth L1 (scripts/train_rl.py's update step)
CASES["dqn"] = {"kind": "dqn", "layers": (4, 64, 64, 2), "batch": 64}
QUICK_CASES += ["dqn"]

# --- gpt: scripts/train_gpt.py's char GPT at its defaults (nanoGPT's CPU config), its
# AdamW (betas 0.9/0.99, weight decay 0.1, clipping at 1.0), a fixed batch of 12 x 64
CASES["gpt"] = {"kind": "gpt", "vocab": 101, "batch": 12, "block": 64, "n_layer": 4,
                "n_head": 4, "n_embd": 128}

# --- lstm: a 2-layer LSTM over a fixed batch of sequences, a linear head on the last
# step's output, MSE, Adam (issue 30's case)
CASES["lstm"] = {"kind": "lstm", "input": 32, "hidden": 128, "num_layers": 2, "seq": 32,
                 "batch": 16, "out": 10}


# --- scaling (bench.py --scaling): sweeps of one size of a case, each point a case of
# its own (so that the peer processes know it); sizes kept so that a whole run with
# short rounds takes a few minutes on two cores (up to ~10 while ng.compile's cache
# is cold)
SCALING_GPT = {"kind": "gpt", "vocab": 101, "batch": 8, "block": 32, "n_layer": 2,
               "n_head": 2, "n_embd": 64}
SWEEPS: dict[str, dict] = {}       # sweep -> {"axis": what varies, "cases": [(case, size)]}


def add_sweep(name: str, axis: str, sizes: tuple[int, ...],
              make: Callable[[int], dict]) -> None:
    """Register sweep ``name``: a case ``make(size)`` per size, named
    ``<name>-<size>`` (spaces as dashes) and marked ``scaling``."""
    cases = []
    for n in sizes:
        case = f"{name.replace(' ', '-')}-{n}"
        CASES[case] = {**make(n), "scaling": True}
        cases.append((case, n))
    SWEEPS[name] = {"axis": axis, "cases": cases}


add_sweep("mlp batch", "batch", (1, 8, 64, 512),
          lambda n: {"kind": "mlp", "layers": (784, 256, 256, 10), "batch": n})
add_sweep("mlp width", "hidden width", (64, 256, 1024),
          lambda n: {"kind": "mlp", "layers": (784, n, n, 10), "batch": 64})
add_sweep("gpt batch", "batch", (1, 8, 64, 512), lambda n: {**SCALING_GPT, "batch": n})
add_sweep("gpt width", "n_embd", (32, 64, 128), lambda n: {**SCALING_GPT, "n_embd": n})
add_sweep("attention T", "T", (64, 256, 1024, 4096),
          lambda n: {"kind": "attention", "shape": (1, 2, n, 32)})


def benchmark_cases() -> list[str]:
    """The cases a plain run (no ``--cases``) times: all but the scaling sweeps'."""
    return [c for c in CASES if not CASES[c].get("scaling")]


# The optional peers of the linear and MLP cases only, each in a process of its own
# (tinygrad on its CPU backend; HIPS autograd and mygrad, NumPy autograd libraries).
EXTRA_PEERS = ("tinygrad", "autograd", "mygrad")
EXTRA_KINDS = ("linear", "mlp")


def gpt_describe(case: str) -> str:
    c = CASES[case]
    return (f"char GPT {c['n_layer']} layers x {c['n_head']} heads x {c['n_embd']}, vocab "
            f"{c['vocab']}, batch {c['batch']} x {c['block']}, AdamW + clipping")


def describe(case: str) -> str:
    """The case line of the table: the problem in words."""
    c = CASES[case]
    if c["kind"] == "linear":
        d_out, d_in, batch = c["shape"]
        return f"linear {d_out}x{d_in} (d_out x d_in), batch {batch}, MSE"
    if c["kind"] == "bmm":
        b, n, k, m = c["shape"]
        return f"bmm ({b}, {n}, {k}) @ ({b}, {k}, {m}), both learned, MSE"
    if c["kind"] == "cnn":
        (c0, c1, c2), side = c["channels"], c["image"]
        return (f"CNN {c0}x{side}x{side}: conv3x3 {c1}, ReLU, maxpool 2, conv3x3 {c2}, ReLU, "
                f"maxpool 2, flatten, linear {cnn_features(case)}-{c['classes']}; "
                f"batch {c['batch']}, cross-entropy")
    if c["kind"] == "dqn":
        return (f"DQN update, Q-network {'-'.join(map(str, c['layers']))} (ReLU), batch "
                f"{c['batch']}: gather Q(s, a), max of the target network, smooth L1")
    if c["kind"] == "attention":
        b, h, t, d = c["shape"]
        return f"causal attention B={b} H={h} T={t} d={d}, q k v learned, MSE"
    if c["kind"] == "gpt":
        return gpt_describe(case)
    if c["kind"] == "lstm":
        return (f"LSTM {c['num_layers']} layers x {c['hidden']} hidden, input {c['input']}, "
                f"seq {c['seq']} x batch {c['batch']}, linear {c['hidden']}-{c['out']} on the "
                f"last step, MSE")
    return (f"MLP {'-'.join(map(str, c['layers']))}, batch {c['batch']}, ReLU, "
            f"cross-entropy")


def cnn_features(case: str) -> int:
    """The flattened features a CNN case's linear layer takes: two 2x2 pools halve
    the side twice."""
    c = CASES[case]
    return c["channels"][-1] * (c["image"] // 4) ** 2


def short_size(case: str) -> str:
    """The case's sizes in a few characters (plot titles)."""
    c = CASES[case]
    if c["kind"] == "linear":
        d_out, d_in, batch = c["shape"]
        return f"{d_out}x{d_in} b{batch}"
    if c["kind"] == "bmm":
        b, n, k, m = c["shape"]
        return f"bmm {b}x{n}x{k}x{m}"
    if c["kind"] == "cnn":
        return f"cnn {c['image']}x{c['image']} b{c['batch']}"
    if c["kind"] == "dqn":
        return f"dqn {'-'.join(map(str, c['layers']))} b{c['batch']}"
    if c["kind"] == "attention":
        b, h, t, d = c["shape"]
        return f"attn {b}x{h}x{t}x{d}"
    if c["kind"] == "gpt":
        return f"gpt {c['n_layer']}x{c['n_embd']} b{c['batch']}x{c['block']}"
    if c["kind"] == "lstm":
        return f"lstm {c['num_layers']}x{c['hidden']} s{c['seq']} b{c['batch']}"
    return f"{'-'.join(map(str, c['layers']))} b{c['batch']}"


def rows_of(case: str, dtypes, optimizers, quick: bool = False) -> list[tuple[str, str]]:
    """The (dtype, optimizer) rows a case runs: an MLP, bmm, CNN, attention or DQN case runs
    ``MLP_ROW`` only."""
    if CASES[case]["kind"] in ("mlp", "bmm", "attention"):
        return [MLP_ROW]
    if CASES[case]["kind"] == "cnn":
        return [MLP_ROW]
    if CASES[case]["kind"] in ("dqn", "gpt", "lstm"):
        return [MLP_ROW]
    if quick and case in QUICK_FLOAT32_ONLY:
        dtypes = [d for d in dtypes if d == "float32"] or dtypes
    return [(d, o) for d in dtypes for o in optimizers]


def rounds_of(case: str, args: argparse.Namespace) -> int:
    """Interleaved rounds of a case's rows: fewer for ``--quick``'s slow cases."""
    if args.quick and not args.repeats_given:
        return QUICK_ROUNDS.get(case, args.repeats)
    return args.repeats


def available_peers(torch_compile: bool = True) -> list[str]:
    """The peers whose libraries are installed (a row may still lack one);
    found without importing them: this process imports none of the peers."""
    names = ["numbagrad", "numbagrad compiled", "numpy"]
    if installed("torch"):
        names += ["torch"] + (["torch compiled"] if torch_compile else [])
    if installed("jax") and installed("optax"):
        names.append("jax")
    names += [n for n in EXTRA_PEERS if installed(n)]
    return names + ["floor"]


def peers_of(case: str, args: argparse.Namespace, peers: list[str]) -> list[str]:
    """A row's peers: ``--quick`` compiles with torch.compile for the MLPs only;
    tinygrad, autograd and mygrad run the linear and MLP cases only."""
    if CASES[case]["kind"] not in EXTRA_KINDS:
        peers = [p for p in peers if p not in EXTRA_PEERS]
    if args.quick and CASES[case]["kind"] != "mlp":
        return [p for p in peers if p != "torch compiled"]
    return peers
