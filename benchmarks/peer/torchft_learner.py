"""One torchft replica group of the peer benchmark: one process (world size 1 inside the group)
running torchft 0.2.0's synchronous DiLoCo on the user's own model and loop (workload.py).

    python benchmarks/peer/torchft_learner.py --rank R --work JSON --lighthouse http://HOST:PORT \
        --out DIR [--sync-every 20] [--slow 2.0] [--host IP] [--save-global]

The lighthouse (one, on the host; it must be up before the learners start):

    benchmarks/peer/.venv/bin/torchft_lighthouse --min_replicas 1 --join_timeout_ms 60000 \
        --bind 0.0.0.0:29510

`min_replicas 1` lets the survivors go on when a replica dies. The lighthouse issues a quorum
at once when every member of the previous one asks again (fast path), else only with more than
half of the replicas it hears heartbeats from (a manager heartbeats from its start; a killed one
counts for 5 s more, --heartbeat_timeout_ms) and, until `join_timeout_ms` has passed since the
first one asked, only once all of those have asked. The first quorum comes at step H, not at
start (DiLoCo asks at each sync only), so 4 replicas started together are all heartbeating by
then and all 4 are in it (one not yet heartbeating would not be waited for); the 60 s also
covers a 2x straggler's lag per interval (were it dropped from a quorum, it would be healed at
the next one and its interval discarded, every time), and bounds how long survivors wait for a
restarted replica's first sync.

Loop: AdamW inner steps (lr from `lr_at` of the synchronous schedule's step, outer step * H +
step in the interval: the same on all replicas, also on one that healed), and every H steps
`DiLoCo` (the whole model as one fragment; outer SGD lr 0.7, momentum 0.9, Nesterov) averages
the pseudo-gradients over `ProcessGroupGloo` and takes the outer step. With the default
fragment_update_alpha=0 the parameters right after a committed sync are the new global ones, so
`--save-global` saves the model then.

Stop rule: the manager's step (committed outer syncs, the same on every replica of a quorum, and
restored by a heal) reaches ceil(steps / H). Each replica that never failed trains exactly that
many intervals (= `steps` inner steps when H divides it); all end after the same sync, so none
waits for a peer that left. A restarted replica starts at manager step 0 and from its own fresh
model (its progress file only keeps counting its steps and tokens), trains H steps, and at that
sync is sent the live state (model, AdamW, global parameters, outer momentum, manager step) by a
peer: its interval is discarded and it averages that peer's pseudo-gradient (torchft's
behaviour), then runs in lockstep to the same last step. A replica that finds DIR/finished-*
(some replica completed the run) exits at once instead of training alone.

Addresses: `--host` is what this replica binds and advertises, so replicas in other network
namespaces can reach it: the manager's `hostname`, the replica group's TCPStore (the peers'
Gloo rendezvous), GLOO_SOCKET_IFNAME (the interface holding that IP; otherwise Gloo takes the
address the machine's hostname resolves to, here 127.0.0.1) and the checkpoint server's URL
(torchft's HTTPTransport advertises socket.gethostname(); the subclass below advertises
`--host`). Manager and checkpoint server bind [::] (all addresses), ports chosen by the OS.
"""

from __future__ import annotations

import argparse
import fcntl
import math
import os
import socket
import struct
import sys
import time
import urllib.parse
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workload as wl  # noqa: E402

TIMEOUT = timedelta(seconds=120)  # collectives, should_commit, a heal (checkpoint + allreduce)
# a quorum waits for the slowest replica's interval, or a restarted one's start and first
# interval: far longer than any step, shorter than a hung run
QUORUM_TIMEOUT = timedelta(seconds=900)


def interface_of(ip: str) -> str | None:
    """The network interface whose (first) IPv4 address is `ip` (SIOCGIFADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                req = struct.pack("256s", name.encode()[:15])
                got = fcntl.ioctl(s.fileno(), 0x8915, req)[20:24]
            except OSError:
                continue
            if socket.inet_ntoa(got) == ip:
                return name
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--lighthouse", required=True, help="http://HOST:PORT")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sync-every", type=int, default=20)
    ap.add_argument("--slow", type=float, default=1.0)
    ap.add_argument("--host", default="127.0.0.1", help="the IP to bind and advertise")
    ap.add_argument("--save-global", action="store_true")
    a = ap.parse_args()
    tag = f"[torchft r{a.rank}]"

    def over() -> str | None:
        """Set when some replica completed the run: then there is nothing left to do."""
        return next((p.name for p in a.out.glob("finished-*")), None)

    if done := over():
        print(f"{tag} the run is over ({done}): nothing to do", flush=True)
        return 0
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        iface = interface_of(a.host)
        if iface is None:
            sys.exit(f"{tag} no interface holds --host {a.host}")
        os.environ["GLOO_SOCKET_IFNAME"] = iface
    wl.setup_threads()
    import torch
    from torch.distributed import TCPStore
    from torchft.checkpointing import HTTPTransport
    from torchft.local_sgd import DiLoCo
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    class Transport(HTTPTransport):
        """torchft's checkpoint server, advertising `--host` instead of the hostname."""

        def __init__(self, host: str) -> None:
            self.host = host  # before super(): its __init__ logs address()
            super().__init__(timeout=TIMEOUT, num_chunks=0)

        def address(self) -> str:
            port = urllib.parse.urlsplit(super().address()).port
            return f"http://{self.host}:{port}/checkpoint/"

    w = wl.Work.from_json(a.work)
    H = a.sync_every
    outer_steps = math.ceil(w.steps / H)
    model = wl.build_model(w)  # seeded: every replica starts from the same parameters
    inner = wl.inner_optimizer(model, w)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    train, _ = wl.corpus()
    batches = wl.Batches(train, w, a.rank)
    prog = wl.Progress(a.out / f"progress-{a.rank}.jsonl")
    slow = wl.Straggler(a.slow)
    healed = []

    def state_dict() -> dict:
        return {"model": model.state_dict(), "inner": inner.state_dict()}

    def load_state_dict(sd: dict) -> None:  # a heal: the live state of a peer
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["inner"])
        healed.append(time.time())

    # the replica group's own store (world size 1): the manager's, and, when this replica is
    # the quorum's first, the peers' Gloo rendezvous
    store = TCPStore(a.host, 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=TIMEOUT),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=1,
        use_async_quorum=False,  # DiLoCo requires it
        # identical seeded inits: no step-0 "sync" (it would overwrite every replica's first
        # interval with the first replica's, DiLoCo's first quorum being at step H)
        init_sync=False,
        replica_id=f"replica_{a.rank}",  # torchft appends ":<uuid>" per process start
        lighthouse_addr=a.lighthouse,
        hostname=a.host,
        store_addr=a.host,
        store_port=store.port,
        rank=0,
        world_size=1,
        timeout=TIMEOUT,
        quorum_timeout=QUORUM_TIMEOUT,
        connect_timeout=TIMEOUT,
        checkpoint_transport=Transport(a.host),
    )
    last = {"loss": 0.0}

    def after_compute(*_: object) -> None:
        """The inner optimizer's first post-hook: before DiLoCo's (the sync, every H steps),
        so a straggler's sleep and the step's compute seconds leave the network out."""
        slow.done()
        prog.record(w.tokens_per_step, last["loss"], time.perf_counter() - slow.t0)

    inner.register_step_post_hook(after_compute)
    print(f"{tag} up: manager step {manager.current_step()}, progress step {prog.step}, "
          f"{outer_steps} outer steps of H={H}", flush=True)  # fmt: skip
    t0 = t_sync = time.time()
    k, losses = 0, []  # inner steps since the last sync (DiLoCo's count too), their losses
    with DiLoCo(manager, [model], inner, outer, sync_every=H):
        while manager.current_step() < outer_steps:
            if done := over():  # e.g. restarted while the survivors took the last steps
                print(f"{tag} the run is over ({done}): stopping", flush=True)
                break
            for g in inner.param_groups:
                g["lr"] = wl.lr_at(manager.current_step() * H + k, w)
            x, y = batches.at(prog.step)
            slow.start()
            loss = wl.loss_of(model, x, y)
            inner.zero_grad(set_to_none=True)
            loss.backward()
            last["loss"] = float(loss.detach())
            losses.append(last["loss"])
            before, n_healed = manager.current_step(), len(healed)
            inner.step()  # every H-th: quorum (maybe a heal), allreduce, outer step
            k += 1
            if k < H:
                continue
            committed = manager.current_step() > before
            heal = len(healed) > n_healed
            if committed and a.save_global:
                hint = manager.batches_committed() * H * w.tokens_per_step
                wl.save_global(model, a.out / "global", tokens_hint=hint)
            n = manager.num_participants()
            mine = H * w.tokens_per_step if committed and not heal else 0  # reached the model
            prog.note(outer=manager.current_step(), committed=committed, participants=n,
                      healed=heal, tokens=mine)  # fmt: skip
            now = time.time()
            print(f"{tag} outer {manager.current_step()}/{outer_steps} step {prog.step} "
                  f"loss {sum(losses) / len(losses):.4f} {now - t_sync:.1f}s ({now - t0:.0f}s) "
                  f"participants {n}" + (" healed" if heal else "")
                  + ("" if committed else " NOT COMMITTED"), flush=True)  # fmt: skip
            k, losses, t_sync = 0, [], now
    if manager.current_step() >= outer_steps:
        (a.out / f"finished-{a.rank}").write_text(f"{manager.current_step()}\n")
    print(f"{tag} done: outer {manager.current_step()}, {prog.step} steps, "
          f"{time.time() - t0:.1f}s", flush=True)  # fmt: skip
    manager.shutdown(wait=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
