"""The analysis and the figure of benchmarks/load.py: rounds, latency, errors, memory.

Definitions are in load.py's docstring; `analyze` turns the syncer's events, the clients'
counters and the /proc samples into the results JSON, `plot` draws load.png from it.
"""

from __future__ import annotations

import bisect
from collections import Counter
from pathlib import Path

import numpy as np

CHUNK = 256 * 1024  # the syncer's chunk_bytes (default)
BAD_KINDS = ("slow", "vanish", "storm")
PREFIX = {"good": "G", "slow": "S", "vanish": "V", "storm": "R"}


def kind_of(learner: str) -> str:
    return next((k for k, p in PREFIX.items() if learner.startswith(p)), "other")


def pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 1) if len(xs) else None


def history_growth(events: list[dict], numels: list[int], keep: int = 64) -> list[tuple]:
    """(t, MB) of public versions held beyond version 0, after each round_closed."""
    out, held, total = [], [1] * len(numels), 0
    for e in events:
        if e["kind"] == "round_closed":
            p, n = e["data"]["fragment"], min(e["data"]["version"] + 1, keep)
            total += (n - held[p]) * 4 * numels[p]
            held[p] = n
            out.append((e["t"], total / 2**20))
    return out


def round_stats(events, pulls, samples, a: float, b: float, n_good: int, numels, frags=None):
    """Rounds, latency and the good clients' own timings (`samples`; None: left out) between
    times a and b, of the fragments `frags` (None: all); values/s: the fragments' values
    (`numels`) that closed rounds published per second (merged: times their participants)."""
    closed = [e for e in events if e["kind"] == "round_closed" and a <= e["t"] < b]
    if frags is not None:
        closed = [e for e in closed if e["data"]["fragment"] in frags]
        pulls = {p: ats for p, ats in pulls.items() if p in frags}
    lat = []
    for e in closed:
        ats = pulls.get(e["data"]["fragment"], [])
        i = bisect.bisect_right(ats, e["t"])
        if i and ats[i - 1] >= a - 10:
            lat.append((e["t"] - ats[i - 1]) * 1e3)
    first = [(e["data"]["quorum_wait_s"] + e["data"]["grace_s"]) * 1e3 for e in closed]
    parts = [e["data"]["participants"] for e in closed]
    goods = [sum(kind_of(x) == "good" for x in p) for p in parts]
    ticks = sum(a <= at < b for ats in pulls.values() for at in ats)
    out = {
        "seconds": round(b - a, 1),
        "rounds": len(closed),
        "rounds_per_s": round(len(closed) / (b - a), 3),
        "values_per_s": round(sum(numels[e["data"]["fragment"]] for e in closed) / (b - a)),
        "merged_values_per_s": round(  # contributions' values merged: the merge work
            sum(numels[e["data"]["fragment"]] * len(e["data"]["participants"]) for e in closed)
            / (b - a)
        ),
        "pull_ticks": ticks,
        "participants_mean": round(float(np.mean([len(p) for p in parts])), 2) if parts else None,
        "good_participants_mean": round(float(np.mean(goods)), 2) if goods else None,
        "rounds_with_every_good": sum(g == n_good for g in goods),
        "latency_ms": {"p50": pct(lat, 50), "p99": pct(lat, 99), "max": pct(lat, 100)},
        "first_send_to_close_ms": {"p50": pct(first, 50), "p99": pct(first, 99)},
    }
    names = {"push_ms": "push_rpc", "answer_ms": "pull_to_reply", "beat_ms": "heartbeat_rpc"}
    for k, xs in (samples or {}).items():
        x = [v for t, v in xs if a <= t < b]
        out[f"good_{names[k]}_ms"] = {"p50": pct(x, 50), "p99": pct(x, 99)}
    return out


def shard_report(events, pulls, phases, per_rows, numels, shard_of, errors, n_good, t0, t_end):
    """Per shard: its fragments' rounds, latency and learners per round in each phase, the
    good clients' errors on it, and its process's RSS and CPU."""
    out = []
    for i, rows in enumerate(per_rows):
        frags = {p for p, s in enumerate(shard_of) if s == i}
        t, rss, cpu = (np.array([r[k] for r in rows]) for k in range(3))
        win = (t >= phases["all"][0]) & (t <= t_end)
        ph = {
            k: round_stats(events, pulls, None, *ab, n_good, numels, frags)
            for k, ab in phases.items()
        }
        used = float(cpu[win][-1] - cpu[win][0])
        out.append(
            {
                "shard": i,
                "fragments": len(frags),
                "phases": ph,
                "good_errors": errors[i],
                "peak_rss_mb": round(float(rss[(t >= t0) & (t <= t_end)].max()), 1),
                "cpu_s": round(used, 2),
                "cpu_pct_mean": round(100 * used / (t_end - phases["all"][0]), 1),
            }
        )
    return out


def analyze(args, events, results, rows, numels, shard_of, times, kills):
    """`rows`: the shards' summed samples and each shard's; `times`: start, bad start, end."""
    (t0, t_bad, t_end), (rows, per_rows) = times, rows
    w0 = t0 + args.warmup_s
    pulls: dict[int, list[float]] = {}
    samples: dict[str, list] = {"push_ms": [], "beat_ms": [], "answer_ms": []}
    counts, errs = Counter(), {k: Counter() for k in ("good", *BAD_KINDS)}
    by_shard: Counter[str] = Counter()  # "kind.shard" -> the clients' errors
    ticks = {k: v for r in results for k, v in r["pulls"].items()}  # every client hears all
    for frag, at in ticks.values():
        pulls.setdefault(frag, []).append(at)
    for r in results:
        counts.update(r["counts"])
        for k, n in r["errors"].items():
            errs[k.split(".")[0]][k.split(".", 1)[1]] += n
        for k, n in r.get("shard_errors", {}).items():
            by_shard[k] += n
        for k, v in r["samples"].items():
            samples[k] += v
    for v in pulls.values():
        v.sort()
    side = {k: Counter() for k in ("good", *BAD_KINDS, "other")}  # the syncer's events
    for e in (e for e in events if e["t"] <= t_end + 0.5):  # calls are cancelled at t_end + 1
        if e["kind"] in ("refused", "transfer_broken", "joined", "lost", "auth_refused"):
            code = e["data"].get("code")
            what = e["kind"] + (f"_{code}" if code else "")
            side[kind_of(e["data"].get("learner", ""))][what] += 1
            frag = e["data"].get("fragment")
            if kind_of(e["data"].get("learner", "")) == "good" and e["kind"] != "joined":
                if e["kind"] != "lost" and isinstance(frag, int) and 0 <= frag < len(shard_of):
                    by_shard[f"syncer.{shard_of[frag]}"] += 1
    good_side = sum(n for k, n in side["good"].items() if k.startswith(("refused", "transfer")))
    phases = {"all": (w0, t_end), "good_only": (w0, t_bad), "with_bad": (t_bad, t_end)}
    if not args.bad or t_bad <= w0:
        phases = {"all": (w0, t_end)}
    stats = {
        k: round_stats(events, pulls, samples, *ab, args.clients, numels)
        for k, ab in phases.items()
    }
    shard_errors = [by_shard[f"good.{i}"] + by_shard[f"syncer.{i}"] for i in range(args.shards)]
    shards = shard_report(
        events, pulls, phases, per_rows, numels, shard_of, shard_errors, args.clients, t0, t_end
    )
    t, rss, cpu, thr = (np.array([r[i] for r in rows]) for i in range(4))
    hist = np.array([(0.0, 0.0)] + history_growth(events, numels))
    net = rss - hist[np.searchsorted(hist[:, 0], t, side="right") - 1, 1]
    ends = np.searchsorted(t, t + 1.0)
    cpu_1s = [100 * (cpu[j] - cpu[i]) / (t[j] - t[i]) for i, j in enumerate(ends) if j < len(t)]
    win = (t >= w0) & (t <= t_end)
    model = 4 * sum(numels)
    per_bad = 2 * model + 2 * CHUNK + 4 * max(numels) + 4096
    snaps = sorted(e["t"] for e in events if e["kind"] == "snapshot")

    def snapshotting(x: float) -> bool:  # from 3 s before a snapshot's event to 0.5 s after
        i = bisect.bisect_left(snaps, x)
        return (i < len(snaps) and snaps[i] - x < 3.0) or (i > 0 and x - snaps[i - 1] < 0.5)

    steady = np.array([not snapshotting(x) for x in t])
    before = net[steady & (t >= t0) & (t < t_bad)]
    after = net[steady & (t >= t_bad) & (t <= t_end)]
    half = steady & (t >= (max(t_bad if args.bad else w0, w0) + t_end) / 2) & (t <= t_end)
    slope = float(np.polyfit(t[half] - t[half][0], net[half], 1)[0]) * 60 if half.sum() > 2 else 0
    run = (t >= t0) & (t <= t_end)
    q = np.minimum(((t - t0) / (t_end - t0) * 4).astype(int), 3)
    quarters = [net[steady & run & (q == i)] for i in range(4)]
    quarters = [round(float(x.max()), 1) if x.size else None for x in quarters]
    return {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "model": {"params": sum(numels), "fragments": len(numels), "fp32_mb": model / 2**20},
        "phases": stats,
        "shards": shards,
        "syncer": {
            "peak_rss_mb": round(float(rss[(t >= t0) & (t <= t_end)].max()), 1),
            "peak_rss_mb_at_stop": round(float(rss[t > t_end].max()), 1),
            "idle_rss_mb": round(float(rss[t < t0].max()), 1),
            "cpu_s": round(float(cpu[win][-1] - cpu[win][0]), 2),
            "cpu_pct_mean": round(float(100 * (cpu[win][-1] - cpu[win][0]) / (t_end - w0)), 1),
            "cpu_pct_peak_1s": round(float(max(cpu_1s)), 1),
            "peak_threads": int(thr.max()),
        },
        "memory": {
            "syncer_env": args.syncer_env or "glibc malloc defaults",
            "history_growth_mb": round(float(hist[-1, 1]), 1),
            "snapshot_spike_mb": round(float(net[run].max() - net[run & steady].max()), 1),
            "steady_net_peak_good_only_mb": round(float(before.max()), 1) if before.size else None,
            "steady_net_peak_with_bad_mb": round(float(after.max()), 1) if after.size else None,
            "added_with_bad_mb": round(float(after.max() - before.max()), 1)
            if before.size and after.size
            else None,
            "design_cap_per_bad_session_mb": round(per_bad / 2**20, 2),
            "design_cap_bad_total_mb": round(args.bad * per_bad / 2**20, 1),
            "steady_net_quarter_peaks_mb": quarters,
            "steady_net_slope_mb_per_min_last_half": round(slope, 2),
        },
        "good": {
            "clients": args.clients,
            "errors": sum(errs["good"].values()) + good_side,
            "client_errors": dict(errs["good"]),
            "syncer_events": dict(side["good"]),
            "accepted": counts.get("good.accepted", 0),
        },
        "bad": {
            "clients": {
                k: sum(args.kinds[i % len(args.kinds)] == k for i in range(args.bad))
                for k in BAD_KINDS
            },
            "client_errors": {k: dict(errs[k]) for k in BAD_KINDS},
            "syncer_events": {k: dict(side[k]) for k in BAD_KINDS},
            "counts": {k: v for k, v in counts.items() if not k.startswith("good.")},
            "vanisher_process_kills": kills,
        },
        "auth_refused": sum(c.get("auth_refused", 0) for c in side.values()),
        "timeline": {
            "t": [round(float(x - t0), 2) for x in t],
            "rss_mb": [round(float(x), 1) for x in rss],
            "net_rss_mb": [round(float(x), 1) for x in net],
            "cpu_pct": [0.0] + [round(float(x), 1) for x in 100 * np.diff(cpu) / np.diff(t)],
            "threads": [int(x) for x in thr],
        },
    }


def plot(rep: dict, events: list[dict], t0: float, t_bad: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl, mem, cfg = rep["timeline"], rep["memory"], rep["config"]
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    shards = f" ({cfg['shards']} shards, summed)" if cfg.get("shards", 1) > 1 else ""
    a.plot(tl["t"], tl["rss_mb"], label="syncer RSS (all shards)")
    a.plot(tl["t"], tl["net_rss_mb"], label="net RSS (minus version-history growth)")
    if mem["steady_net_peak_good_only_mb"] and cfg["bad"]:
        cap = mem["steady_net_peak_good_only_mb"] + mem["design_cap_bad_total_mb"]
        a.axhline(cap, ls="--", c="r", lw=0.8, label="good-only net peak + design cap of bad")
    for ax in (a, b):
        ax.axvline(0, c="k", lw=0.8)
        if cfg["bad"]:
            ax.axvline(t_bad - t0, c="m", lw=0.8, ls=":", label="misbehaving clients start")
    a.set_ylabel("MB")
    a.set_xlim(left=max(min(tl["t"]), -5.0))  # the wait for the workers' imports is idle
    a.legend(fontsize=8, loc="lower right")
    a.set_title(
        f"atoll syncer{shards}: {cfg['clients']} good + {cfg['bad']} misbehaving clients, "
        f"{rep['model']['params'] / 1e6:.2f}M params, step {cfg['step_s']} s",
        fontsize=10,
    )
    b.plot(tl["t"], np.convolve(tl["cpu_pct"], np.ones(5) / 5, "same"), label="syncer CPU % (1 s)")
    edges = np.arange(min(tl["t"]), max(tl["t"]) + 2, 2.0)
    closes = [e["t"] - t0 for e in events if e["kind"] == "round_closed"]
    b2 = b.twinx()
    b2.step(edges[:-1], np.histogram(closes, edges)[0] / 2.0, where="post", c="g", label="rounds/s")
    b.set(ylabel="CPU %", xlabel="seconds since the clients started")
    b2.set_ylabel("rounds/s (2 s bins)")
    b.legend(loc="upper left", fontsize=8)
    b2.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
