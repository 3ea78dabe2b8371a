"""Train a character-level GPT (nanoGPT's architecture) with numbagrad.

    python scripts/train_gpt.py                          # 2000 iterations, stdlib corpus
    python scripts/train_gpt.py --data input.txt --sample 500 --plot gpt.png
    python scripts/train_gpt.py --max-iters 6 --stop-at 3 --checkpoint run.npz
    python scripts/train_gpt.py --max-iters 6 --resume run.npz      # bit-identical end
    python scripts/train_gpt.py --peer torch             # the PyTorch twin, same init/batches
    python scripts/train_gpt.py --no-compile --checkpoint-blocks   # activation checkpointing

The model (``gpt_model.GPT``): token and position embeddings, ``--n-layer``
pre-norm blocks (LayerNorm, causal multi-head self-attention through the
fused ``ng.scaled_dot_product_attention``, residual, LayerNorm, MLP 4x with
GELU, residual), a final LayerNorm and a head tied to the token embedding.
The defaults are nanoGPT's CPU character-level config: 4 layers, 4 heads,
128 wide, block 64, batch 12, dropout 0, AdamW (lr 1e-3, cosine down to
1e-4 over ``--max-iters`` with 100 warm-up updates, weight decay 0.1 on
every param, betas (0.9, 0.99)), gradients clipped at norm 1.0, float32.
``--dtype bfloat16`` (or float16) holds the params in half precision, runs
each op in float32 with half outputs and keeps float32 master weights in
AdamW (``master_weights=True``); it runs eagerly (no ``--compile``).

Data: ``--data PATH`` (any UTF-8 text) or, by default, a corpus built
offline from the docstrings of a fixed, sorted list of standard-library
modules (see ``stdlib_corpus``): the same text for a given Python version,
no download. Characters are the vocabulary; the first 90% trains, the last
10% validates. An iteration is one update of ``--accumulate-steps``
micro-batches of ``--batch-size`` random windows, drawn from
``np.random.default_rng([seed, iteration])``, so a resumed run draws the
same batches. Every ``--eval-every`` iterations the validation loss (a
fixed set of ``--eval-batches`` batches) is printed and the checkpoint
(model, optimizer, numbagrad's random state, history) written; ``--stop-at
N`` ends after iteration N as an interruption would and ``--resume PATH``
continues to ``--max-iters`` bit-identically, dropout's masks included.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import sys
import time
import warnings
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_model import GPT, GPTConfig  # noqa: E402  (puts numbagrad on the path)

import numbagrad as ng  # noqa: E402
from numbagrad.serialization import load, save  # noqa: E402
from train_mlp import progress_bar, refuse_other_settings  # noqa: E402

# The settings a checkpoint must agree with to be resumed.
RUN_KEYS = ("data", "batch_size", "block_size", "n_layer", "n_head", "n_embd", "dropout",
            "accumulate_steps", "lr", "min_lr", "warmup", "weight_decay", "beta2", "clip",
            "seed", "dtype", "eval_batches", "max_iters")
# Pure-Python standard-library modules whose docstrings make the default corpus.
CORPUS_MODULES = tuple(sorted((
    "argparse", "ast", "base64", "bisect", "calendar", "collections", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "difflib", "email.message",
    "enum", "fileinput", "fnmatch", "fractions", "ftplib", "functools", "getopt", "gettext",
    "glob", "gzip", "heapq", "hmac", "html.parser", "http.client", "imaplib", "inspect",
    "ipaddress", "json", "logging", "mailbox", "numbers", "optparse", "pathlib", "pprint",
    "queue", "random", "shlex", "shutil", "smtplib", "statistics", "string", "subprocess",
    "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize", "traceback",
    "typing", "unittest.case", "urllib.parse", "uuid", "zipfile")))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", metavar="PATH", default="",
                   help="a UTF-8 text file (default: the stdlib-docstring corpus)")
    p.add_argument("--max-iters", type=int, default=2000,
                   help="iterations (updates) of the whole run, also when resuming")
    p.add_argument("--batch-size", type=int, default=12, help="sequences per micro-batch")
    p.add_argument("--block-size", type=int, default=64, help="context length")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--accumulate-steps", type=int, default=1, help="micro-batches per update")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (AdamW)")
    p.add_argument("--min-lr", type=float, default=1e-4, help="learning rate at --max-iters")
    p.add_argument("--warmup", type=int, default=100,
                   help="linear warm-up updates (at most --max-iters)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--clip", type=float, default=1.0,
                   help="max global gradient norm per update (0: no clipping)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="run each micro-step through ng.compile (default on)")
    p.add_argument("--checkpoint-blocks", action="store_true",
                   help="activation checkpointing: run every block through ng.nn.Checkpoint "
                        "(its activations recomputed in the backward; same results, less "
                        "memory eagerly: use it with --no-compile, see the README)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["float32", "float64", "bfloat16", "float16"],
                   default="float32",
                   help="bfloat16/float16: half params with float32 master weights in AdamW, "
                        "each op computed in float32 (eager: no --compile)")
    p.add_argument("--eval-every", type=int, default=250,
                   help="validation loss and checkpoint every N iterations")
    p.add_argument("--eval-batches", type=int, default=20,
                   help="validation batches (fixed for the run) per evaluation")
    p.add_argument("--checkpoint", metavar="PATH",
                   help="written every --eval-every iterations and at the end (default: the "
                        "--resume path, else train_gpt.npz); '' writes none")
    p.add_argument("--stop-at", type=int, metavar="N",
                   help="end after iteration N, checkpoint written (as if interrupted)")
    p.add_argument("--resume", metavar="PATH", help="continue from this checkpoint")
    p.add_argument("--sample", type=int, default=0, metavar="N",
                   help="generate N characters at the end")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest (0: all)")
    p.add_argument("--plot", metavar="PATH", help="write the loss curves as a PNG")
    p.add_argument("--json", metavar="PATH", help="write the history and timings as JSON")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peer", choices=["numbagrad", "torch"], default="numbagrad",
                   help="torch: train the PyTorch twin instead (same init, batches, "
                        "schedule; no checkpoints)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.checkpoint is None:
        args.checkpoint = args.resume or "train_gpt.npz"
    for name in ("max_iters", "batch_size", "block_size", "n_layer", "n_head", "n_embd",
                 "accumulate_steps", "eval_every", "eval_batches"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.n_embd % args.n_head:
        p.error(f"--n-embd {args.n_embd} must be divisible by --n-head {args.n_head}")
    if not 0 <= args.dropout < 1:
        p.error(f"--dropout must be in [0, 1), got {args.dropout}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.stop_at is not None and not 1 <= args.stop_at <= args.max_iters:
        p.error(f"--stop-at must be in [1, --max-iters={args.max_iters}]")
    if args.temperature <= 0 or args.top_k < 0 or args.sample < 0:
        p.error("--temperature must be > 0, --top-k and --sample >= 0")
    if half_dtype(args) is not None:
        if args.peer == "torch":
            p.error(f"--dtype {args.dtype} is numbagrad's (the torch peer runs float32/64)")
        args.compile = False   # half tensors run eagerly (ops/_half.py)
    if args.peer == "torch" and (args.resume or args.stop_at):
        p.error("--peer torch does not checkpoint: --resume and --stop-at are numbagrad's")
    if args.peer == "torch" and args.checkpoint_blocks:
        p.error("--checkpoint-blocks is numbagrad's (ng.nn.Checkpoint), not --peer torch's")
    return args


def half_dtype(args: argparse.Namespace) -> Any:
    """``--dtype`` as ng.float16 / ng.bfloat16 (which needs ml_dtypes), or None."""
    if args.dtype == "float16":
        return ng.float16
    if args.dtype == "bfloat16":
        return ng.bfloat16
    return None


# ------------------------------------------------------------------- data
def stdlib_corpus(max_chars: int = 400_000) -> str:
    """The default corpus: for each module of ``CORPUS_MODULES`` (sorted), its
    docstring, then those of its public classes and functions and of the
    classes' public methods, each in name order, defined in that module;
    repeats left out, joined by blank lines, cut at ``max_chars``. Offline and
    deterministic; the text follows this Python's standard library."""
    docs: list[str] = []
    seen: set[str] = set()

    def add(obj: Any) -> None:
        doc = inspect.getdoc(obj) if obj is not None else None
        if doc and doc not in seen:
            seen.add(doc)
            docs.append(doc)

    with warnings.catch_warnings():   # typing.io / typing.re warn when their __doc__ is read
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in CORPUS_MODULES:
            _module_docs(importlib.import_module(name), name, add)
    return "\n\n".join(docs)[:max_chars]


def _module_docs(module: Any, name: str, add: Any) -> None:
    """``add`` the docstrings of ``module``, its classes, their methods and its functions."""
    add(module)
    for attr in sorted(vars(module)):
        obj = vars(module)[attr]
        if attr.startswith("_") or getattr(obj, "__module__", None) != name:
            continue
        if inspect.isclass(obj):
            add(obj)
            for meth in sorted(vars(obj)):
                if not meth.startswith("_") and inspect.isfunction(vars(obj)[meth]):
                    add(vars(obj)[meth])
        elif inspect.isfunction(obj):
            add(obj)


def load_text(path: str) -> str:
    if not path:
        return stdlib_corpus()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"--data {path}: cannot read it as UTF-8 text ({exc})") from None


def encode(text: str, block_size: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(train ids, validation ids, vocabulary): characters sorted, 90/10 split."""
    chars = sorted(set(text))
    index = {ch: i for i, ch in enumerate(chars)}
    ids = np.fromiter((index[ch] for ch in text), np.int64, len(text))
    n = int(0.9 * len(ids))
    train, val = ids[:n], ids[n:]
    if min(len(train), len(val)) <= block_size:
        raise SystemExit(f"the text has {len(text)} characters: its 90/10 split needs more "
                         f"than --block-size {block_size} in each part")
    return train, val, chars


def batch(data: np.ndarray, rng: np.random.Generator, n: int, block: int
          ) -> tuple[np.ndarray, np.ndarray]:
    """n random windows of ``data``: inputs (n, block) and next-character targets."""
    rows = rng.integers(0, len(data) - block, n)[:, None] + np.arange(block)
    return data[rows], data[rows + 1]


def iteration_batches(args: argparse.Namespace, train: np.ndarray, it: int) -> list[tuple]:
    """The ``--accumulate-steps`` micro-batches of iteration ``it`` (0-based)."""
    rng = np.random.default_rng([args.seed, it])
    x, y = batch(train, rng, args.accumulate_steps * args.batch_size, args.block_size)
    b = args.batch_size
    return [(x[i:i + b], y[i:i + b]) for i in range(0, len(x), b)]


def eval_batches(args: argparse.Namespace, val: np.ndarray) -> list[tuple]:
    rng = np.random.default_rng([args.seed, 1 << 32])
    return [batch(val, rng, args.batch_size, args.block_size) for _ in range(args.eval_batches)]


# ------------------------------------------------------------------ model
def config_of(args: argparse.Namespace, vocab: int) -> GPTConfig:
    return GPTConfig(vocab, args.block_size, args.n_layer, args.n_head, args.n_embd,
                     args.dropout)


def schedule(args: argparse.Namespace) -> ng.optim.schedules.Cosine:
    return ng.optim.schedules.cosine(args.lr, args.max_iters,
                                     warmup=min(args.warmup, args.max_iters),
                                     final=args.min_lr)


def build(args: argparse.Namespace, vocab: int) -> tuple[GPT, Any]:
    half = half_dtype(args)
    model = GPT(config_of(args, vocab), dtype=half or np.dtype(args.dtype), device=args.device,
                seed=args.seed)
    if getattr(args, "checkpoint_blocks", False):    # same names, same state dict
        blocks = model.transformer.h
        for i, block in enumerate(blocks):
            blocks[i] = ng.nn.Checkpoint(block)
    opt = ng.optim.AdamW(model.parameters(), lr=schedule(args), betas=(0.9, args.beta2),
                         weight_decay=args.weight_decay, accumulate_steps=args.accumulate_steps,
                         max_grad_norm=args.clip or None, master_weights=half is not None)
    return model, opt


def micro_step_fn(model: GPT, opt: Any, compiled: bool) -> Any:
    """``step(x, y) -> loss`` tensor: forward, backward and ``opt.step()``."""
    def loss_of(x, y):
        return model(x, y)[1]
    if compiled:
        return ng.compile(loss_of, optimizer=opt)

    def step(x, y):
        with ng.grad_tape():
            loss = loss_of(x, y)
        loss.backward()
        opt.step()
        return loss
    return step


def evaluate(model: GPT, batches: list[tuple]) -> float:
    """Mean loss over ``batches`` in eval mode (no dropout), nothing recorded."""
    model.eval()
    try:
        return float(np.mean([model(x, y)[1].item() for x, y in batches]))
    finally:
        model.train()


def generate(logits_of: Any, start: int, n: int, block: int, temperature: float, top_k: int,
             seed: int) -> list[int]:
    """n ids sampled one at a time from ``logits_of(context (1, T)) -> (V,)``
    over the last ``block`` ids, softmax(logits / temperature) over the top k."""
    rng = np.random.default_rng([seed, 1 << 33])
    ids = [start]
    for _ in range(n):
        logits = np.asarray(logits_of(np.array([ids[-block:]], np.int64)), np.float64)
        logits = logits / temperature
        if 0 < top_k < len(logits):
            logits[logits < np.partition(logits, -top_k)[-top_k]] = -np.inf
        p = np.exp(logits - logits.max())
        ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return ids[1:]


def progress(args: argparse.Namespace, first: int) -> Any:
    return progress_bar(args, total=args.max_iters, initial=first, unit="it",
                        desc=f"train_gpt {args.peer}")


def plot(history: dict, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(np.arange(1, len(history["train_loss"]) + 1), history["train_loss"], alpha=0.35,
            label="train (per iteration)")
    ax.plot(history["eval_iter"], history["val_loss"], "o-", label="validation")
    ax.set(xlabel="iteration", ylabel="cross-entropy (nats/char)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_settings(args: argparse.Namespace) -> dict:
    return {key: getattr(args, key) for key in RUN_KEYS}


# ------------------------------------------------------------------- loops
def train_numbagrad(args, train, val_batches, vocab, report) -> tuple[dict, GPT, Any]:
    """The run (or its rest, with ``--resume``); returns (history, model, opt)."""
    ng.manual_seed(args.seed)
    model, opt = build(args, vocab)
    history: dict = {"train_loss": [], "eval_iter": [], "val_loss": []}
    first = 0
    if args.resume:
        ckpt = load(args.resume)
        refuse_other_settings(args.resume, ckpt["settings"], run_settings(args))
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        ng.random.set_state(ckpt["random"])
        history = {k: list(v) for k, v in ckpt["history"].items()}
        first = ckpt["iteration"]
        report(f"resumed {args.resume} after iteration {first} ({opt.t} updates)")
    step = micro_step_fn(model, opt, args.compile)
    last = args.max_iters if args.stop_at is None else args.stop_at

    def checkpoint(it: int) -> None:
        if args.checkpoint:
            save(args.checkpoint, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                                   "random": ng.random.get_state(), "iteration": it,
                                   "history": history, "settings": run_settings(args)})

    def micro(x, y):
        return step(x, y).item()
    loop(args, first, last, train, val_batches, micro, lambda: evaluate(model, val_batches),
         history, report, checkpoint)
    return history, model, opt


def train_torch(args, train, val_batches, vocab, report) -> tuple[dict, Any, Any]:
    """The PyTorch twin on the same init, batches and schedule (eager)."""
    import torch

    from gpt_model import TorchGPT
    torch.manual_seed(args.seed)
    model = TorchGPT(config_of(args, vocab), dtype=np.dtype(args.dtype), device=args.device,
                     seed=args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, args.beta2),
                            eps=1e-8, weight_decay=args.weight_decay)
    lr_of, state = schedule(args), {"pos": 0, "t": 0}
    history: dict = {"train_loss": [], "eval_iter": [], "val_loss": []}
    k = args.accumulate_steps

    def micro(x, y):
        _, loss = model(torch.from_numpy(x).to(args.device), torch.from_numpy(y).to(args.device))
        (loss / k).backward()
        state["pos"] += 1
        if state["pos"] == k:
            if args.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            for group in opt.param_groups:
                group["lr"] = lr_of(state["t"])
            opt.step()
            opt.zero_grad(set_to_none=True)
            state["pos"], state["t"] = 0, state["t"] + 1
        return loss.item()

    def evaluate_torch() -> float:
        model.eval()
        with torch.no_grad():
            losses = [model(torch.from_numpy(x).to(args.device),
                            torch.from_numpy(y).to(args.device))[1].item()
                      for x, y in val_batches]
        model.train()
        return float(np.mean(losses))
    loop(args, 0, args.max_iters, train, val_batches, micro, evaluate_torch, history, report,
         lambda it: None)
    return history, model, opt


def loop(args, first, last, train, val_batches, micro, evaluate_fn, history, report,
         checkpoint) -> None:
    """Iterations first+1 .. last: micro-steps, the bar, evaluations, checkpoints."""
    bar = progress(args, first)
    tokens = args.batch_size * args.block_size * args.accumulate_steps
    start, losses, times = time.perf_counter(), [], []
    try:
        for it in range(first, last):
            began = time.perf_counter()
            loss = float(np.mean([micro(x, y) for x, y in iteration_batches(args, train, it)]))
            times.append(time.perf_counter() - began)
            history["train_loss"].append(loss)
            losses.append(loss)
            done = it + 1
            if bar is not None:
                rate = tokens * min(len(times), 20) / sum(times[-20:])
                bar.set_postfix_str(f"loss {loss:.4f}, {rate:,.0f} tok/s", refresh=False)
                bar.update(1)
            if done % args.eval_every == 0 or done == args.max_iters:
                val = evaluate_fn()
                history["eval_iter"].append(done)
                history["val_loss"].append(val)
                report(f"iter {done:5d}/{args.max_iters}  train loss {np.mean(losses):.4f}  "
                       f"val loss {val:.4f}")
                checkpoint(done)
                losses = []
        if last % args.eval_every and last != args.max_iters:
            checkpoint(last)          # --stop-at between evaluations
    finally:
        if bar is not None:
            bar.close()
    # timings of this process only: never in a checkpoint
    history["seconds"] = [time.perf_counter() - start,
                          float(np.median(times[1:] or times or [0.0]))]


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    text = load_text(args.data)
    train, val, chars = encode(text, args.block_size)
    val_batches = eval_batches(args, val)
    source = args.data or f"stdlib docstrings ({len(CORPUS_MODULES)} modules)"
    print(f"{source}: {len(text):,} characters, vocabulary {len(chars)}, "
          f"{len(train):,} train / {len(val):,} validation")
    c = config_of(args, len(chars))
    print(f"GPT {c.n_layer} layers x {c.n_head} heads x {c.n_embd}, block {c.block_size}, "
          f"{args.batch_size} x {args.accumulate_steps} sequences per update, {args.dtype} on "
          f"{args.device}, {args.peer}"
          + (" compiled" if args.peer == "numbagrad" and args.compile else ""))
    def report(line: str) -> None:
        try:
            from tqdm.auto import tqdm
            tqdm.write(line, file=sys.stdout)
        except ImportError:
            print(line)
    trainer = train_numbagrad if args.peer == "numbagrad" else train_torch
    history, model, opt = trainer(args, train, val_batches, len(chars), report)
    seconds, per_iter = history.pop("seconds")
    n_params = sum(int(np.prod(p.shape)) for p in model.parameters())
    if history["val_loss"]:
        print(f"final val loss {history['val_loss'][-1]:.4f} after {len(history['train_loss'])}"
              f" iterations ({seconds:.1f}s this run, median {per_iter * 1e3:.0f} ms/iteration, "
              f"{n_params:,} params)")
    if args.sample:
        if args.peer == "torch":
            import torch
            model.eval()

            def logits_of(ctx):
                with torch.no_grad():
                    return model(torch.from_numpy(ctx).to(args.device))[0][0, -1].cpu().numpy()
        else:
            model.eval()

            def logits_of(ctx):
                return model(ctx)[0].numpy()[0, -1]
        start = chars.index("\n") if "\n" in chars else 0
        ids = generate(logits_of, start, args.sample, args.block_size, args.temperature,
                       args.top_k, args.seed)
        sample = "".join(chars[i] for i in ids)
        print(f"--- sample ({args.sample} characters, temperature {args.temperature}, top-k "
              f"{args.top_k or 'all'}) ---\n{sample}\n---")
    else:
        sample = ""
    if args.plot:
        plot(history, args.plot, f"char GPT ({args.peer}) on {os.path.basename(source)}")
        print(f"wrote {args.plot}")
    result = {"history": history, "seconds": seconds, "seconds_per_iteration": per_iter,
              "vocab": len(chars),
              "sample": sample, "params": n_params}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.peer == "numbagrad":
        result["weights"] = model.state_dict()
    return result


if __name__ == "__main__":
    main()
