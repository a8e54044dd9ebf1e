"""Several hosts: the syncer and two learner islands, each in a network namespace of its own
joined to the host by a shaped link (tc tbf), started with the deploy/ scripts (the commands
deploy/k8s and deploy/slurm run), TLS with a certificate for the syncer's address and the
shared secret in a file. The shorter version of benchmarks/multihost.py, with a syncer killed
(SIGKILL) and started again on its run directory mid-run, as a Kubernetes Deployment does on
its volume. Needs root and iproute2; skipped, with the reason, where namespaces cannot be made."""

import json
import sys
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from atoll.eventlog import read_events
from atoll.live.client import status

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import hosts  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def netns():
    """Skip, saying why, where network namespaces cannot be made (not root, no iproute2, no
    tbf); asked when a test runs, not when the suite is collected (the check makes one)."""
    if why := hosts.unavailable():
        pytest.skip(f"namespaces as hosts: {why}")


# the TINY model of test_live.py, two islands, about 10 s of paced training each
SETTINGS = {
    "n_layer": 1, "d_model": 16, "n_head": 2, "context": 16, "batch": 4, "P": 4, "H": 4,
    "data_bytes": 200_000, "eval_batches": 2, "lost_after_s": 2.0, "snapshot_every_s": 2.0,
    "learners": 2, "steps": 300, "pace_s": 0.03,
}  # fmt: skip
PREFIX, SUBNET = "amt", "10.84"  # not the benchmark's (amh, 10.81): both may run at once
NPROC = 2  # each island a torchrun job of two ranks (atoll learner --nproc 2; DDP, gloo)


def test_islands_on_their_own_hosts_train_over_tls_and_keep_the_books_through_a_syncer_kill(
    netns, tmp_path
):
    # 800 steps (~24 s of training): enough left after the syncer's restart, which takes 5-10 s
    # with the suite's other worker on the same cores, for each island to contribute to it
    settings = {**SETTINGS, "steps": 800}
    with hosts.Hosts(tmp_path, learners=2, mbps=4.0, settings=settings, prefix=PREFIX,
                     subnet=SUBNET) as h:  # fmt: skip
        h.start_syncer()
        h.wait_ready(120)
        # what a stranger on the network gets: nothing without TLS, UNAUTHENTICATED without
        # the secret
        with pytest.raises(grpc.RpcError) as err:
            status(h.address, hosts.RUN_ID, h.secret, timeout=2.0)
        assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        with pytest.raises(grpc.RpcError) as err:
            status(h.address, hosts.RUN_ID, "not-the-secret", 5.0, h.cert)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        before = h.counters()
        for i in range(2):
            h.start_learner(i, NPROC)
        until = time.time() + 120
        while h.status().rounds < 12:  # both islands joined and rounds are committed
            assert time.time() < until, h.tail("syncer.log")
            assert all(p.poll() is None for p in h.learner_procs.values()), h.tail("L0.log")
            time.sleep(0.2)
        h.kill_syncer()  # a node that dies: only its tape survives
        h.start_syncer()  # the same script on the same run directory
        h.wait_ready(120)
        codes = h.wait_learners(240)
        after = h.counters()
        assert h.stop_syncer() == 0, h.tail("syncer.log")
    assert codes == {0: 0, 1: 0}, (h.tail("L0.log"), h.tail("L1.log"))
    assert hosts.leftovers(PREFIX) == []  # every namespace and link is gone

    final = json.loads((h.run_dir / "syncer_final.json").read_text())
    events = read_events(h.run_dir / "events.jsonl")
    restored = [e["data"] for e in events if e["kind"] == "restored"]
    t_back = next(e["t"] for e in events if e["kind"] == "restored")
    assert len(restored) == 1 and restored[0]["rounds_closed"] >= 12
    # no committed round lost: the restore found every taped version, no learner had seen a
    # version the restored syncer lacks, and no version number was committed twice
    assert restored[0]["lost_committed_rounds"] == 0 and final["lost_committed_rounds"] == 0
    assert all(e["data"]["lost_committed_rounds"] == 0 for e in events
               if e["kind"] == "seen_check")  # fmt: skip
    closed = [(e["data"]["fragment"], e["data"]["version"]) for e in events
              if e["kind"] == "round_closed"]  # fmt: skip
    assert not [fv for fv, n in Counter(closed).items() if n > 1]
    versions = final["versions"]
    assert sum(versions) == final["rounds"] and all(v >= 2 for v in versions)
    for p, v in enumerate(versions):  # every announced round is in the final state; a round
        got = {ver for f, ver in closed if f == p}  # taped as the kill came may lack its event
        assert got <= set(range(1, v + 1)) and len(got) >= v - 1, (p, v, sorted(got))
    for lid in ("L0", "L1"):  # each island contributed to the restored syncer
        assert any(e["kind"] == "accepted" and e["data"]["learner"] == lid and e["t"] > t_back
                   for e in events), lid  # fmt: skip
    budget = settings["learners"] * settings["steps"] * settings["batch"] * settings["context"]
    assert sum(final["tokens"].values()) >= budget
    assert final["restarts"] == 1
    # the only refusals allowed: after the restart, a resumed island's first contributions
    # carry everything it trained while the syncer was down, and the magnitude guard (which
    # starts over in a restored syncer) may refuse them; that island heals and goes on. A push
    # that reaches the restored syncer before its island's session is back is refused as not
    # joined (the island keeps it and sends it again once it has rejoined)
    refused = [(e["t"], e["data"]["code"]) for e in events if e["kind"] == "refused"]
    assert all(t > t_back and code in ("magnitude", "not_joined") for t, code in refused), refused
    assert final["refused"] == len(refused)
    assert sum(e["data"]["count"] for e in events if e["kind"] == "auth_refused") == 1
    # the fragments crossed the shaped links: the syncer's link carried at least what its books
    # say it took in and sent, and each island's link carried traffic both ways
    delta = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before)]
    assert delta[0]["rx_bytes"] >= final["bytes_in"] and delta[0]["tx_bytes"] >= final["bytes_out"]
    assert all(d["tx_bytes"] > 0 and d["rx_bytes"] > 0 for d in delta[1:])


def test_hosts_remove_every_namespace_link_and_process_when_the_body_fails(netns, tmp_path):
    with pytest.raises(RuntimeError, match="on purpose"):
        # a prefix and subnet of its own: the other tests' hosts may be up at the same time
        with hosts.Hosts(tmp_path, learners=1, mbps=4.0, settings=SETTINGS, prefix="amr",
                         subnet="10.87") as h:  # fmt: skip
            names = [isl.name for isl in h.net.islands]
            assert hosts.leftovers("amr") != []
            syncer = h.start_syncer()
            raise RuntimeError("on purpose")
    assert syncer.poll() is not None  # ended (SIGTERM), not left running in a namespace
    assert hosts.leftovers("amr") == [], names


def test_one_island_over_two_hosts_is_one_learner(netns, tmp_path):
    """`torchrun --nnodes 2` with its c10d rendezvous across two namespaces (deploy/island.sh
    with NNODES, NODE_RANK, RDZV_ENDPOINT): one learner whose ranks are on two hosts, over
    TLS to the syncer on a third; it trains the whole budget as one learner."""
    settings = {**SETTINGS, "learners": 1, "steps": 150}
    with hosts.Hosts(tmp_path, learners=2, mbps=4.0, settings=settings, prefix="amn",
                     subnet="10.85") as h:  # fmt: skip
        h.start_syncer()
        h.wait_ready(120)
        for node in (0, 1):
            h.start_island_node(0, node, hosts=[0, 1])
        codes = h.wait_learners(240)
        assert h.stop_syncer() == 0, h.tail("syncer.log")
    assert codes == {0: 0, 1: 0}, (h.tail("L0-node0.log"), h.tail("L0-node1.log"))
    assert hosts.leftovers("amn") == []
    final = json.loads((h.run_dir / "syncer_final.json").read_text())
    events = read_events(h.run_dir / "events.jsonl")
    joined = [e["data"] for e in events if e["kind"] == "joined"]
    assert [j["learner"] for j in joined] == ["L0"], joined  # two hosts, one learner
    budget = settings["steps"] * settings["batch"] * settings["context"]
    # one incarnation of one learner trained the whole budget
    assert list(final["tokens"].values()) == [budget] and final["lost_committed_rounds"] == 0
    assert [k.split("/")[0] for k in final["tokens"]] == ["L0"], final
    assert final["rounds"] >= 20, final
