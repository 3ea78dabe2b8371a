"""Train the benchmark's ``cnn`` network on scikit-learn's 8x8 digits.

    python scripts/train_cnn.py                       # defaults: >= 98% test accuracy
    python scripts/train_cnn.py --no-compile --plot curves.png
    python scripts/train_cnn.py --epochs 40 --resume train_cnn.npz   # continue a run

The network is the ``cnn`` bench case's (``bench_peers.cnn_model``): two 3x3
convolutions (16 and 32 channels, each ReLU and a 2x2 max pool), flatten and
a linear layer 128-10. The data is ``load_digits`` scaled to [0, 1], split
75/25 stratified (``train_test_split`` with ``random_state=--seed``). Every
Adam update averages ``--accumulate`` micro-batches of ``--batch-size``
images (an epoch's incomplete last micro-batch is left out, as
``DataLoader(drop_last=True)``; a shorter last window is applied with
``opt.flush()``); the learning rate follows a cosine schedule with a linear
warm-up over the run's updates. ``--compile`` (the default) runs each
micro-step through ``ng.compile``, bit-identical to ``--no-compile``.

After every epoch it prints the training loss and the training and test
accuracy and writes a checkpoint (``ng.save``); ``--resume PATH`` continues
one bit-identically. At the end it prints the test accuracy and the confusion
matrix (rows: true digit, columns: predicted). ``--plot PATH`` writes the
loss and accuracy curves as a PNG.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import numbagrad as ng  # noqa: E402
from bench_peers import cnn_model  # noqa: E402  (the one definition of the network)
from numbagrad.serialization import save  # noqa: E402
from train_mlp import plot, progress_bar, resume_epochs  # noqa: E402

CASE = "cnn"
# The settings a checkpoint must agree with to be resumed (--compile may differ: same bits).
RUN_KEYS = ("batch_size", "accumulate", "lr", "warmup", "seed", "dtype", "test_size")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=30, help="total epochs (also when resuming)")
    p.add_argument("--batch-size", type=int, default=32, help="images per micro-batch")
    p.add_argument("--accumulate", type=int, default=4, help="micro-batches per Adam update")
    p.add_argument("--lr", type=float, default=1e-2, help="peak learning rate (Adam)")
    p.add_argument("--warmup", type=float, default=0.05,
                   help="fraction of the updates spent warming up linearly")
    p.add_argument("--seed", type=int, default=0, help="weights, split and shuffling")
    p.add_argument("--test-size", type=float, default=0.25)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="run the micro-steps through ng.compile (default: on)")
    p.add_argument("--checkpoint", metavar="PATH",
                   help="written after every epoch (default: the --resume path, else "
                        "train_cnn.npz); '' writes none")
    p.add_argument("--resume", metavar="PATH", help="continue from this checkpoint")
    p.add_argument("--plot", metavar="PATH", help="write the loss/accuracy curves as a PNG")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--stop-after", type=int, metavar="N",
                   help="stop once N epochs are done (as if interrupted; resume later)")
    args = p.parse_args(argv)
    if args.checkpoint is None:
        args.checkpoint = args.resume or "train_cnn.npz"
    for name in ("epochs", "batch_size", "accumulate"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 <= args.warmup < 1 or not 0 < args.test_size < 1:
        p.error("--warmup must be in [0, 1) and --test-size in (0, 1)")
    return args


def dataset(test_size: float, seed: int, dtype: str) -> tuple:
    """(X_train, X_test, y_train, y_test): images (n, 1, 8, 8) in [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).reshape(-1, 1, 8, 8)
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=test_size, stratify=y,
                                              random_state=seed)
    return (np.ascontiguousarray(X_tr, dtype), np.ascontiguousarray(X_te, dtype),
            y_tr.astype(np.int64), y_te.astype(np.int64))


def batches_per_epoch(args: argparse.Namespace) -> int:
    return args._n_train // args.batch_size


def build(args: argparse.Namespace) -> tuple:
    """(model, optimizer) with the seed's initial weights."""
    model = cnn_model(ng.nn, CASE, dtype=np.dtype(args.dtype), rng=np.random.default_rng(args.seed))
    total = math.ceil(batches_per_epoch(args) / args.accumulate) * args.epochs
    schedule = ng.optim.schedules.cosine(args.lr, total, warmup=int(args.warmup * total))
    return model, ng.optim.Adam(model.parameters(), lr=schedule,
                                accumulate_steps=args.accumulate)


def predict(model: ng.nn.Module, X: np.ndarray) -> np.ndarray:
    """The logits of ``X`` (nothing recorded)."""
    return model(ng.as_tensor(X)).numpy()


def confusion(y_true: np.ndarray, y_pred: np.ndarray, classes: int = 10) -> np.ndarray:
    """counts[i, j]: examples of class i predicted as j."""
    counts = np.zeros((classes, classes), np.int64)
    np.add.at(counts, (y_true, y_pred), 1)
    return counts


def format_confusion(counts: np.ndarray) -> str:
    head = "true\\pred " + " ".join(f"{j:4d}" for j in range(len(counts)))
    rows = [f"{i:9d} " + " ".join(f"{c:4d}" for c in row) for i, row in enumerate(counts)]
    return "\n".join([head, *rows])


def train_epoch(step, opt, X, y, epoch, args, bar) -> float:
    """One shuffled pass (fixed by seed and epoch); returns the mean micro-batch loss."""
    order = np.random.default_rng([args.seed, epoch]).permutation(len(X))
    Xs, ys = X[order], y[order]
    n, size, total = batches_per_epoch(args), args.batch_size, 0.0
    for i in range(n):
        loss = step(Xs[i * size:(i + 1) * size], ys[i * size:(i + 1) * size])
        total += loss.item()
        if bar is not None:
            bar.update(1)
    if opt.pending_steps:
        opt.flush()   # the epoch's last, shorter window
    return total / n


def progress(args: argparse.Namespace, first_epoch: int) -> object | None:
    per_epoch = batches_per_epoch(args)
    return progress_bar(args, total=per_epoch * args.epochs, initial=per_epoch * first_epoch,
                        unit="batch", desc="train_cnn digits")


def run_settings(args: argparse.Namespace) -> dict:
    return {key: getattr(args, key) for key in RUN_KEYS}


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    X_tr, X_te, y_tr, y_te = dataset(args.test_size, args.seed, args.dtype)
    args._n_train = len(X_tr)
    if batches_per_epoch(args) == 0:
        raise SystemExit(f"--batch-size {args.batch_size} exceeds the {len(X_tr)} training "
                         "images")
    model, opt = build(args)
    history = {"train_loss": [], "train_acc": [], "test_loss": [], "test_acc": []}
    first = 0
    if args.resume:
        history, first = resume_epochs(args, run_settings(args), model, opt)
    cross_entropy = ng.cross_entropy

    def loss_fn(x, labels):
        return cross_entropy(model(x), labels)

    if args.compile:
        step = ng.compile(loss_fn, optimizer=opt)
    else:
        def step(x, labels):
            with ng.grad_tape():
                loss = loss_fn(ng.as_tensor(x), labels)
            loss.backward()
            opt.step()
            return loss
    print(f"digits: {len(X_tr)} train / {len(X_te)} test images 1x8x8, 10 classes; "
          f"CNN conv16-pool-conv32-pool-linear, {args.batch_size} x {args.accumulate} per "
          f"update, {args.dtype}, {'compiled' if args.compile else 'eager'}")
    bar = progress(args, first)
    out = bar.write if bar is not None else print
    start = time.perf_counter()
    try:
        last = args.epochs if args.stop_after is None else min(args.epochs, args.stop_after)
        for epoch in range(first, last):
            train_loss = train_epoch(step, opt, X_tr, y_tr, epoch, args, bar)
            logits_tr, logits_te = predict(model, X_tr), predict(model, X_te)
            history["train_loss"].append(train_loss)
            history["train_acc"].append(float((logits_tr.argmax(1) == y_tr).mean()))
            history["test_loss"].append(ng.cross_entropy(ng.as_tensor(logits_te), y_te).item())
            history["test_acc"].append(float((logits_te.argmax(1) == y_te).mean()))
            out(f"epoch {epoch + 1:3d}/{args.epochs}  loss {train_loss:.6f}  train acc "
                f"{history['train_acc'][-1]:.4f}  test loss {history['test_loss'][-1]:.6f}  "
                f"test acc {history['test_acc'][-1]:.4f}")
            if args.checkpoint:
                save(args.checkpoint, {"model": model.state_dict(),
                                       "optimizer": opt.state_dict(), "history": history,
                                       "epoch": epoch + 1, "epochs": args.epochs,
                                       "settings": run_settings(args)})
    finally:
        if bar is not None:
            bar.close()
    elapsed = time.perf_counter() - start
    counts = confusion(y_te, predict(model, X_te).argmax(1))
    if history["test_acc"]:
        print(f"final test accuracy {history['test_acc'][-1]:.4f} after {opt.t} updates "
              f"({elapsed:.1f}s)")
        print("confusion matrix (test split):")
        print(format_confusion(counts))
    if args.plot:
        plot(history, args.plot, "CNN on digits")
        print(f"wrote {args.plot}")
    return {"history": history, "updates": opt.t, "seconds": elapsed, "confusion": counts,
            "weights": model.state_dict()}


if __name__ == "__main__":
    main()
