"""Present a preset's results: a terminal table, a loss plot (PNG)."""

from __future__ import annotations

from pathlib import Path


def summary_rows(result: dict) -> list[dict[str, object]]:
    rows = []
    for r in result["runs"]:
        sent = r["bytes_up"] + r["bytes_down"]
        rows.append(
            {
                "run": r["name"],
                "loss": f"{r['eval_loss']:.4f}",
                "goodput": f"{100 * r['goodput']:.1f}%",
                "sim s": f"{r['wall_time_s']:.0f}",
                "MB up/down": f"{r['bytes_up'] / 1e6:.1f}/{r['bytes_down'] / 1e6:.1f}",
                "DP÷up": f"{r['dp_bytes'] / max(r['bytes_up'], 1):.3g}x",
                "DP÷all": f"{r['dp_bytes'] / max(sent, 1):.3g}x",
                "merged": f"{r['participants_mean']:.2f}",
            }
        )
    return rows


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    rows = summary_rows(result)
    tokens = result["runs"][0]["tokens"]
    table = Table(
        title=f"atoll sim --preset {result['preset']} (seed {result['seed']}, "
        f"~{tokens / 1e6:.2f}M tokens per run)",
        caption="DP÷up, DP÷all: bytes a data-parallel ring all-reduce would send for the same "
        "tokens, over the bytes sent up / both ways. merged: learners per merge.",
    )
    for col in rows[0]:
        table.add_column(col, justify="left" if col == "run" else "right")
    for row in rows:
        table.add_row(*[str(v) for v in row.values()])
    Console().print(table)
    for r in result["runs"]:
        if "chaos" in r:
            c = r["chaos"]
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(c["applied"].items())) or "none"
            print(
                f"{r['name']}: scenario {c['scenario']}: {sum(c['applied'].values())} of "
                f"{c['faults']} faults applied ({kinds}), {c['skipped']} skipped; goodput "
                f"{100 * r['goodput']:.1f}%, {r['failures']} failures, {r['down_s']:.0f} s down"
            )


def plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in result["runs"]:
        xs = [c["tokens"] / 1e6 for c in r["curve"]]
        ts = [c["time_s"] for c in r["curve"]]
        ys = [c["eval_loss"] for c in r["curve"]]
        ax1.plot(xs, ys, marker="o", ms=3, label=r["name"])
        ax2.plot(ts, ys, marker="o", ms=3, label=f"{r['name']} ({100 * r['goodput']:.0f}% goodput)")
    ax1.set_xlabel("tokens trained (millions)")
    ax2.set_xlabel("simulated wall time (s)")
    for ax in (ax1, ax2):
        ax.set_ylabel("held-out loss (nats/byte)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"atoll sim --preset {result['preset']}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
