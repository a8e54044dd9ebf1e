"""Timeline plot: goodput per time bin for each simulated system."""

from __future__ import annotations

from pathlib import Path

from atoll.goodput.simulate import Result


def plot_timeline(results: list[Result], path: str | Path, title: str = "") -> Path:
    """Write a PNG of useful compute (goodput per bin) over time, one line per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for r in results:
        centres = 0.5 * (r.timeline_s[1:] + r.timeline_s[:-1]) / 86400.0
        ax.step(
            centres,
            100.0 * r.timeline_goodput,
            where="mid",
            label=f"{r.system} ({100.0 * r.goodput:.1f}%)",
        )
    ax.set_xlabel("simulated time (days)")
    ax.set_ylabel("useful compute (% of allocated chips)")
    ax.set_ylim(0, 101)
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
