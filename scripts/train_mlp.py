"""Train an MLP classifier on scikit-learn's digits (or breast cancer) data.

    python scripts/train_mlp.py                                  # digits, 20 epochs
    python scripts/train_mlp.py --data breast_cancer --plot curves.png
    python scripts/train_mlp.py --epochs 30 --resume train_mlp.npz  # continue a run
    python scripts/train_mlp.py --compare-sklearn   # numbagrad.sklearn vs scikit-learn

Every optimizer window holds ``--accumulate`` micro-batches of
``--batch-size`` examples (the last window of an epoch may be shorter and is
applied with ``opt.flush()``); the gradient is the per-example average over
the window, clipped to ``--clip`` in total norm; the learning rate follows a
cosine schedule with a linear warm-up over all the run's updates. After
every epoch the script prints the epoch's training loss and the accuracy on
the training and test splits, and writes a checkpoint (``ng.save``: model,
optimizer, history). ``--resume PATH`` loads one and continues: the run ends
bit-identical to one that was never interrupted. ``--plot PATH`` writes a
PNG of the loss and accuracy curves.

``--compare-sklearn`` instead fits ``numbagrad.sklearn.MLPClassifier`` and
scikit-learn's ``MLPClassifier`` with the same settings (hidden (64,),
random_state=0, max_iter=200, a stratified 75/25 split of the scaled data)
``--repeats`` times each, alternating, and prints their test accuracies and
best and median fit times.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import numbagrad as ng
from numbagrad.serialization import load, save

# The settings a checkpoint must agree with to be resumed.
RUN_KEYS = ("data", "hidden", "activation", "batch_size", "accumulate", "lr", "warmup",
            "final_lr", "clip", "alpha", "seed", "dtype", "test_size")
ACTIVATIONS = {"relu": ng.nn.ReLU, "tanh": ng.nn.Tanh, "sigmoid": ng.nn.Sigmoid}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", choices=["digits", "breast_cancer"], default="digits")
    p.add_argument("--hidden", type=int, nargs="+", default=[64], help="hidden layer sizes")
    p.add_argument("--activation", choices=sorted(ACTIVATIONS), default="relu")
    p.add_argument("--epochs", type=int, default=20, help="total epochs (also when resuming)")
    p.add_argument("--batch-size", type=int, default=32, help="examples per micro-batch")
    p.add_argument("--accumulate", type=int, default=4, help="micro-batches per update")
    p.add_argument("--lr", type=float, default=1e-2, help="peak learning rate (Adam)")
    p.add_argument("--warmup", type=float, default=0.05,
                   help="fraction of the updates spent warming up linearly")
    p.add_argument("--final-lr", type=float, default=0.0, help="learning rate at the end")
    p.add_argument("--clip", type=float, default=1.0,
                   help="max global gradient norm per update (0: no clipping)")
    p.add_argument("--alpha", type=float, default=1e-4, help="L2 penalty on the weights")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--test-size", type=float, default=0.25)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--checkpoint", metavar="PATH",
                   help="written after every epoch (default: the --resume path, else "
                        "train_mlp.npz); '' writes none")
    p.add_argument("--resume", metavar="PATH", help="continue from this checkpoint")
    p.add_argument("--plot", metavar="PATH", help="write the loss/accuracy curves as a PNG")
    p.add_argument("--json", metavar="PATH", help="write the history as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--compare-sklearn", action="store_true",
                   help="benchmark numbagrad.sklearn.MLPClassifier against scikit-learn's")
    p.add_argument("--repeats", type=int, default=5, help="fits per estimator (--compare-sklearn)")
    p.add_argument("--stop-after", type=int, metavar="N",
                   help="stop once N epochs are done (as if interrupted; resume later)")
    args = p.parse_args(argv)
    if args.checkpoint is None:
        args.checkpoint = args.resume or "train_mlp.npz"
    for name in ("epochs", "batch_size", "accumulate"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 <= args.warmup < 1 or not 0 < args.test_size < 1:
        p.error("--warmup must be in [0, 1) and --test-size in (0, 1)")
    return args


# ------------------------------------------------------------------- data
def dataset(name: str, test_size: float, seed: int, dtype: str) -> tuple:
    """(X_train, X_test, y_train, y_test, n_classes), features scaled."""
    from sklearn import datasets
    from sklearn.model_selection import train_test_split

    X, y = (datasets.load_digits if name == "digits" else datasets.load_breast_cancer)(
        return_X_y=True)
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=test_size, stratify=y,
                                              random_state=seed)
    if name == "digits":
        X_tr, X_te = X_tr / 16.0, X_te / 16.0
    else:   # standardise with the training split's statistics
        mean, std = X_tr.mean(axis=0), X_tr.std(axis=0)
        std[std == 0] = 1.0
        X_tr, X_te = (X_tr - mean) / std, (X_te - mean) / std
    cast = [np.ascontiguousarray(a, dtype) for a in (X_tr, X_te)]
    return cast[0], cast[1], y_tr.astype(np.int64), y_te.astype(np.int64), int(y.max()) + 1


# ------------------------------------------------------------------ model
def build(args: argparse.Namespace, n_in: int, n_out: int) -> tuple:
    rng = np.random.default_rng(args.seed)
    sizes = [n_in, *args.hidden, n_out]
    layers: list = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(ng.nn.Linear(a, b, dtype=np.dtype(args.dtype), device=args.device,
                                   rng=rng))
        if i < len(sizes) - 2:
            layers.append(ACTIVATIONS[args.activation]())
    model = ng.nn.Sequential(*layers)
    per_epoch = updates_per_epoch(args)
    total = per_epoch * args.epochs
    schedule = ng.optim.schedules.cosine(args.lr, total, warmup=int(args.warmup * total),
                                         final=args.final_lr)
    opt = ng.optim.Adam(model.parameters(), lr=schedule, accumulate_steps=args.accumulate,
                        average="samples", max_grad_norm=args.clip or None)
    return model, opt


def updates_per_epoch(args: argparse.Namespace) -> int:
    n_train = args._n_train
    return math.ceil(math.ceil(n_train / args.batch_size) / args.accumulate)


def evaluate(model: ng.nn.Module, X: np.ndarray, y: np.ndarray, device: str) -> tuple:
    """(mean loss, accuracy) of the model on (X, y), nothing recorded."""
    x = ng.as_tensor(X) if device == "cpu" else ng.tensor(X, device=device)
    logits = model(x)
    loss = ng.cross_entropy(logits, y).item()
    return loss, float((logits.numpy().argmax(axis=1) == y).mean())


# ------------------------------------------------------------------- loop
def train_epoch(model, opt, weights, X, y, epoch, args, bar) -> float:
    """One shuffled pass; returns the mean training loss (data + penalty)."""
    order = np.random.default_rng([args.seed, epoch]).permutation(len(X))
    Xs, ys = X[order], y[order]
    if args.device != "cpu":
        Xs = ng.tensor(Xs, device=args.device).data
    total, n = 0.0, len(Xs)
    for start in range(0, n, args.batch_size):
        stop = min(start + args.batch_size, n)
        with ng.grad_tape():
            logits = model(ng.as_tensor(Xs[start:stop]))
            loss = ng.cross_entropy(logits, ys[start:stop], reduction="sum")
            if args.alpha and opt.pending_steps == 0:
                # 0.5 * alpha * ||W||^2 once per window, which averages over its samples
                loss = loss + 0.5 * args.alpha * sum((w * w).sum() for w in weights)
        loss.backward()
        opt.step(samples=stop - start)
        total += loss.item()
        if bar is not None:
            bar.update(1)
    if opt.pending_steps:
        opt.flush()   # the epoch's last, shorter window
    return total / n


def progress_bar(args: argparse.Namespace, **bar: object) -> object | None:
    """A tqdm bar on stderr with ``bar``'s settings (the model scripts share it),
    or None with ``--no-progress`` or without tqdm."""
    if args.no_progress:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(dynamic_ncols=True, file=sys.stderr, **bar)


def refuse_other_settings(path: str, saved: dict, mine: dict) -> None:
    """Exit naming every setting of ``mine`` the checkpoint at ``path`` was
    written with otherwise (the model scripts share it)."""
    diff = {k: (saved.get(k), mine[k]) for k in mine if saved.get(k) != mine[k]}
    if diff:
        raise SystemExit(f"{path} was written with other settings (checkpoint, now): {diff}")


def resume_epochs(args: argparse.Namespace, settings: dict, model, opt) -> tuple[dict, int]:
    """Load ``--resume``'s checkpoint of an epoch-based script (this one's and
    train_cnn's) into ``model`` and ``opt``: (its history, the epochs done),
    after refusing other settings or another ``--epochs``."""
    ckpt = load(args.resume)
    refuse_other_settings(args.resume, ckpt["settings"], settings)
    if ckpt["epochs"] != args.epochs:   # the schedule's length depends on it
        raise SystemExit(f"{args.resume} is a run of --epochs {ckpt['epochs']}; "
                         "resume it with the same --epochs")
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    first = ckpt["epoch"]
    print(f"resumed {args.resume} after epoch {first} ({opt.t} updates)")
    return {k: list(v) for k, v in ckpt["history"].items()}, first


def progress(args: argparse.Namespace, first_epoch: int) -> object | None:
    per_epoch = math.ceil(args._n_train / args.batch_size)
    return progress_bar(args, total=per_epoch * args.epochs, initial=per_epoch * first_epoch,
                        unit="batch", desc=f"train_mlp {args.data}")


def plot(history: dict, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    epochs = np.arange(1, len(history["train_loss"]) + 1)
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot(epochs, history["train_loss"], label="train (running)")
    ax_loss.plot(epochs, history["test_loss"], label="test")
    ax_loss.set(xlabel="epoch", ylabel="cross-entropy", title="loss", yscale="log")
    ax_acc.plot(epochs, history["train_acc"], label="train")
    ax_acc.plot(epochs, history["test_acc"], label="test")
    ax_acc.set(xlabel="epoch", ylabel="accuracy", title="accuracy")
    for ax in (ax_loss, ax_acc):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def compare_sklearn(args: argparse.Namespace) -> dict:
    """Fit both MLPClassifiers ``args.repeats`` times each, alternating."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier as Theirs

    from numbagrad.sklearn import MLPClassifier as Ours

    X_tr, X_te, y_tr, y_te, _ = dataset(args.data, 0.25, 0, "float64")
    settings = {"hidden_layer_sizes": (64,), "random_state": 0, "max_iter": 200}
    results: dict = {"numbagrad": [], "scikit-learn": []}
    accuracy = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        Ours(**{**settings, "max_iter": 1}).fit(X_tr[:10], y_tr[:10])   # compile first
        for _ in range(args.repeats):
            for name, cls in (("numbagrad", Ours), ("scikit-learn", Theirs)):
                est = cls(**settings)
                start = time.perf_counter()
                est.fit(X_tr, y_tr)
                results[name].append(time.perf_counter() - start)
                accuracy[name] = float(est.score(X_te, y_te))
    summary = {name: {"accuracy": accuracy[name], "best_s": min(times),
                      "median_s": float(np.median(times))} for name, times in results.items()}
    for name, row in summary.items():
        print(f"{name:13s} test accuracy {row['accuracy']:.4f}  fit best {row['best_s']:.3f}s  "
              f"median {row['median_s']:.3f}s")
    ratio = summary["numbagrad"]["best_s"] / summary["scikit-learn"]["best_s"]
    gap = summary["numbagrad"]["accuracy"] - summary["scikit-learn"]["accuracy"]
    print(f"numbagrad / scikit-learn fit time: {ratio:.2f} (best of {args.repeats}); "
          f"accuracy difference {gap:+.4f}")
    summary["ratio"] = ratio
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return summary


def run_settings(args: argparse.Namespace) -> dict:
    return {key: getattr(args, key) for key in RUN_KEYS}


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    if args.compare_sklearn:
        return compare_sklearn(args)
    X_tr, X_te, y_tr, y_te, n_classes = dataset(args.data, args.test_size, args.seed,
                                                args.dtype)
    args._n_train = len(X_tr)
    model, opt = build(args, X_tr.shape[1], n_classes)
    weights = [lin.weight for lin in model if isinstance(lin, ng.nn.Linear)]
    history = {"train_loss": [], "train_acc": [], "test_loss": [], "test_acc": [], "lr": []}
    first = 0
    if args.resume:
        history, first = resume_epochs(args, run_settings(args), model, opt)
    print(f"{args.data}: {len(X_tr)} train / {len(X_te)} test, {X_tr.shape[1]} features, "
          f"{n_classes} classes; MLP {[X_tr.shape[1], *args.hidden, n_classes]}, "
          f"{args.batch_size} x {args.accumulate} per update, {args.dtype} on {args.device}")
    bar = progress(args, first)
    out = bar.write if bar is not None else print
    start = time.perf_counter()
    try:
        last = args.epochs if args.stop_after is None else min(args.epochs, args.stop_after)
        for epoch in range(first, last):
            lr_now = opt.lr   # what the next update uses (the schedule at opt.t)
            train_loss = train_epoch(model, opt, weights, X_tr, y_tr, epoch, args, bar)
            _, train_acc = evaluate(model, X_tr, y_tr, args.device)
            test_loss, test_acc = evaluate(model, X_te, y_te, args.device)
            for key, value in (("train_loss", train_loss), ("train_acc", train_acc),
                               ("test_loss", test_loss), ("test_acc", test_acc),
                               ("lr", lr_now)):
                history[key].append(value)
            out(f"epoch {epoch + 1:3d}/{args.epochs}  loss {train_loss:.6f}  "
                f"train acc {train_acc:.4f}  test loss {test_loss:.6f}  "
                f"test acc {test_acc:.4f}  lr {lr_now:.3e}")
            if args.checkpoint:
                save(args.checkpoint, {"model": model.state_dict(),
                                       "optimizer": opt.state_dict(),
                                       "history": history, "epoch": epoch + 1,
                                       "epochs": args.epochs, "settings": run_settings(args)})
    finally:
        if bar is not None:
            bar.close()
    elapsed = time.perf_counter() - start
    if history["test_acc"]:
        print(f"final test accuracy {history['test_acc'][-1]:.4f} after {opt.t} updates "
              f"({elapsed:.1f}s)")
    if args.plot:
        plot(history, args.plot, f"MLP on {args.data}")
        print(f"wrote {args.plot}")
    result = {"history": history, "updates": opt.t, "seconds": elapsed,
              "weights": model.state_dict()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"history": history, "updates": opt.t}, f, indent=1)
    return result


if __name__ == "__main__":
    main()
