"""torchft 0.2.0's synchronous DiLoCo as the peer benchmark's other system (systems.py has
the interface): one lighthouse on the host, one replica group per learner
(torchft_learner.py), rank 0 saving the global model after every committed outer sync."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import workload as wl
from evaluate import progress
from systems import HERE, PY


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


class Torchft:
    name = "torchft"

    def __init__(self, w: wl.Work, sync_every: int) -> None:
        self.w, self.H = w, sync_every
        self.port = _free_port()

    def prepare(self, rd: Path) -> None:
        (rd / "global").mkdir()

    def server(self, rd: Path) -> list[str]:
        exe = str(Path(PY).parent / "torchft_lighthouse")
        return [exe, "--min_replicas", "1", "--join_timeout_ms", "60000",
                "--bind", f"0.0.0.0:{self.port}"]  # fmt: skip

    def ready(self, rd: Path) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            return True
        except OSError:
            return False

    def learner(self, rd: Path, rank: int, host_ip: str, ns_ip: str, slow: float) -> list[str]:
        argv = [
            PY,
            str(HERE / "torchft_learner.py"),
            "--rank",
            str(rank),
            "--work",
            self.w.to_json(),
        ]
        argv += ["--lighthouse", f"http://{host_ip}:{self.port}", "--out", str(rd)]
        argv += ["--sync-every", str(self.H), "--slow", str(slow), "--host", ns_ip]
        return argv + (["--save-global"] if rank == 0 else [])

    def poll(self, rd: Path) -> None:
        pass

    def finished(self, rd: Path) -> None:
        pass

    def params(self, path: Path, rd: Path) -> dict[str, Any]:
        import torch

        return torch.load(path, weights_only=True)["state"]

    def own_bytes(self, rd: Path) -> dict[str, Any]:
        return {}  # torchft keeps no byte counters of its own

    def committed(self, rd: Path, trained_tokens: int) -> float:
        """The tokens of intervals that reached the global model (the replicas' notes after
        each sync: 0 for an interval discarded by a heal or an uncommitted step)."""
        kept = sum(d.get("note", {}).get("tokens", 0) for d in progress(rd))
        return min(kept / trained_tokens, 1.0) if trained_tokens else float("nan")
