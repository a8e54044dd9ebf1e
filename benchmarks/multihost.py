"""Several hosts: the syncer and each learner island in a network namespace of its own, joined
to the host by a tc-tbf shaped link (hosts.py, peer/netns.py), started with the deploy/ scripts,
TLS and the shared secret, the built-in model. Measures the bytes per second on every link
(interface counters, the middle half of the training window) and compares them with `atoll
bandwidth`'s prediction for the same N, P, H, tau and step time, per link and direction:

- the headline, `--codec int4 + overhead`: the int4 codec's bits (`--codec int4`: its frames
  of Gaussian values, zstd included) with the wire's framing and fixed costs per exchange and
  per second (`--framing --message-bytes --control-bps`) measured by wire_overhead.py in runs
  of its own (results/multihost/wire_overhead.json; nothing here is fitted on this run);
- for context, payload x TCP/IP framing alone (atoll.bandwidth.model.WIRE_FRAMING) with three
  bits per value: the codec's, the nominal 4.25 (4 bits and a bf16 scale per 64 values) and
  the bits the run's own contributions had (what peer/bandwidth_check.py does).

The syncer's link carries every island's: M times one island's prediction (its up, what the
islands receive, with the down constants).

    sudo .venv/bin/python benchmarks/multihost.py            # about 2 minutes; root
    .venv/bin/python benchmarks/multihost.py --recompare     # no run: the headline column
                                                             # again for a stored results.json

Writes results.json and multihost.png to --out (benchmarks/results/multihost/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import hosts

OVERHEAD = Path(__file__).resolve().parent / "results/multihost/wire_overhead.json"
HEADLINE = "--codec int4 + overhead"  # the comparison's row kind with the calibrated overhead


def interpolate(points: list[tuple[float, float]], t: float) -> float:
    """The value at time t of a counter sampled at (time, value) points (linear)."""
    for (t0, v0), (t1, v1) in zip(points, points[1:], strict=False):
        if t0 <= t <= t1:
            return v0 + (v1 - v0) * (t - t0) / max(t1 - t0, 1e-9)
    raise ValueError(f"t={t} is outside the samples [{points[0][0]}, {points[-1][0]}]")


def rate(points: list[tuple[float, float]], a: float, b: float) -> float:
    return (interpolate(points, b) - interpolate(points, a)) / (b - a)


def predicted_Bps(params: int, step_s: float, learners: int, cfg, bits: str) -> float:  # noqa: N802
    """Bytes/s per link per direction, from the `atoll bandwidth` command itself; `bits` is
    "--codec int4" (the codec's frames) or "--bits B", and may add options (given last, they
    override the default --framing WIRE_FRAMING)."""
    from atoll.bandwidth.model import WIRE_FRAMING

    out = subprocess.run(
        [sys.executable, "-m", "atoll.cli", "bandwidth", "--params", str(params),
         "--step-s", str(step_s), "--datacenters", str(learners),
         "--fragments", str(cfg.P), "--H", str(cfg.H), "--tau", str(cfg.tau),
         "--framing", str(WIRE_FRAMING), *bits.split(), "--json", "/dev/stdout"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    doc = json.loads(out[out.index("{") :])
    return doc["methods"]["decoupled"]["average_gbps"] * 1e9 / 8


def run(args: argparse.Namespace, root: Path, extra: dict | None = None,
        prefix: str = "amh", subnet: str = "10.81") -> dict:  # fmt: skip
    """One run: the syncer and args.learners islands; the raw samples and events. `extra`:
    more settings for the job file (model size, codecs, heartbeat_s)."""
    settings = {"learners": args.learners, "steps": args.steps, "pace_s": args.pace}
    settings.update(extra or {})
    with hosts.Hosts(root, args.learners, args.mbps, settings, args.syncer_mbps, prefix,
                     subnet) as h:  # fmt: skip
        h.start_syncer()
        h.wait_ready(180)
        h.sample_links(1.0)
        for i in range(args.learners):
            h.start_learner(i, args.nproc)
        codes = h.wait_learners(args.max_wall)
        time.sleep(1.5)  # one more sample after the last byte
        code = h.stop_syncer()
        samples = list(h.samples)
        rates = {"syncer": h.net.islands[0].mbps, "island": args.mbps}
    if any(codes.values()) or code:
        raise RuntimeError(f"exit codes: learners {codes}, syncer {code}; logs in {root}")
    return {"samples": samples, "rates_mbps": rates}


def measure(root: Path, M: int, samples: list[dict]) -> dict:  # noqa: N803
    """Link bytes/s, steps, pulls and the syncer's books over the middle half of the training
    window of a run in `root` with M islands (what analyse and wire_overhead.py use)."""
    from atoll.config import load_job
    from atoll.eventlog import read_events
    from atoll.model.recipe import builtin_plan

    cfg = load_job([], root / "job.toml").sim
    plan, init = builtin_plan(cfg)
    params = sum(v.numel() for v in init)
    evs = {i: read_events(root / f"L{i}.events.jsonl") for i in range(M)}
    steps = {i: [(e["t"], e["data"]["step"]) for e in evs[i] if e["kind"] == "step"]
             for i in range(M)}  # fmt: skip
    pulls = {i: [(e["t"], e["data"]["pulls"]) for e in evs[i] if e["kind"] == "step"]
             for i in range(M)}  # fmt: skip
    start = max(e["t"] for i in range(M) for e in evs[i] if e["kind"] == "training")
    end = min(s[-1][0] for s in steps.values())
    a, b = start + 0.25 * (end - start), start + 0.75 * (end - start)
    names = ["syncer", *[f"L{i}" for i in range(M)]]
    links = {}
    for k, name in enumerate(names):
        tx = [(s["t"], s["hosts"][k]["tx_bytes"]) for s in samples]
        rx = [(s["t"], s["hosts"][k]["rx_bytes"]) for s in samples]
        links[name] = {"up_Bps": rate(tx, a, b), "down_Bps": rate(rx, a, b)}
        # frames and TCP segments per second (runs since these were sampled)
        for key, out in (("tx_packets", "up_frames_per_s"), ("rx_packets", "down_frames_per_s"),
                         ("tcp_out_segs", "tcp_out_segs_per_s"),
                         ("tcp_retrans_segs", "tcp_retrans_segs_per_s")):  # fmt: skip
            if key in samples[0]["hosts"][k]:
                links[name][out] = rate([(s["t"], s["hosts"][k][key]) for s in samples], a, b)
    step_s = {i: 1.0 / rate(steps[i], a, b) for i in range(M)}
    pull_s = {i: 1.0 / rate(pulls[i], a, b) for i in range(M)}
    mean_step = statistics.fmean(step_s.values())
    syncer_events = [e for e in read_events(root / "syncer" / "events.jsonl")
                     if e["kind"] == "round_closed"]  # fmt: skip
    closed, closed_t = [e["data"] for e in syncer_events], [e["t"] for e in syncer_events]
    # the contributions' own bits per value (int4 frames of real deltas, zstd included)
    values = sum(len(c["participants"]) * plan.fragments[c["fragment"]].numel for c in closed)
    payload_bits = 8 * sum(c["bytes_in"] for c in closed) / values
    # what the syncer's books say each island sent and was sent, in the middle half: the
    # fragments' payloads alone (round_closed: bytes in, and bytes out to every live learner)
    mid = [(c["bytes_in"], c["bytes_out"], len(c["participants"]))
           for c, t in zip(closed, closed_t, strict=True) if a <= t <= b]  # fmt: skip
    payload = {"up_Bps": sum(x[0] for x in mid) / M / (b - a),
               "down_Bps": sum(x[1] for x in mid) / M / (b - a)}  # fmt: skip
    isl = [links[f"L{i}"] for i in range(M)]
    over = {k: statistics.fmean(x[k] for x in isl) / payload[k] for k in payload}
    return {"cfg": cfg, "params": params, "start": start, "end": end, "a": a, "b": b,
            "names": names, "links": links, "step_s": step_s, "pull_s": pull_s,
            "mean_step": mean_step, "closed": closed, "payload_bits": payload_bits,
            "payload": payload, "over": over,
            "rounds_in_window": len(mid),
            "participants_in_window": statistics.fmean(x[2] for x in mid)}  # fmt: skip


def overhead_rows(res: dict, overhead: dict) -> list[dict]:
    """The comparison's fourth column: `--codec int4` plus the wire overhead calibrated by
    wire_overhead.py (`overhead`: its "use" entry: per learner direction framing,
    message_bytes and control_bps), from what a results.json holds. The syncer's link sends
    what the islands receive: its up (tx) is predicted with the down constants, and back."""
    st, M = res["settings"], res["settings"]["learners"]
    cfg = argparse.Namespace(P=st["P"], H=st["H"], tau=st["tau"])
    steps = {str(i): v for i, v in res["step_s"].items()}  # int keys, or str from the JSON
    mean_step = statistics.fmean(steps.values())
    rows = []
    for k, name in enumerate(res["names"]):
        s = mean_step if k == 0 else steps[str(k - 1)]
        pred = {}
        for d in ("up", "down"):
            learner_dir = ({"up": "down", "down": "up"}[d]) if k == 0 else d
            c = overhead[learner_dir]
            bits = (f"--codec int4 --framing {c['framing']:.4f} --message-bytes "
                    f"{c['message_bytes']:.1f} --control-bps {c['control_bps']:.1f}")  # fmt: skip
            pred[d] = predicted_Bps(st["params"], s, M, cfg, bits) * (M if k == 0 else 1)
        up, down = res["links"][name]["up_Bps"], res["links"][name]["down_Bps"]
        rows.append({"link": name, "bits": HEADLINE, "step_s": s,
                     "predicted_Bps": (pred["up"] + pred["down"]) / 2,
                     "predicted_up_Bps": pred["up"], "predicted_down_Bps": pred["down"],
                     "up_Bps": up, "down_Bps": down,
                     "up_ratio": up / pred["up"], "down_ratio": down / pred["down"]})  # fmt: skip
    return rows


def load_overhead(path: Path = OVERHEAD) -> dict | None:
    """The calibrated constants wire_overhead.py wrote ("use"), or None before it has run."""
    return json.loads(path.read_text())["use"] if path.exists() else None


def analyse(args: argparse.Namespace, root: Path, raw: dict) -> dict:
    from atoll.live.summary import evaluate

    M = args.learners
    m = measure(root, M, raw["samples"])
    cfg, params, names, links = m["cfg"], m["params"], m["names"], m["links"]
    step_s, mean_step, closed = m["step_s"], m["mean_step"], m["closed"]
    start, end, a, b = m["start"], m["end"], m["a"], m["b"]
    samples, payload_bits = raw["samples"], m["payload_bits"]
    rows = []
    for bits in ("--codec int4", "--bits 4.25", f"--bits {payload_bits:.4f}"):
        for k, name in enumerate(names):
            s = mean_step if k == 0 else step_s[k - 1]
            pred = predicted_Bps(params, s, M, cfg, bits) * (M if k == 0 else 1)
            up, down = links[name]["up_Bps"], links[name]["down_Bps"]
            rows.append({"link": name, "bits": bits, "step_s": s, "predicted_Bps": pred,
                         "up_Bps": up, "down_Bps": down,
                         "up_ratio": up / pred, "down_ratio": down / pred})  # fmt: skip
    final = json.loads((root / "syncer" / "syncer_final.json").read_text())
    res = {
        "command": " ".join(sys.argv),
        "settings": {
            "learners": M,
            "steps": args.steps,
            "pace_s": args.pace,
            "P": cfg.P,
            "H": cfg.H,
            "tau": cfg.tau,
            "codec": cfg.codec,
            "down_codec": cfg.down_codec,
            "params": params,
            "tls": True,
            "secret": "file",
        },
        "links_mbps": raw["rates_mbps"],
        "window_s": [a - start, b - start],
        "training_s": end - start,
        "step_s": step_s,
        "pull_period_s": m["pull_s"],
        "links": links,
        "comparison": rows,
        "payload_bits_per_value": payload_bits,
        # per island link: payload bytes/s, and link bytes over payload bytes (the model's
        # framing is atoll.bandwidth.model.WIRE_FRAMING)
        "payload": m["payload"],
        "link_over_payload": m["over"],
        "eval_loss": evaluate(root / "syncer", cfg),
        "rounds": final["rounds"],
        "participants_mean": statistics.fmean(len(c["participants"]) for c in closed),
        "lost_committed_rounds": final["lost_committed_rounds"],
        "refused": final["refused"],
        "bytes_in": final["bytes_in"],
        "bytes_out": final["bytes_out"],
        "timeline": [{"t": s["t"] - start, "hosts": s["hosts"]} for s in samples],
        "names": names,
    }
    add_overhead_column(res)
    return res


def add_overhead_column(res: dict) -> bool:
    """Replace the comparison's `--codec int4 + overhead` rows with ones from the calibrated
    constants (wire_overhead.json), if it exists; says whether it did."""
    overhead = load_overhead()
    res["comparison"] = [r for r in res["comparison"] if r["bits"] != HEADLINE]
    if overhead is None:
        return False
    res["wire_overhead"] = overhead
    res["comparison"] += overhead_rows(res, overhead)
    return True


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    tl, names = res["timeline"], res["names"]
    t = [x["t"] for x in tl]
    for k, name in enumerate(names):
        for key, style in (("tx_bytes", "-"), ("rx_bytes", ":")):
            v = [x["hosts"][k][key] for x in tl]
            r = [(v[j + 2] - v[j]) / (t[j + 2] - t[j]) / 1e3 for j in range(len(v) - 2)]
            label = f"{name} {'up' if key == 'tx_bytes' else 'down'}"
            ax.plot(t[1:-1], r, style, color=f"C{k}", label=label, lw=1)
    headline = HEADLINE if any(r["bits"] == HEADLINE for r in res["comparison"]) else "--codec int4"
    for row in res["comparison"]:
        if row["bits"] == headline:
            k = names.index(row["link"])
            ax.axhline(row["predicted_Bps"] / 1e3, color=f"C{k}", ls="--", lw=0.8)
    ax.axvspan(*res["window_s"], color="0.9", zorder=0, label="middle half")
    ax.set(xlabel="seconds since training started", ylabel="link kB/s (2 s windows)",
           title=f"link bytes per second; dashed: atoll bandwidth ({headline})")  # fmt: skip
    ax.legend(fontsize=7, ncol=2)
    groups = [(name, d) for name in names for d in ("up", "down")]
    order = [HEADLINE, "--codec int4", "--bits 4.25"]
    bit_rows = sorted({r["bits"] for r in res["comparison"]},
                      key=lambda x: order.index(x) if x in order else len(order))  # fmt: skip
    width = 0.8 / len(bit_rows)
    for j, bits in enumerate(bit_rows):
        by = {r["link"]: r for r in res["comparison"] if r["bits"] == bits}
        label = {HEADLINE: "int4 codec's bits + calibrated overhead",
                 "--codec int4": "int4 codec's bits", "--bits 4.25": "4.25 bits (nominal)"}.get(
            bits, f"{bits.split()[-1][:4]} bits (this run's payloads)")  # fmt: skip
        xs = [g + (j - (len(bit_rows) - 1) / 2) * width for g in range(len(groups))]
        bx.bar(xs, [by[n][f"{d}_ratio"] for n, d in groups], width, label=label)
    bx.axhspan(0.9, 1.1, color="0.9", zorder=0, label="within 10%")
    bx.set_xticks(range(len(groups)), [f"{n}\n{d}" for n, d in groups], fontsize=8)
    bx.set(ylabel="measured / predicted", ylim=(0, 1.5), title="middle half, by bits per value")
    bx.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--learners", type=int, default=2)
    ap.add_argument("--nproc", type=int, default=None,
                    help="ranks per island (torchrun, DDP; default: one process)")  # fmt: skip
    ap.add_argument("--mbps", type=float, default=2.0, help="each island's link, both ways")
    ap.add_argument("--syncer-mbps", type=float, default=None,
                    help="the syncer's link (default: learners x --mbps)")  # fmt: skip
    ap.add_argument("--steps", type=int, default=1500, help="inner steps per island (budget)")
    ap.add_argument("--pace", type=float, default=0.05, help="seconds per step (pace_s)")
    ap.add_argument("--max-wall", type=float, default=600.0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/multihost"))
    ap.add_argument("--recompare", action="store_true",
                    help="no run: add the calibrated column to --out's stored results.json "
                    "(wire_overhead.json's constants) and redraw its plot")  # fmt: skip
    args = ap.parse_args()
    root = None
    if args.recompare:
        res = json.loads((args.out / "results.json").read_text())
        if not add_overhead_column(res):
            print(f"multihost: no {OVERHEAD}: run wire_overhead.py first", file=sys.stderr)
            return 1
    else:
        if why := hosts.unavailable():
            print(f"multihost: cannot run here: {why}", file=sys.stderr)
            return 1
        root = Path(tempfile.mkdtemp(prefix="atoll-multihost-"))
        res = analyse(args, root, run(args, root))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(res, indent=1))
    plot(res, args.out / "multihost.png")
    for r in res["comparison"]:
        pred = (f"{r['predicted_up_Bps'] / 1e3:.2f} / {r['predicted_down_Bps'] / 1e3:.2f}"
                if "predicted_up_Bps" in r else f"{r['predicted_Bps'] / 1e3:.2f}")  # fmt: skip
        print(f"{r['link']:>6} {r['bits']:<23} step {r['step_s'] * 1e3:.1f} ms: up "
              f"{r['up_Bps'] / 1e3:.2f} down {r['down_Bps'] / 1e3:.2f} kB/s, predicted "
              f"{pred}: {r['up_ratio']:.3f} / {r['down_ratio']:.3f}")  # fmt: skip
    print(f"payload {res['payload_bits_per_value']:.3f} bits per value; island links carry "
          f"{res['link_over_payload']['up_Bps']:.3f} (up) and "
          f"{res['link_over_payload']['down_Bps']:.3f} (down) x their payload bytes")  # fmt: skip
    print(f"eval {res['eval_loss']:.4f}, {res['rounds']} rounds, "
          f"{res['participants_mean']:.2f} per round, lost {res['lost_committed_rounds']}"
          + (f"; run directory {root}" if root else ""))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
