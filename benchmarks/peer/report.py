"""The peer benchmark's figures from its results.json: per scenario and system, medians over
the repeats of time to the target eval loss, eval loss at equal tokens (the end of the budget)
and at equal wall time, bytes on the learners' interfaces per trained token, atoll's own byte
accounting against the interfaces, goodput; the ratios the issue asks for; two plots.

    python benchmarks/peer/report.py benchmarks/results/peer [--target=2.607]

The target is fixed from the data before looking at atoll: 1.02 x the median final eval loss
of torchft without faults (scenario a), i.e. a loss torchft reaches near the end of its run.
"""

from __future__ import annotations

import json
import statistics as st
import sys
from pathlib import Path

SCEN = {
    "a": "no faults",
    "b": "one learner 2x slower",
    "c": "a learner SIGKILLed every 30 s, back 5 s later",
    "d": "every link shaped",
    "e": "shaped + straggler + kills",
}


def interp_time(curve: list[dict], target: float) -> float | None:
    """First wall time at which the eval curve reaches `target` (linear between evaluations)."""
    prev = None
    for c in curve:
        if c["eval_loss"] <= target:
            if prev is None:
                return c["t"]
            f = (prev["eval_loss"] - target) / max(prev["eval_loss"] - c["eval_loss"], 1e-12)
            return prev["t"] + f * (c["t"] - prev["t"])
        prev = c
    return None


def loss_at(curve: list[dict], t: float) -> float:
    """The eval loss of the newest global model saved by time t."""
    best = curve[0]["eval_loss"] if curve else float("nan")
    for c in curve:
        if c["t"] <= t:
            best = c["eval_loss"]
    return best


def med(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return st.median(xs) if xs else None


def dp_bytes_per_token(work: dict, n_params: int) -> float:
    """A data-parallel ring all-reduce of fp32 gradients every step: each learner sends and
    receives 2(M-1)/M * 4N bytes per step; over all links, tx + rx per trained token."""
    M, tps = work["learners"], work["batch"] * work["context"]
    return 2 * M * (2 * (M - 1) / M * 4 * n_params) / (M * tps)


def summarize(res: dict, n_params: int, target: float | None = None) -> dict:
    """`target`: the eval loss to reach; by default 1.02 x torchft's median final in (a)."""
    runs = res["runs"]
    ratio = lambda x, y: (x / y) if x and y else None  # noqa: E731
    by = {}
    for r in runs:
        by.setdefault((r["scenario"], r["system"]), []).append(r)
    tf_a = [r["final_eval"] for r in by.get(("a", "torchft"), [])]
    if target is None:
        target = round(1.02 * st.median(tf_a), 3) if tf_a else None
    dp = dp_bytes_per_token(res["work"], n_params)
    out = {"target_eval_loss": target, "dp_bytes_per_token": dp, "scenarios": {}}
    variants = sorted({r["system"] for r in runs} - {"atoll", "torchft"})  # atoll:key=value
    for sc in SCEN:
        row = {}
        pairs = {}
        for sysname in ("atoll", "torchft", *variants):
            rs = by.get((sc, sysname), [])
            if not rs:
                continue
            for r in rs:
                pairs.setdefault(r["repeat"], {})[sysname] = r
            lt = [r.get("link_total") for r in rs]
            pairs_lt = zip(lt, rs, strict=True)
            bpt = [(x["tx"] + x["rx"]) / r["tokens_trained"] for x, r in pairs_lt if x]
            row[sysname] = {
                "repeats": len(rs),
                "wall_s": med([r["wall_s"] for r in rs]),
                "time_to_target_s": med([interp_time(r["curve"], target) for r in rs]),
                "reached": sum(interp_time(r["curve"], target) is not None for r in rs),
                "final_eval": med([r["final_eval"] for r in rs]),
                "link_bytes_per_token": med(bpt),
                "link_up_MB": med([x["tx"] / 1e6 for x in lt if x]),
                "link_down_MB": med([x["rx"] / 1e6 for x in lt if x]),
                "goodput": med([r["goodput"] for r in rs]),
            }
            if sysname.startswith("atoll"):
                own = [(r["own"].get("up"), r["own"].get("down"), r.get("link_total")) for r in rs]
                row[sysname]["own_up_over_link"] = med([u / x["tx"] for u, d, x in own if u and x])
                row[sysname]["own_down_over_link"] = med(
                    [d / x["rx"] for u, d, x in own if d and x]
                )
                wire = [(r["own"].get("wire_up"), r["own"].get("wire_down"), r.get("link_total"))
                        for r in rs]  # fmt: skip
                row[sysname]["wire_up_over_link"] = med(
                    [u / x["tx"] for u, d, x in wire if u and x]
                )
                row[sysname]["wire_down_over_link"] = med(
                    [d / x["rx"] for u, d, x in wire if d and x]
                )
        # eval loss at equal wall time: each repeat's pair at the earlier of the two ends
        eq = {"atoll": [], "torchft": []}
        for pr in pairs.values():
            if "atoll" in pr and "torchft" in pr:
                t = min(pr["atoll"]["wall_s"], pr["torchft"]["wall_s"])
                for k in eq:
                    eq[k].append(loss_at(pr[k]["curve"], t))
        for k in eq:
            if k in row:
                row[k]["eval_at_equal_wall"] = med(eq[k])
        if "atoll" in row and "torchft" in row:
            a, t = row["atoll"], row["torchft"]
            row["speedup_to_target"] = ratio(t["time_to_target_s"], a["time_to_target_s"])
            if t["reached"] == 0 and a["time_to_target_s"]:  # torchft never got there: at
                walls = [r["wall_s"] for r in by[(sc, "torchft")]]  # least its whole run
                row["speedup_at_least"] = min(walls) / a["time_to_target_s"]
            row["final_eval_gap"] = (a["final_eval"] - t["final_eval"]) / t["final_eval"]
            row["fewer_bytes_than_torchft"] = ratio(t["link_bytes_per_token"],
                                                    a["link_bytes_per_token"])  # fmt: skip
            row["fewer_bytes_than_dp"] = ratio(out["dp_bytes_per_token"], a["link_bytes_per_token"])
        for v in variants:  # a variant against atoll at its defaults, and against torchft
            if v in row and "atoll" in row:
                x, a = row[v], row["atoll"]
                x["time_to_target_over_atoll"] = ratio(x["time_to_target_s"], a["time_to_target_s"])
                x["final_eval_gap_to_atoll"] = (x["final_eval"] - a["final_eval"]) / a["final_eval"]
                if "torchft" in row:
                    x["speedup_to_target"] = ratio(row["torchft"]["time_to_target_s"],
                                                   x["time_to_target_s"])  # fmt: skip
        out["scenarios"][sc] = row
    return out


def plots(res: dict, folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scs = [s for s in SCEN if any(r["scenario"] == s for r in res["runs"])]
    colors = {"atoll": "tab:blue", "torchft": "tab:orange"}
    for i, s in enumerate(sorted({r["system"] for r in res["runs"]} - set(colors))):
        colors[s] = ("tab:green", "tab:purple", "tab:gray")[i % 3]
    for kind in ("wall", "bytes"):
        fig, axes = plt.subplots(1, len(scs), figsize=(4 * len(scs), 3.4), squeeze=False)
        for ax, sc in zip(axes[0], scs, strict=True):
            for r in res["runs"]:
                if r["scenario"] != sc or not r["curve"]:
                    continue
                ys = [c["eval_loss"] for c in r["curve"]]
                if kind == "wall":
                    xs = [c["t"] for c in r["curve"]]
                else:
                    tl = r.get("link_timeline") or []
                    if not tl:
                        continue
                    xs = [_bytes_at(tl, c["t"]) / 1e6 for c in r["curve"]]
                ax.plot(xs, ys, color=colors[r["system"]], alpha=0.7,
                        label=r["system"] if r["repeat"] == 0 else None)  # fmt: skip
            ax.set_title(f"({sc}) {SCEN[sc]}", fontsize=8)
            ax.set_xlabel("wall time (s)" if kind == "wall" else "MB on the links (tx + rx)")
            ax.set_ylim(top=3.2)
            if kind == "bytes":
                ax.set_xscale("log")
            ax.legend(fontsize=7)
        axes[0][0].set_ylabel("eval loss (nats/byte)")
        fig.tight_layout()
        fig.savefig(folder / f"loss_vs_{kind}.png", dpi=110)
        plt.close(fig)


def markdown(summary: dict) -> str:
    """The figures as a Markdown table (BENCHMARKS.md)."""
    f = lambda x, fmt: "-" if x is None else format(x, fmt)  # noqa: E731
    rows = ["| scenario | time to target, atoll / torchft | speedup | final eval, atoll / "
            "torchft | eval at equal wall | link bytes per token | fewer than torchft / "
            "than DP | goodput | repeats |", "|---" * 9 + "|"]  # fmt: skip
    for sc, row in summary["scenarios"].items():
        a, t = row.get("atoll"), row.get("torchft")
        if not a or not t:
            continue
        speedup = f"{f(row['speedup_to_target'], '.2f')}x"
        if "speedup_at_least" in row:
            speedup = f"> {row['speedup_at_least']:.1f}x (torchft never reached it)"
        rows.append(
            f"| ({sc}) {SCEN[sc]} | {f(a['time_to_target_s'], '.1f')} / "
            f"{f(t['time_to_target_s'], '.1f')} s | **{speedup}** | "
            f"{a['final_eval']:.3f} / {t['final_eval']:.3f} "
            f"({100 * row['final_eval_gap']:+.1f}%) | "
            f"{f(a.get('eval_at_equal_wall'), '.3f')} / {f(t.get('eval_at_equal_wall'), '.3f')} | "
            f"{a['link_bytes_per_token']:.1f} / {t['link_bytes_per_token']:.0f} | "
            f"{row['fewer_bytes_than_torchft']:.1f}x / {row['fewer_bytes_than_dp']:.0f}x | "
            f"{100 * a['goodput']:.0f}% / {100 * t['goodput']:.0f}% | "
            f"{a['repeats']} + {t['repeats']} |"
        )
    variants = sorted({k for row in summary["scenarios"].values() for k in row
                       if k.startswith("atoll:")})  # fmt: skip
    for v in variants:
        rows += ["", f"atoll at its defaults against `{v}`, side by side in the same repeats:", "",
                 "| scenario | time to target, atoll / variant | final eval, atoll / variant | "
                 "variant's speedup over torchft | repeats |", "|---" * 5 + "|"]  # fmt: skip
        for sc, row in summary["scenarios"].items():
            a, x = row.get("atoll"), row.get(v)
            if not a or not x:
                continue
            rows.append(
                f"| ({sc}) {SCEN[sc]} | {f(a['time_to_target_s'], '.1f')} / "
                f"{f(x['time_to_target_s'], '.1f')} s | {a['final_eval']:.3f} / "
                f"{x['final_eval']:.3f} | {f(x.get('speedup_to_target'), '.2f')}x | "
                f"{a['repeats']} + {x['repeats']} |"
            )
    return "\n".join(rows)


def _bytes_at(tl: list[dict], t: float) -> float:
    last = 0.0
    for x in tl:
        if x["t"] > t:
            break
        last = x["tx"] + x["rx"]
    return last


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", type=Path, default=Path("benchmarks/results/peer"))
    ap.add_argument("--target", type=float, help="the eval loss to reach (default: from torchft)")
    a = ap.parse_args()
    folder, fixed = a.folder, [a.target] if a.target is not None else []
    res = json.loads((folder / "results.json").read_text())
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import workload as wl

    w = wl.Work(**res["work"])
    n = sum(p.numel() for p in wl.build_model(w).parameters())
    summary = summarize(res, n, fixed[0] if fixed else None)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1))
    (folder / "summary.md").write_text(markdown(summary) + "\n")
    plots(res, folder)
    print(f"target eval loss {summary['target_eval_loss']}; data-parallel "
          f"{summary['dp_bytes_per_token']:.0f} B/token")  # fmt: skip
    for sc, row in summary["scenarios"].items():
        print(f"({sc}) {SCEN[sc]}")
        for k, v in row.items():
            if isinstance(v, dict):
                print(f"   {k:8s} " + "  ".join(
                    f"{kk}={vv:.4g}" if isinstance(vv, float) else f"{kk}={vv}"
                    for kk, vv in v.items()))  # fmt: skip
            else:
                print(f"   {k} = {v if v is None else round(v, 3)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
