"""The two systems of the peer benchmark, behind one small interface the harness drives:
`prepare` (files), `server` (the argv of the one process on the host: atoll's syncer or
torchft's lighthouse), `learner` (one learner's argv), `poll` (called every second during the
run: here atoll's syncer snapshot is kept as a global model at that instant), `own_bytes`
(the system's own accounting, when it has one) and `committed` (how much of the trained work
reached the global model).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import workload as wl

HERE = Path(__file__).resolve().parent
PY = sys.executable


class Atoll:
    name = "atoll"

    def __init__(self, w: wl.Work, sets: list[str]) -> None:
        self.w = w
        # the budget and the run's shape; everything else stays at atoll's defaults unless
        # the harness passes --atoll-set (recorded in the results)
        self.sets = [
            f"learners={w.learners}",
            f"steps={w.steps}",
            f"batch={w.batch}",
            f"context={w.context}",
            "host=0.0.0.0",
            "snapshot_every_s=5",  # the harness's view of the global model over time
            *sets,
        ]
        self.port = 0
        self._snap_mtime = 0.0

    def prepare(self, rd: Path) -> None:
        from atoll.model.custom import save_init

        save_init(wl.build_model(self.w), rd / "init.safetensors")
        (rd / "secret").write_text("peer-benchmark-secret\n")
        (rd / "syncer").mkdir()

    def server(self, rd: Path) -> list[str]:
        argv = [str(Path(PY).parent / "atoll"), "syncer", "--init", str(rd / "init.safetensors")]
        argv += ["--embeddings", ""]  # as measured (BENCHMARKS.md §5): no embedding fragment
        argv += ["--run-dir", str(rd / "syncer"), "--secret-file", str(rd / "secret")]
        return argv + ["--run-id", "peer"] + [x for kv in self.sets for x in ("--set", kv)]

    def ready(self, rd: Path) -> bool:
        addr = rd / "syncer" / "syncer.addr"
        if not addr.exists():
            return False
        self.port = int(addr.read_text().rsplit(":", 1)[1])
        return True

    def learner(self, rd: Path, rank: int, host_ip: str, ns_ip: str, slow: float) -> list[str]:
        argv = [PY, str(HERE / "atoll_learner.py"), "--rank", str(rank), "--work", self.w.to_json()]
        argv += ["--syncer", f"{host_ip}:{self.port}", "--out", str(rd)]
        return argv + ["--secret-file", str(rd / "secret"), "--run-id", "peer", "--slow", str(slow)]

    def poll(self, rd: Path) -> None:
        """Keep each new syncer snapshot (written every 5 s) as the global model at its time."""
        snap = rd / "syncer" / "snapshot.safetensors"
        try:
            m = snap.stat().st_mtime
        except OSError:
            return
        if m > self._snap_mtime:
            self._snap_mtime = m
            (rd / "global").mkdir(exist_ok=True)
            try:
                shutil.copyfile(snap, rd / "global" / f"{m:.3f}.snap")
            except OSError:
                pass  # replaced while copying: the next one will do

    def finished(self, rd: Path) -> None:
        final = rd / "syncer" / "final.safetensors"
        if final.exists():
            shutil.copyfile(final, rd / "global" / f"{final.stat().st_mtime:.3f}.final")

    def params(self, path: Path, rd: Path) -> dict[str, Any]:
        """The global model's parameters in a kept snapshot or the final model."""
        from safetensors.torch import load_file

        if path.suffix == ".final":
            return load_file(str(path))
        from atoll.config import build
        from atoll.live.syncer.store_read import read_snapshot
        from atoll.model.custom import file_plan

        scfg, _ = build([s for s in self.sets if not s.startswith(("host", "snapshot"))], None)
        plan, _ = file_plan(rd / "init.safetensors", scfg.P, scfg.H, set(), scfg.packing)
        state, _, _ = read_snapshot(path, [f.numel for f in plan.fragments])
        out: dict[str, Any] = {}
        for st in state["fragments"]:
            f = plan.fragments[st["fragment"]]
            out.update(zip(f.names, plan.split(st["fragment"], st["theta"]), strict=True))
        return out

    def own_bytes(self, rd: Path) -> dict[str, Any]:
        """What atoll's books say: payload bytes the syncer took in and sent out, and the
        learners' own counters of bytes on the wire (their events)."""
        from atoll.eventlog import load_events
        from atoll.live.summary import wire_bytes

        p = rd / "syncer" / "syncer_final.json"
        acct = json.loads(p.read_text()) if p.exists() else {}
        events = [e for f in sorted(rd.glob("learner-*.jsonl")) for e in load_events(f)]
        return {
            **wire_bytes(events),  # the learners' last readings, as the run summary sums them
            "up": acct.get("bytes_in"),
            "down": acct.get("bytes_out"),
            "useful_s": acct.get("useful_s"),
            "work_s": sum(acct.get("work_s", {}).values()) if acct else None,
            "tokens": sum(acct.get("tokens", {}).values()) if acct else None,
            "rounds": acct.get("rounds"),
        }

    def committed(self, rd: Path, trained_tokens: int) -> float:
        """The fraction of trained step-seconds the syncer accepted."""
        b = self.own_bytes(rd)
        if not b["work_s"]:
            return float("nan")
        return min(b["useful_s"] / b["work_s"], 1.0)


def wait_for(pred: Any, timeout: float, what: str) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} not ready within {timeout:.0f} s")
