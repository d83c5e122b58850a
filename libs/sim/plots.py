"""PNG plots for simulator runs (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

from libs.sim.engine import FillResult, ReplayResult


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def fill_curve(results: dict[str, FillResult], out: Path) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 4.2))
    for ax, lo in zip(axes, (0.0, 80.0), strict=True):
        top = 0.0
        for name, r in results.items():
            pts = [(a * 100, u * 100) for a, u in r.curve if a * 100 >= lo]
            top = max([top] + [y for _, y in pts])
            ax.plot([x for x, _ in pts], [y for _, y in pts],
                    label=f"{name} ({r.metrics['unallocated_gpu_share'] * 100:.1f}% at the end)")
        ax.plot([lo, 100], [100 - lo, 0], color="grey", linestyle=":", linewidth=0.8, label="perfect packing")
        ax.set_xlim(lo, 100)
        ax.set_ylim(0, max(top, 1.0) * 1.05)
        ax.set_xlabel("arrived workload (% of GPU capacity)")
        ax.set_ylabel("unallocated GPUs (% of capacity)")
        ax.grid(alpha=0.3)
    axes[0].set_title("Fill experiment")
    axes[1].set_title("the last 20%, zoomed")
    axes[1].legend()
    path = out / "fill_unallocated.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def replay_plots(results: dict[str, ReplayResult], out: Path) -> list[Path]:
    """One figure per file: allocation rate, fragmentation, JCT CDF, JCT and queueing, preemptions, team share."""
    plt = _plt()
    figures = (("allocation_rate.png", _allocation_rate), ("fragmentation.png", _fragmentation),
               ("jct_cdf.png", _jct_cdf), ("jct_queue.png", _jct_queue), ("preemptions.png", _preemptions),
               ("team_share.png", _team_share))
    paths = []
    for name, draw in figures:
        fig = draw(plt, results)
        paths.append(out / name)
        fig.tight_layout()
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def _over_time(plt, title: str, xlabel: str, ylabel: str):  # type: ignore[no-untyped-def]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return fig, ax


def _allocation_rate(plt, results: dict[str, ReplayResult]):  # type: ignore[no-untyped-def]
    fig, ax = _over_time(plt, "GPU allocation rate", "time (days)", "GPUs allocated (%)")
    for name, r in results.items():
        ax.step([t / 86400 for t in r.series.t], [a * 100 for a in r.series.alloc], where="post", label=name,
                linewidth=0.8)
    ax.legend()
    return fig


def _fragmentation(plt, results: dict[str, ReplayResult]):  # type: ignore[no-untyped-def]
    fig, ax = _over_time(plt, "Fragmentation (expected, against the trace's request mix)",
                         "time (days; sampled at scheduling cycles)", "unallocated but unusable GPUs")
    for name, r in results.items():
        ax.step([t / 86400 for t in r.series.frag_t], r.series.frag, where="post", label=name, linewidth=0.8)
    ax.legend()
    return fig


def _jct_cdf(plt, results: dict[str, ReplayResult]):  # type: ignore[no-untyped-def]
    fig, ax = _over_time(plt, "JCT distribution", "job completion time (s)", "CDF")
    for name, r in results.items():
        xs = sorted(r.jct)
        if xs:
            ax.plot([max(x, 1.0) for x in xs], [(i + 1) / len(xs) for i in range(len(xs))], label=name)
    ax.set_xscale("log")
    ax.legend()
    return fig


def _jct_queue(plt, results: dict[str, ReplayResult]):  # type: ignore[no-untyped-def]
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 4.2))
    names = list(results)
    width = 0.8 / max(1, len(names))
    stats = ("mean", "p50", "p99")
    for ax, what, key in zip(axes, ("job completion time", "queueing delay"), ("jct", "queue"), strict=True):
        for i, name in enumerate(names):
            m = results[name].metrics
            raw = [m[f"{key}_{st}_s"] for st in stats]
            bars = ax.bar([k + i * width for k in range(len(stats))], [max(v, 0.1) for v in raw], width=width,
                          label=name)  # a log axis: 0 s is drawn as 0.1 s, labelled with the true value
            ax.bar_label(bars, labels=[_short(v) for v in raw], fontsize=7)
        ax.set_xticks([k + width * (len(names) - 1) / 2 for k in range(len(stats))], stats)
        ax.set_yscale("log")
        ax.set_ylabel("seconds (log)")
        ax.set_title(what.capitalize())
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend()
    return fig


def _preemptions(plt, results: dict[str, ReplayResult]):  # type: ignore[no-untyped-def]
    fig, ax = _over_time(plt, "Preemptions (a preempted job restarts)", "time (days)", "preemptions so far")
    for name, r in results.items():
        ts = [t / 86400 for t in r.series.preempt_t]
        start = r.series.t[0] / 86400 if r.series.t else 0.0
        end = r.series.t[-1] / 86400 if r.series.t else 0.0
        ax.step([start] + ts + [end], [0] + list(range(1, len(ts) + 1)) + [len(ts)], where="post",
                label=f"{name} ({len(ts)}: {_reasons(r.metrics)})")
    ax.legend(fontsize=8)
    return fig


def _team_share(plt, results: dict[str, ReplayResult]):  # type: ignore[no-untyped-def]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    names = list(results)
    teams = sorted({t for r in results.values() for t in r.metrics["team_gpu_share"]})
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        shares = [results[name].metrics["team_gpu_share"].get(t, 0.0) * 100 for t in teams]
        ax.bar([k + i * width for k in range(len(teams))], shares, width=width,
               label=f"{name} (Jain {results[name].metrics['jain_fairness']:.3f})")
    ax.set_xticks([k + width * (len(names) - 1) / 2 for k in range(len(teams))], teams)
    ax.set_ylabel("share of GPU-time (%)")
    ax.set_title("Per-team share")
    ax.legend()
    return fig


def _short(v: float) -> str:
    return f"{v / 3600:.3g}h" if v >= 3600 else f"{v:.3g}s"


def _reasons(metrics: dict) -> str:
    by = metrics.get("preemptions_by_reason") or {}
    return ", ".join(f"{n} {k}" for k, n in sorted(by.items())) or "none"
