"""Data-parallel linear regression on MPI: each rank trains on its shard.

    mpiexec -n 2 python -m mpi4py scripts/train_dp.py
    mpiexec -n 2 python -m mpi4py scripts/train_dp.py --optimizer adam --json out.json
    mpiexec -n 2 python -m mpi4py scripts/train_dp.py --bench     # allreduce share
    python scripts/train_dp.py                                     # one process works too

Every window holds ``size * k * micro`` examples: rank r takes the r-th
contiguous block and feeds it as k micro-batches of ``micro`` columns. With
the MSE mean loss this lands exactly where one process taking the whole
window as one batch lands (``reference`` computes that; the run prints both
final losses side by side). The defaults converge: the loss falls by far
more than 10x with SGD and with Adam.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import numbagrad as ng

LR = {"sgd": 0.2, "adam": 0.1}
MOMENTUM = 0.5
WINDOWS = 40


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--lr", type=float, default=None,
                   help=f"learning rate (default: {LR['sgd']} for SGD, {LR['adam']} for Adam)")
    p.add_argument("--momentum", type=float, default=MOMENTUM, help="SGD's momentum")
    p.add_argument("--windows", type=int, default=None,
                   help=f"accumulation windows (default {WINDOWS}; 4 with --bench)")
    p.add_argument("--k", type=int, default=2, help="micro-batches per window per rank")
    p.add_argument("--micro", type=int, default=8, help="columns per micro-batch")
    p.add_argument("--d-in", type=int, default=8)
    p.add_argument("--d-out", type=int, default=3)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="rank 0 writes the results here")
    p.add_argument("--fail-rank", type=int, default=None,
                   help="this rank raises in the second window (tests the abort path)")
    p.add_argument("--bench", action="store_true",
                   help="time 1024x1024 float32 windows and report the allreduce share")
    args = p.parse_args(argv)
    if not args.bench:
        args.windows = args.windows or WINDOWS
    if args.bench:
        args.d_in = args.d_out = 1024
        args.micro, args.k, args.dtype, args.optimizer = 512, 4, "float32", "adam"
        args.windows = args.windows or 4
    return args


def make_data(args: argparse.Namespace, world: int) -> tuple[np.ndarray, np.ndarray]:
    """Every window's examples (the same on every rank): X, Y of shape
    (windows, d, world * k * micro)."""
    rng = np.random.default_rng(args.seed)
    n = world * args.k * args.micro
    true_w = rng.normal(size=(args.d_out, args.d_in))
    X = rng.normal(size=(args.windows, args.d_in, n))
    Y = true_w @ X + 0.1 * rng.normal(size=(args.windows, args.d_out, n))
    return X.astype(args.dtype), Y.astype(args.dtype)


def make_optimizer(args: argparse.Namespace, W: ng.Tensor, k: int) -> ng.optim.Optimizer:
    lr = args.lr if args.lr is not None else LR[args.optimizer]
    if args.optimizer == "sgd":
        return ng.optim.SGD([W], lr=lr, momentum=args.momentum, accumulate_steps=k)
    return ng.optim.Adam([W], lr=lr, accumulate_steps=k)


def initial_weights(args: argparse.Namespace, rank: int) -> np.ndarray:
    # Deliberately different per rank: broadcast_parameters makes them equal.
    rng = np.random.default_rng(args.seed + 1000 + rank)
    return rng.normal(size=(args.d_out, args.d_in)).astype(args.dtype)


def reference(args: argparse.Namespace, world: int) -> np.ndarray:
    """One process, one full-batch step per window, from rank 0's start."""
    X, Y = make_data(args, world)
    W = ng.param(initial_weights(args, 0), device=args.device)
    opt = make_optimizer(args, W, 1)
    for x, y in zip(X, Y):
        with ng.grad_tape():
            loss = ng.mse_loss(W @ ng.tensor(x, device=args.device),
                               ng.tensor(y, device=args.device))
        loss.backward()
        opt.step()
    return W.numpy()


def full_loss(args: argparse.Namespace, world: int, W: np.ndarray) -> float:
    """The MSE of weights W over every window's examples."""
    X, Y = make_data(args, world)
    return float(np.mean((np.einsum("ij,wjn->win", W.astype(np.float64), X) - Y) ** 2))


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    import numbagrad.distributed as dist
    comm = dist.init()
    rank, world = dist.rank(), dist.size()
    X, Y = make_data(args, world)
    shard = args.k * args.micro

    W = ng.param(initial_weights(args, rank), device=args.device)
    dist.broadcast_parameters([W])
    start_sums = comm.gather(float(W.numpy().sum()), root=0)
    opt = dist.DistributedOptimizer(make_optimizer(args, W, args.k))

    # Each rank's micro-batches, made once: the loop then copies nothing.
    def columns(i: int) -> slice:
        return slice(rank * shard + i * args.micro, rank * shard + (i + 1) * args.micro)

    batches = [[(ng.tensor(x[:, columns(i)], device=args.device),
                 ng.tensor(y[:, columns(i)], device=args.device)) for i in range(args.k)]
               for x, y in zip(X, Y)]
    losses, window_seconds, first_reduce = [], [], 0.0
    for window, micro_batches in enumerate(batches):
        if window == 1 and rank == args.fail_rank:
            raise RuntimeError(f"rank {rank} fails on purpose (--fail-rank)")
        start = time.perf_counter()
        total = 0.0
        for x, y in micro_batches:
            with ng.grad_tape():
                loss = ng.mse_loss(W @ x, y)
            loss.backward()
            opt.step()
            total += loss.item()
        window_seconds.append(time.perf_counter() - start)
        if window == 0:   # compiles kernels: kept out of the timing
            first_reduce = opt.allreduce_seconds
        losses.append(comm.allreduce(total / args.k) / world)
        if rank == 0 and not args.bench and (window % 4 == 0 or window == args.windows - 1):
            print(f"window {window:3d}: mean loss {losses[-1]:.6f}", flush=True)

    final = W.numpy()
    final_sums = comm.gather(float(final.sum()), root=0)
    timing = comm.gather((sum(window_seconds[1:]), opt.allreduce_seconds - first_reduce),
                         root=0)
    if rank != 0:
        return
    if not args.bench:   # the whole data set's loss: at the start, at the end, and
        # at the end of one process taking each window as one full batch
        start_loss, end_loss, ref_loss = (full_loss(args, world, w) for w in (
            initial_weights(args, 0), final, reference(args, world)))
    steady = max(t for t, _ in timing)        # the slowest rank sets the pace
    reduce_s = max(r for _, r in timing)
    result = {
        "size": world, "optimizer": args.optimizer, "windows": args.windows, "k": args.k,
        "weights": final.tolist(), "losses": losses, "t": opt.t,
        "allreduce_calls": opt.allreduce_calls,
        "initial_equal": len(set(start_sums)) == 1, "final_equal": len(set(final_sums)) == 1,
        "allreduce_share": reduce_s / steady if steady else None,
    }
    if not args.bench:
        result.update(initial_loss=start_loss, final_loss=end_loss, reference_final_loss=ref_loss)
    print(f"{world} ranks, {args.windows} windows of {world} x {args.k} micro-batches: "
          f"t={opt.t}, allreduce calls {opt.allreduce_calls}, ranks agree: "
          f"{result['final_equal']}")
    if not args.bench:
        print(f"loss over all {args.windows} windows' examples: {start_loss:.4g} at the start, "
              f"final loss {end_loss:.4g} ({start_loss / end_loss:.0f}x lower); single-process "
              f"full-batch final loss {ref_loss:.4g}")
    else:
        print(f"allreduce share of step time, {world} ranks, {args.d_out}x{args.d_in} "
              f"{args.dtype}, k={args.k}: {100 * result['allreduce_share']:.1f}% "
              f"({1e3 * reduce_s / max(1, opt.allreduce_calls - 1):.2f} ms per allreduce, "
              f"{1e3 * steady / max(1, args.windows - 1):.1f} ms per window)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh)


if __name__ == "__main__":
    main()
