"""The wire's fixed costs, measured for `atoll bandwidth --message-bytes --control-bps`: what a
fragment exchange and a heartbeat cost on a link beyond framing x their payload.

Calibration runs, separate from the runs the constants then predict (multihost.py): the same
hosts as multihost.py (hosts.py: the syncer and 2 islands in network namespaces over tc-tbf
shaped links, TLS and the secret file, the deploy/ scripts, pull schedule, P = H = 24, tau = 2,
50 ms steps), with payloads of other sizes than multihost.py's (its d_model 64, int4 run):

    d32-int4        d_model 32 (43,904 parameters), int4 both ways, 2 Mbps islands
    d32-int8        d_model 32, int8 both ways (twice the payload), 2 Mbps islands
    d64-int8        d_model 64 (136,960), int8 both ways, 4 Mbps islands: as many
                    milliseconds per fragment on the link as the int4 run on 2 Mbps
    d32-int4-beats  as d32-int4 with heartbeat_s 0.1 (five times the heartbeats)

For each run, over the middle half of the training window, per island link and direction: the
bytes/s on the link (interface counters: Ethernet frames), the payload bytes/s (the syncer's
round_closed books: contributions in, updates out to each island), exchanges/s (the model's:
P / (H x the measured step time), one a step here), heartbeats/s (1 / heartbeat_s), and the
frames and TCP segments (retransmissions too). Then, per direction, least squares over every
run (the mean of the two islands):

    wire = F x payload + message_bytes x exchanges + beat_bytes x heartbeats

with F fitted: these are the constants to give `atoll bandwidth` ("use": --framing F
--message-bytes message_bytes --control-bps 8 x beat_bytes / 0.5 s, the default heartbeat).
Also written: each repeat's fit alone (how well the constants are known), the fit with F held
at atoll.bandwidth.model.WIRE_FRAMING (1.069), the residuals of both (how well a line fits),
and frames per exchange against payload per exchange (what the Ethernet/IP/TCP headers are).
Calibration runs only: multihost.py's runs are predicted with these constants, not fitted.

    sudo .venv/bin/python benchmarks/wire_overhead.py        # 3 repeats, about 12 minutes; root
    sudo .venv/bin/python benchmarks/wire_overhead.py --add --repeats 1     # one more repeat
    .venv/bin/python benchmarks/wire_overhead.py --refit     # the fit again, from the JSON

Writes benchmarks/results/multihost/wire_overhead.json (the runs after every run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import hosts
import multihost

from atoll.bandwidth.model import WIRE_FRAMING

OUT = multihost.OVERHEAD
DEFAULT_BEAT_S = 0.5
POINTS = {
    "d32-int4": (2.0, {"d_model": 32, "codec": "int4", "down_codec": "int4"}),
    "d32-int8": (2.0, {"d_model": 32, "codec": "int8", "down_codec": "int8"}),
    "d64-int8": (4.0, {"d_model": 64, "codec": "int8", "down_codec": "int8"}),
    "d32-int4-beats": (2.0, {"d_model": 32, "codec": "int4", "down_codec": "int4",
                             "heartbeat_s": 0.1}),
}  # fmt: skip


def point(name: str, args: argparse.Namespace) -> dict:
    """One calibration run: per island link and direction, wire and payload bytes/s."""
    mbps, extra = POINTS[name]
    run_args = argparse.Namespace(learners=2, mbps=mbps, syncer_mbps=None, steps=args.steps,
                                  pace=args.pace, max_wall=args.max_wall)  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix=f"atoll-wire-{name}-"))
    raw = multihost.run(run_args, root, extra, prefix="awo", subnet="10.86")
    m = multihost.measure(root, 2, raw["samples"])
    cfg, islands = m["cfg"], [f"L{i}" for i in range(2)]
    exchanges = statistics.fmean(cfg.P / (cfg.H * s) for s in m["step_s"].values())
    wire = {d: statistics.fmean(m["links"][n][f"{d}_Bps"] for n in islands) for d in ("up", "down")}
    return {
        "name": name,
        "settings": {
            **extra,
            "steps": args.steps,
            "pace_s": args.pace,
            "P": cfg.P,
            "H": cfg.H,
            "tau": cfg.tau,
            "tls": True,
            "secret": "file",
        },  # fmt: skip
        "params": m["params"],
        "links_mbps": raw["rates_mbps"],
        "window_s": [m["a"] - m["start"], m["b"] - m["start"]],
        "step_s": statistics.fmean(m["step_s"].values()),
        "exchanges_per_s": exchanges,
        "beats_per_s": 1.0 / extra.get("heartbeat_s", DEFAULT_BEAT_S),
        "wire_Bps": wire,
        "payload_Bps": {d: m["payload"][f"{d}_Bps"] for d in ("up", "down")},
        "payload_bytes_per_exchange": {
            d: m["payload"][f"{d}_Bps"] / exchanges for d in ("up", "down")
        },  # fmt: skip
        "links": m["links"],
        # frames (Ethernet + IP + TCP headers, 66 B each with timestamps) and what is left over
        # the payload: TLS records, HTTP/2 frames, gRPC prefixes, protobuf headers, metadata
        "frames_per_s": {
            d: statistics.fmean(m["links"][n][f"{d}_frames_per_s"] for n in islands)
            for d in ("up", "down")
        },  # fmt: skip
        "payload_bits_per_value": m["payload_bits"],
        "rounds_in_window": m["rounds_in_window"],
        "participants_in_window": m["participants_in_window"],
        "run_dir": str(root),
    }


def lstsq(rows: list[list[float]], y: list[float]) -> list[float]:
    import numpy as np

    return [float(v) for v in np.linalg.lstsq(np.array(rows), np.array(y), rcond=None)[0]]


def fit(points: list[dict]) -> dict:
    """Per direction: the constants with F = WIRE_FRAMING and with F fitted; residuals."""
    out: dict = {}
    for d in ("up", "down"):
        w = [p["wire_Bps"][d] for p in points]
        y = [p["payload_Bps"][d] for p in points]
        x = [p["exchanges_per_s"] for p in points]
        b = [p["beats_per_s"] for p in points]
        m, h = lstsq([[xi, bi] for xi, bi in zip(x, b, strict=True)],
                     [wi - WIRE_FRAMING * yi for wi, yi in zip(w, y, strict=True)])  # fmt: skip
        f2, m2, h2 = lstsq([list(r) for r in zip(y, x, b, strict=True)], w)
        fixed = [WIRE_FRAMING * yi + m * xi + h * bi for yi, xi, bi in zip(y, x, b, strict=True)]
        free = [f2 * yi + m2 * xi + h2 * bi for yi, xi, bi in zip(y, x, b, strict=True)]
        out[d] = {
            "fixed_framing": {
                "framing": WIRE_FRAMING, "message_bytes": m, "beat_bytes": h,
                "residual": [(wi - pi) / wi for wi, pi in zip(w, fixed, strict=True)],
            },
            "free_framing": {
                "framing": f2, "message_bytes": m2, "beat_bytes": h2,
                "residual": [(wi - pi) / wi for wi, pi in zip(w, free, strict=True)],
            },
            # each run alone, F fixed and the fitted heartbeats taken out: bytes per exchange
            "per_point_message_bytes": [(wi - WIRE_FRAMING * yi - h * bi) / xi
                                        for wi, yi, xi, bi in zip(w, y, x, b, strict=True)],
        }  # fmt: skip
    return out


def frames(points: list[dict]) -> dict:
    """Per direction, frames per exchange against payload per exchange (the heartbeat runs left
    out): a line's slope x 1448 is frames per full segment of payload, data and the other
    direction's ACKs (1.5: an ACK every second segment, 2: one every segment); its intercept
    the frames an exchange costs whatever its size. And the bytes beyond framing x payload:
    66 per frame of headers, the rest TLS, HTTP/2, gRPC and protobuf headers."""
    pts = [p for p in points if p["beats_per_s"] == 1.0 / DEFAULT_BEAT_S]
    out = {}
    for d in ("up", "down"):
        x = [p["payload_Bps"][d] / p["exchanges_per_s"] for p in pts]
        y = [p["frames_per_s"][d] / p["exchanges_per_s"] for p in pts]
        slope, icpt = lstsq([[xi, 1.0] for xi in x], y)
        out[d] = {"frames_per_exchange": y, "per_full_segment": slope * 1448,
                  "fixed_frames_per_exchange": icpt}  # fmt: skip
    return out


def summarize(points: list[dict]) -> dict:
    """The fits over every run (pooled), the fits of each repeat alone (their spread: how well
    the constants are known), the frame counts, and the constants to use."""
    repeats = sorted({p["repeat"] for p in points})
    pooled = fit(points)
    use = {d: {"framing": pooled[d]["free_framing"]["framing"],
               "message_bytes": pooled[d]["free_framing"]["message_bytes"],
               "control_bps": 8 * pooled[d]["free_framing"]["beat_bytes"] / DEFAULT_BEAT_S}
           for d in ("up", "down")}  # fmt: skip
    return {"fit": pooled,
            "fit_by_repeat": [fit([p for p in points if p["repeat"] == r]) for r in repeats],
            "frames": frames([p for p in points if "frames_per_s" in p]),
            "use": use}  # fmt: skip


def report(doc: dict) -> None:
    def line(f: dict) -> str:
        return (f"F {f['framing']:.4f}, {f['message_bytes']:.0f} B per exchange, "
                f"{f['beat_bytes']:.0f} B per heartbeat, residuals "
                + " ".join(f"{r:+.3f}" for r in f["residual"]))  # fmt: skip

    for d in ("up", "down"):
        print(f"{d}, every run: {line(doc['fit'][d]['free_framing'])}")
        print(f"{d}, F fixed:   {line(doc['fit'][d]['fixed_framing'])}")
        for r, f in enumerate(doc["fit_by_repeat"]):
            print(f"{d}, repeat {r}:  {line(f[d]['free_framing'])}")
        f = doc["frames"][d]
        print(f"{d}: {f['per_full_segment']:.2f} frames per full segment of payload, "
              f"{f['fixed_frames_per_exchange']:.2f} per exchange whatever its size")  # fmt: skip
    print(f"use: {json.dumps(doc['use'])}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=700, help="inner steps per island")
    ap.add_argument("--pace", type=float, default=0.05, help="seconds per step (pace_s)")
    ap.add_argument("--max-wall", type=float, default=400.0)
    ap.add_argument("--repeats", type=int, default=3, help="runs of every point (interleaved)")
    ap.add_argument("--add", action="store_true", help="keep the stored runs; add --repeats")
    ap.add_argument("--refit", action="store_true", help="no runs: fit the stored runs again")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    keep = (args.add or args.refit) and args.out.exists()
    points = json.loads(args.out.read_text())["points"] if keep else []
    first = 1 + max((p["repeat"] for p in points), default=-1)
    todo = [] if args.refit else [(r, n) for r in range(first, first + args.repeats)
                                  for n in POINTS]  # fmt: skip
    if todo and (why := hosts.unavailable()):
        print(f"wire_overhead: cannot run here: {why}", file=sys.stderr)
        return 1
    for r, name in todo:
        p = {**point(name, args), "repeat": r}
        points.append(p)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"points": points}, indent=1))
        w, y = p["wire_Bps"], p["payload_Bps"]
        print(f"{name} #{r}: step {p['step_s'] * 1e3:.1f} ms, {p['participants_in_window']:.2f} "
              f"per round; per island up {w['up'] / 1e3:.2f} kB/s on the wire, "
              f"{y['up'] / 1e3:.2f} payload; down {w['down'] / 1e3:.2f} / "
              f"{y['down'] / 1e3:.2f}")  # fmt: skip
    if not points:
        print("wire_overhead: no runs to fit", file=sys.stderr)
        return 1
    doc = {"command": " ".join(sys.argv), "points": points, **summarize(points)}
    args.out.write_text(json.dumps(doc, indent=1))
    report(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
