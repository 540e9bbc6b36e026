"""PNG plots of a concurrency sweep: throughput and latency against concurrency.

Several sweeps (say Blitz and the naive baseline) can share one figure, one colour each.
matplotlib is imported here only, with the Agg backend, so nothing else needs it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from loadtest.stats import Summary

Series = tuple[str, Sequence[tuple[int, Summary]]]  # label, (concurrency, summary) points


def plot_sweeps(series: Sequence[Series], path: str | os.PathLike, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, (ax_tp, ax_lat) = plt.subplots(1, 2, figsize=(12, 4.5))
    ticks = sorted({c for _, points in series for c, _ in points})
    for index, (label, points) in enumerate(series):
        points = sorted(points, key=lambda p: p[0])
        x = [c for c, _ in points]
        colour = f"C{index % 10}"
        ax_tp.plot(x, [s.embeddings_per_s for _, s in points], "o-", color=colour, label=label)
        for stat, style in (("p50", "o-"), ("p95", "s--"), ("p99", "^:")):
            ax_lat.plot(x, [getattr(s.latency_ms, stat) for _, s in points], style,
                        color=colour, label=f"{label} {stat}")
    for ax in (ax_tp, ax_lat):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("concurrency (requests in flight)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    ax_tp.set_ylabel("embeddings / s")
    ax_tp.set_ylim(bottom=0)
    ax_tp.set_title("throughput")
    ax_lat.set_ylabel("latency (ms)")
    ax_lat.set_yscale("log")
    ax_lat.set_title("latency")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
