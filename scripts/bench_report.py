"""The benchmark's report: the header, the legend, the table, each row's
ratios and noise marks, the verdict on the issues' targets and the closing
warning of a noisy run. Everything printed is formatted here.
"""
from __future__ import annotations

import argparse

from bench_cases import CASES, EXTRA_PEERS, K
from bench_machine import blas_summary, process_summary

SPREAD_LIMIT = 0.20          # a cell whose IQR / median exceeds this marks its row

# stall_check: the floor is also timed on one BLAS thread; when that beats all
# threads by STALL_LIMIT, the BLAS threads are waiting for cores others hold.
STALL_LIMIT = 1.25
SUBJECTS = ("numbagrad", "numbagrad compiled")      # the ones whose ratios are reported
SHORT = {"numbagrad": "ng", "numbagrad compiled": "ngc", "numpy": "numpy", "torch": "torch",
         "torch compiled": "tc", "jax": "jax", "floor": "floor", "tinygrad": "tinyg",
         "autograd": "autog", "mygrad": "mygrad"}
# the peers a subject races: every peer but the subjects and the floor (a lower bound)
NOT_RIVALS = SUBJECTS + ("floor",)
DESCRIPTION = {
    "numbagrad": "ng ops on ng.grad_tape(), loss.backward(), opt.step()",
    "numbagrad compiled": "step = ng.compile(loss_fn, optimizer=opt); step(x, y)",
    "numpy": "the same math written by hand in NumPy, preallocated buffers",
    "torch": ("PyTorch eager, (loss / K).backward(), opt.step() + zero_grad() every K; "
              "on 1 and 2 threads and its default count, the fastest kept (the row says "
              "which)"),
    "torch compiled": ("the same with the loss function through torch.compile (inductor), "
                       "compiled before timing"),
    "jax": "jax.jit(value_and_grad + optax.MultiSteps update), donated buffers",
    "floor": "only the GEMMs a micro-step cannot avoid (forward, weight and hidden "
             "gradients), SciPy's BLAS (numbagrad's): each GEMM on one BLAS thread or on "
             "OpenBLAS's own threads, whichever ran it faster at setup, timed alone: a "
             "lower bound, not a competitor",
    "tinygrad": ("tinygrad on its CPU backend (DEV=CPU), its own SGD/Adam, the "
                 "accumulating micro-step and the update each a TinyJit; linear and MLP "
                 "cases"),
    "autograd": ("HIPS autograd: value_and_grad on autograd.numpy, the gradients "
                 "accumulated and applied by the NumPy loop's optimizer; linear and MLP cases"),
    "mygrad": ("mygrad: loss.backward() on tensors sharing the weights' memory, the "
               "gradients accumulated and applied by the NumPy loop's optimizer; linear "
               "and MLP cases"),
}


def ratios(best: dict[str, float], peers: list[str]) -> dict[str, float]:
    """``subject/peer`` -> best-time ratio, for every subject and other peer
    timed, and ``subject/best peer``: against the fastest rival (``best_peer``)."""
    out = {f"{a}/{b}": best[a] / best[b] for a in SUBJECTS if a in best
           for b in peers if b in best and b not in SUBJECTS}
    rival = best_peer(best, peers)
    if rival is not None:
        out.update({f"{a}/best peer": best[a] / best[rival] for a in SUBJECTS if a in best})
    return out


def best_peer(best: dict[str, float], peers: list[str]) -> str | None:
    """The fastest of ``peers`` timed in a row (``best``: name -> best seconds),
    leaving out the subjects and the GEMM floor; None when none ran."""
    rivals = [p for p in peers if p in best and p not in NOT_RIVALS]
    return min(rivals, key=best.__getitem__) if rivals else None


def flags(case: str, device: str, stats: dict[str, dict]) -> list[str]:
    """Why a row is unreliable: a wide spread, BLAS threads stalling, or (in
    the GEMM-bound cases on the CPU) a time below the floor; empty when clean."""
    best = {n: s["best_s"] for n, s in stats.items()}
    out = [f"{n} spread {100 * s['spread']:.0f}%" for n, s in stats.items()
           if s["spread"] > SPREAD_LIMIT]
    if "floor 1 thread" in best and best["floor 1 thread"] * STALL_LIMIT < best["floor"]:
        out.append(f"BLAS threads stalled (floor {fmt_us(best['floor'])} µs, "
                   f"{fmt_us(best['floor 1 thread'])} µs on one thread)")
    if "floor" in best and CASES[case].get("stall_check"):
        # GEMM-bound cases only: tiny GEMMs run as plain loops, below the BLAS call cost
        out += [f"{n} below its floor ({best[n] / best['floor']:.2f}x)"
                for n in ("numbagrad", "numbagrad compiled", "numpy")
                if n in best and best[n] < best["floor"] and device == "cpu"]
    return out


def print_intro(info: dict, args: argparse.Namespace, in_process: bool) -> None:
    """The machine, the versions, the settings and where the peers run."""
    v = info["versions"]
    print(f"numbagrad micro-step benchmark on {info['cpu']}, {info['usable_cores']} of "
          f"{info['cores']} cores, numbagrad's BLAS {blas_summary(info)}")
    print("numbagrad {numbagrad} | numpy {numpy} | numba {numba} | scipy {scipy} | "
          "torch {torch} | jax {jax} | optax {optax} | tinygrad {tinygrad} | "
          "autograd {autograd} | mygrad {mygrad}".format(
              **{k: v.get(k) or "not installed" for k in v})
          + f" | device {args.device} | {args.repeats} rounds of >= {args.min_time * 1e3:g} ms"
          + (f" | threads limited to {args.threads}" if args.threads else ""))
    if in_process:
        print("every peer in this one process (--in-process): the libraries change each "
              "other's threads and speed")
    else:
        print("each peer group in a process of its own, with its library's defaults:")
        print("\n".join(process_summary(info)))
    if info["blas_environment"]["warning"]:
        print(info["blas_environment"]["warning"])


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
             for b in ratio_peers(peers)]
    cols += [(f"{SHORT[a]}/", "best", 7) for a in SUBJECTS if a in peers]
    cols += [("best", "peer", 8)]
    cols += [("spread", "IQR/med", 7), ("ng B", "/step", 7), ("np B", "/step", 8), ("", "", 1)]
    return cols


def ratio_peers(peers: list[str]) -> list[str]:
    """The peers with a ratio column of their own: tinygrad, autograd and mygrad
    show in the best-peer columns (and in ``--json``'s ratios) only."""
    return [b for b in peers if b not in SUBJECTS and b not in EXTRA_PEERS]


def table_cells(row: dict, peers: list[str]) -> list[str]:
    cells = [row["dtype"], row["optimizer"]]
    for n in peers:
        s = row.get(n)
        cells.append("n/a" if s is None else f"{fmt_us(s['best_s'])}/{fmt_us(s['median_s'])}")
    cells += [fmt_ratio(row["ratios"].get(f"{a}/{b}")) for a in SUBJECTS if a in peers
              for b in ratio_peers(peers)]
    cells += [fmt_ratio(row["ratios"].get(f"{a}/best peer")) for a in SUBJECTS if a in peers]
    cells.append(SHORT.get(row.get("best_peer"), "n/a"))
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
        ("processes", ("each peer group (numbagrad, NumPy + floor, PyTorch, PyTorch compiled, "
                       "JAX, tinygrad, autograd, mygrad) runs in a process of its own with "
                       "its library's defaults, one "
                       "process timing at a time" if not args.in_process else
                       "--in-process: every peer in one process (the libraries then change "
                       "each other's threads and speed)")),
    ]
    items += [(n, DESCRIPTION[n]) for n in peers]
    items += [
        ("ng/X", ("numbagrad's best time / X's best time, same rounds: below 1.00x numbagrad "
                  "is faster; ng/floor near 1.00x is the best possible")),
        ("ng/best, best peer", ("numbagrad's best time / the fastest rival's of the row "
                                "(every peer but numbagrad and the floor), and which it was")),
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



def print_row(row: dict, peers: list[str], cols) -> None:
    """A row of the table, then the peers that could not run and PyTorch's threads."""
    print(line(table_cells(row, peers), cols), flush=True)
    for name, err in row.get("errors", {}).items():
        print(f"    ({name} could not run: {err.strip().splitlines()[-1]})")
    threads = {n: row[n]["threads"] for n in peers if row.get(n) and "threads" in row[n]}
    if threads:
        print("    (" + "; ".join(f"{n} on {t} thread{'s' * (t > 1)}"
                                  for n, t in threads.items()) + ")")


# ------------------------------------------------------------------ verdict
# (label, case, subject, peer, limit): subject/peer best-time ratio must be <= limit
# (issue 32 tightened tiny/NumPy to 1.0 and gpt/PyTorch to 0.6, and added the
# floor targets of cnn and gpt and compiled-vs-eager); ALL_CASES: every case run
ALL_CASES = "every case"
TARGETS = [
    ("tiny linear step", "tiny", "numbagrad", "numpy", 1.0),
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
    ("bmm (48,64,32) @ (48,32,64)", "bmm", "numbagrad", "torch", 1.1),
    ("cnn, compiled", "cnn", "numbagrad compiled", "torch", 0.5),
    ("cnn, compiled", "cnn", "numbagrad compiled", "floor", 1.5),
    # --- attention
    ("causal attention (12,4,64,32)", "attention", "numbagrad", "torch", 1.0),
    # --- dqn
    ("dqn, compiled", "dqn", "numbagrad compiled", "torch", 0.10),
    ("dqn, compiled", "dqn", "numbagrad compiled", "jax", 0.50),
    # --- gpt
    ("gpt, compiled", "gpt", "numbagrad compiled", "floor", 1.15),
    ("gpt, compiled", "gpt", "numbagrad compiled", "torch", 0.6),
    ("gpt, compiled", "gpt", "numbagrad compiled", "jax", 1.0),
    # --- lstm
    ("lstm, compiled", "lstm", "numbagrad compiled", "torch", 0.8),
    # --- every case: a compiled step is never slower than eager mode
    ("compiled vs eager, every case", ALL_CASES, "numbagrad compiled", "numbagrad", 1.0),
]
PEER_NAME = {"numpy": "NumPy loop", "torch": "PyTorch eager", "jax": "JAX jit",
             "floor": "GEMM floor", "torch compiled": "torch.compile",
             "tinygrad": "tinygrad", "autograd": "autograd", "mygrad": "mygrad",
             "numbagrad": "numbagrad eager"}


def verdict(rows: list[dict], peers: list[str]) -> list[dict]:
    """Each target's worst ratio over the case's rows (every dtype and
    optimizer run), leaving out noisy rows unless all are; compiled targets
    only when the compiled peer ran."""
    out = []
    for label, case, subject, peer, limit in TARGETS:
        if subject not in peers:
            continue
        found = [(v, r) for r in rows if case in (ALL_CASES, r["case"])
                 for v in [_ratio(r, subject, peer)] if v is not None]
        entry = {"target": label, "case": case, "subject": subject, "peer": peer,
                 "limit": limit, "ratio": None, "status": "not measured", "row": None,
                 "rows": 0, "noisy_rows_left_out": 0, "best_row_ratio": None, "noisy": False}
        clean = [(v, r) for v, r in found if not r["flags"]]
        if found:
            use = clean or found
            value, row = max(use, key=lambda t: t[0])
            entry.update(ratio=value, status="met" if value <= limit else "missed",
                         row=f"{row['dtype']} {row['optimizer']}", row_case=row["case"],
                         noisy=not clean,
                         rows=len(use), noisy_rows_left_out=len(found) - len(use),
                         best_row_ratio=min(v for v, _ in use))
        out.append(entry)
    return out


def _ratio(row: dict, subject: str, peer: str) -> float | None:
    """``subject/peer`` of a row: its ratio, or for two subjects (compiled
    against eager) the ratio of their best times; None when one did not run."""
    if peer not in SUBJECTS:
        return row["ratios"].get(f"{subject}/{peer}")
    if row.get(subject) and row.get(peer):
        return row[subject]["best_s"] / row[peer]["best_s"]
    return None


def print_verdict(entries: list[dict]) -> None:
    print("\nVerdict: the issues' targets; each ratio is the worst over the case's rows "
          "(noisy rows left out when others are clean)")
    for e in entries:
        what = f"{e['subject']} / {PEER_NAME[e['peer']]}"
        head = f"  {e['target']:<31} {what:<35} <= {fmt_ratio(e['limit']):<6}"
        if e["ratio"] is None:
            what = "no case run" if e["case"] == ALL_CASES else f"case {e['case']} not run"
            print(f"{head} {'':>7}  not measured ({what})")
            continue
        where = e["row"] if e["case"] != ALL_CASES else f"{e['row_case']} {e['row']}"
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

def best_peer_verdict(rows: list[dict]) -> list[dict]:
    """Per row: the fastest rival (``best_peer``), its best time, and each
    subject's ratio to it (None where the subject did not run)."""
    out = []
    for r in rows:
        name = r.get("best_peer")
        if name is None:
            continue
        out.append({"case": r["case"], "dtype": r["dtype"], "optimizer": r["optimizer"],
                    "best_peer": name, "best_peer_s": r[name]["best_s"],
                    "noisy": bool(r["flags"]),
                    **{a: r["ratios"].get(f"{a}/best peer") for a in SUBJECTS}})
    return out


def print_best_peer_verdict(entries: list[dict]) -> None:
    print("\nng / best peer: numbagrad against the fastest rival of each row (below 1.00x "
          "numbagrad is faster)")
    for e in entries:
        what = f"{e['case']} {e['dtype']} {e['optimizer']}"
        best = f"{PEER_NAME.get(e['best_peer'], e['best_peer'])} {fmt_us(e['best_peer_s'])} µs"
        print(f"  {what:<28} best peer {best:<28} ng {fmt_ratio(e['numbagrad']):>7}  "
              f"ng compiled {fmt_ratio(e['numbagrad compiled']):>7}"
              + ("  (noisy)" if e["noisy"] else ""))


def noise_warning(rows: list[dict], args: argparse.Namespace) -> str | None:
    """The closing warning when some rows are marked noisy (None when none
    is): which, and the ``--repeat`` (and ``--threads 1``) to rerun with."""
    noisy = [r for r in rows if r["flags"]]
    if not noisy:
        return None
    why = "; ".join(f"{r['case']} {r['dtype']} {r['optimizer']}: {r['flags'][0]}"
                    for r in noisy[:3]) + ("; ..." if len(noisy) > 3 else "")
    stalled = any("stalled" in f for r in noisy for f in r["flags"])
    return (f"WARNING: the machine was noisy, {len(noisy)} of {len(rows)} rows are marked ! "
            f"({why}): rerun with --repeat {2 * args.repeats + 1}"
            + (" --threads 1" if stalled and not args.threads else "")
            + " or on an idle machine")
