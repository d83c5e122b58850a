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
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, r in results.items():
        xs = [a * 100 for a, _ in r.curve]
        ys = [u * 100 for _, u in r.curve]
        ax.plot(xs, ys, label=f"{name} ({r.metrics['unallocated_gpu_share'] * 100:.1f}% at 100%)")
    ax.plot([0, 100], [100, 0], color="grey", linestyle=":", linewidth=0.8, label="perfect packing")
    ax.set_xlabel("arrived workload (% of GPU capacity)")
    ax.set_ylabel("unallocated GPUs (% of capacity)")
    ax.set_title("Fill experiment: unallocated GPUs vs arrived workload")
    ax.grid(alpha=0.3)
    ax.legend()
    path = out / "fill_unallocated.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def replay_plots(results: dict[str, ReplayResult], out: Path) -> list[Path]:
    plt = _plt()
    paths = []

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, r in results.items():
        ax.step([t / 3600 for t in r.series.t], [a * 100 for a in r.series.alloc], where="post", label=name,
                linewidth=0.8)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("GPUs allocated (%)")
    ax.set_title("GPU allocation rate")
    ax.grid(alpha=0.3)
    ax.legend()
    paths.append(out / "allocation_rate.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, r in results.items():
        ax.plot([t / 3600 for t in r.series.frag_t], r.series.frag, label=name, linewidth=0.8)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("unallocated but unusable GPUs")
    ax.set_title("Fragmentation (expected, against the trace's request mix)")
    ax.grid(alpha=0.3)
    ax.legend()
    paths.append(out / "fragmentation.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, r in results.items():
        xs = sorted(r.jct)
        if xs:
            ax.plot([max(x, 1.0) for x in xs], [(i + 1) / len(xs) for i in range(len(xs))], label=name)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("CDF")
    ax.set_title("JCT distribution")
    ax.grid(alpha=0.3)
    ax.legend()
    paths.append(out / "jct_cdf.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

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
    paths.append(out / "team_share.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
