"""The benchmark's plot (``--plot PATH``): per case, each peer's best time
as a bar, its median and interquartile range as whiskers, and the GEMM
floor dashed. Needs matplotlib, imported only when a plot is asked for.
"""
from __future__ import annotations

import math

from bench_cases import CASES, K, short_size
from bench_machine import blas_summary


def plot(result: dict, path: str) -> bool:
    """Write the figure of a run's ``result`` to ``path``; False without matplotlib."""
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
    labeled: set[str] = set()      # each peer named once, where it first has a bar
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
            label = name if xs and name not in labeled else None
            if label:
                labeled.add(name)
            ax.bar(xs, best, width, color=color, label=label)
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


def plot_scaling(result: dict, path: str) -> bool:
    """Write ``--scaling``'s figure to ``path``: per sweep, each peer's best time
    against the size on log-log axes (its fitted slope in the legend) above its
    process's peak resident memory; False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not importable: no plot written")
        return False
    sweeps, peers = result["sweeps"], result["peers"]
    fig, axes = plt.subplots(2, len(sweeps), figsize=(4.6 * len(sweeps), 7.4), squeeze=False)
    for col, (sweep, data) in enumerate(sweeps.items()):
        top, bottom = axes[0, col], axes[1, col]
        for name in peers:
            got = [(p["size"], p[name]) for p in data["points"] if p.get(name)]
            if not got:
                continue
            sizes = [s for s, _ in got]
            fit = data["slopes"][name]["fit"]
            label = name + ("" if fit is None else f" (slope {fit:.2f})")
            top.plot(sizes, [s["best_s"] * 1e6 for _, s in got], "o-", label=label)
            mem = [(n, s["peak_rss_bytes"]) for n, s in got if s.get("peak_rss_bytes")]
            if mem:
                bottom.plot([n for n, _ in mem], [b / 2 ** 20 for _, b in mem], "o-", label=name)
        for ax in (top, bottom):
            ax.set_xscale("log")
            ax.set_xlabel(data["axis"])
        top.set_yscale("log")
        top.set_title(sweep, fontsize=10)
        top.set_ylabel("µs per micro-step (best)")
        bottom.set_ylabel("peak resident MB of the process")
        top.legend(fontsize=7)
    m = result["machine"]
    fig.suptitle(f"numbagrad scaling (accumulate_steps={K}) on {m['cpu']}, "
                 f"{m['usable_cores']} cores; slope: log-log least-squares fit", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot written to {path}")
    return True
