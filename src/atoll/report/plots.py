"""The report's plots, each a function of series (atoll.report.data) returning PNG bytes, or
None when this run has no data for it (the HTML then says so instead of an empty chart)."""

from __future__ import annotations

import io

from atoll.core.events import Event
from atoll.report import data


def _fig(w: float = 6.4, h: float = 3.6):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, *plt.subplots(figsize=(w, h))


def _png(plt, fig, ax) -> bytes:
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def _lines(lines: list[tuple[list, list, dict]], xlabel: str, ylabel: str) -> bytes:
    """One chart of lines, each (xs, ys, matplotlib keywords); a legend where lines are named."""
    plt, fig, ax = _fig()
    for xs, ys, kw in lines:
        ax.plot(xs, ys, **kw)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if any("label" in kw for _, _, kw in lines):
        ax.legend(fontsize=8)
    return _png(plt, fig, ax)


LOSS = "held-out loss (nats/byte)"
SINCE = "seconds since the first event"


def loss_vs_tokens(curves: list[data.Curve]) -> bytes | None:
    lines = [([t / 1e6 for t in c.tokens], c.loss, dict(marker="o", ms=4, label=c.name))
             for c in curves if c.loss]  # fmt: skip
    return _lines(lines, "tokens trained (millions)", LOSS) if lines else None


def loss_vs_time(curves: list[data.Curve]) -> bytes | None:
    lines = [(c.time_s, c.loss, dict(marker="o", ms=4, label=c.name)) for c in curves if c.time_s]
    return _lines(lines, "wall time (s; virtual in atoll sim)", LOSS) if lines else None


def goodput(events: list[Event], learners: int | None = None) -> bytes | None:
    xs, ys = data.goodput_series(events, learners)
    if not xs:
        return None
    return _lines([(xs, [100 * y for y in ys], dict(color="tab:green"))], SINCE,
                  "goodput (%)")  # fmt: skip


def participation(events: list[Event]) -> bytes | None:
    ids, grid = data.participation(events)
    if not ids or not grid[0]:
        return None
    plt, fig, ax = _fig(h=max(1.6, 0.45 * len(ids) + 1.2))
    ax.imshow(grid, aspect="auto", cmap="Greens", vmin=0, vmax=1, interpolation="nearest")
    ax.set_yticks(range(len(ids)), ids)
    ax.set_xlabel("merged round (dark: the learner's contribution was merged)")
    return _png(plt, fig, ax)


def round_bytes(events: list[Event]) -> bytes | None:
    up, down = data.round_bytes(events)
    if not up:
        return None
    n = range(len(up))
    lines = [(n, [b / 1e3 for b in up], dict(label="up: contributions merged")),
             (n, [b / 1e3 for b in down], dict(label="down: update broadcast"))]  # fmt: skip
    return _lines(lines, "merged round", "kB per round")


def staleness(events: list[Event]) -> bytes | None:
    xs, mean, top = data.staleness(events)
    if not xs:
        return None
    lines = [(xs, mean, dict(marker=".", label="mean")),
             (xs, top, dict(marker=".", alpha=0.6, label="max"))]  # fmt: skip
    return _lines(lines, SINCE, "staleness (versions behind)")


def timeline(events: list[Event]) -> bytes | None:
    marks = data.timeline(events)
    if not marks["down"] and not marks["up"]:
        return None
    names = sorted({w for v in marks.values() for w, _ in v})
    row = {n: i for i, n in enumerate(names)}
    plt, fig, ax = _fig(h=max(1.6, 0.45 * len(names) + 1.2))
    for key, style, label in (
        ("up", dict(marker="^", color="tab:green"), "joined / rejoined / restarted / restored"),
        ("down", dict(marker="x", color="tab:red"), "fault injected / failed / crashed / lost"),
    ):
        if marks[key]:
            ax.scatter([t for _, t in marks[key]], [row[w] for w, _ in marks[key]], s=50,
                       label=label, **style)  # fmt: skip
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(-0.7, len(names) - 0.3)
    ax.set_xlabel(SINCE)
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=2, frameon=False)
    return _png(plt, fig, ax)
