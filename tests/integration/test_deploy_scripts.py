"""The deploy/ scripts run: `bash -n` on each, and each with ATOLL_DRY_RUN=1 (it prints the atoll
arguments it would exec) on the environment that deploy/k8s, deploy/slurm and the namespace
harness (benchmarks/hosts.py, run by tests/e2e/test_multihost.py) give it; the arguments are
parsed by `atoll syncer` / `atoll learner`'s own parsers in this process. So the command a
Kubernetes container or a Slurm node runs is the one the namespace test runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from atoll.cli import build_parser
from atoll.config import load_job

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
ISLAND_FLAGS = ("--nproc", "--nnodes", "--node-rank", "--rdzv-endpoint")

sys.path.insert(0, str(ROOT / "benchmarks"))

import hosts  # noqa: E402


def dry_run(script: Path, env: dict[str, str]) -> list[str]:
    """The atoll arguments `script` would exec with `env` (nothing else of this machine's)."""
    base = {"PATH": os.environ["PATH"], "ATOLL_DRY_RUN": "1"}
    p = subprocess.run(["bash", str(script)], env={**base, **env}, capture_output=True,
                       timeout=30)  # fmt: skip
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout.decode().rstrip("\0").split("\0")


def parse(argv: list[str]):  # noqa: ANN201 - argparse.Namespace
    """`atoll <argv>` through the real parser (an unknown flag fails it)."""
    return build_parser(argv[0]).parse_args(argv)


def _sub(command: str):  # noqa: ANN202
    import argparse

    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def flag_value(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


def k8s_env(name: str, kind: str, tmp_path: Path, field_values: dict[str, str]) -> dict[str, str]:
    """The container's environment from deploy/k8s/<name>: files under /etc/atoll and
    /var/lib/atoll laid out in tmp_path (the settings file from the ConfigMap), fieldRefs
    resolved from `field_values`."""
    objs = {o["kind"]: o for o in yaml.safe_load_all((DEPLOY / "k8s" / name).read_text())}
    (c,) = objs[kind]["spec"]["template"]["spec"]["containers"]
    config = next(iter(yaml.safe_load_all((DEPLOY / "k8s" / "syncer.yaml").read_text())))
    env = {}
    for e in c["env"]:
        if "valueFrom" in e:
            env[e["name"]] = field_values[e["valueFrom"]["fieldRef"]["fieldPath"]]
            continue
        v = e["value"]
        if v.startswith(("/etc/atoll/", "/var/lib/atoll/")):
            path = tmp_path / v.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            if v.endswith("job.toml"):
                path.write_text(config["data"]["job.toml"])
            elif not v.startswith("/var/lib"):
                path.write_text("secret-0123456789\n")
            v = str(path)
        env[e["name"]] = v
    return env


@pytest.mark.parametrize("path", [*sorted(DEPLOY.glob("*.sh")), DEPLOY / "slurm/island.sbatch"])
def test_scripts_parse(path):
    p = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr


def test_k8s_syncer_container_runs_atoll_syncer_on_its_port_with_tls_and_the_secret_file(
    tmp_path,
):
    env = k8s_env("syncer.yaml", "Job", tmp_path, {})
    argv = dry_run(DEPLOY / "syncer.sh", env)
    args = parse(argv)
    assert args.command == "syncer" and args.run_id == "atoll-run"
    assert args.secret_file == env["ATOLL_SECRET_FILE"] and args.config == env["ATOLL_CONFIG"]
    assert (args.tls_cert, args.tls_key) == (env["ATOLL_TLS_CERT"], env["ATOLL_TLS_KEY"])
    assert str(args.run_dir) == env["ATOLL_RUN_DIR"]
    job = load_job(args.overrides, args.config)
    assert (job.live.host, job.live.port) == ("0.0.0.0", 7070)  # the Service's target
    assert not args.serve_after_budget and not args.no_budget  # it ends: the Job completes


def test_syncer_sh_serves_after_the_budget_or_runs_a_whole_shard_set_when_asked(tmp_path):
    env = {"ATOLL_RUN_ID": "r", "ATOLL_RUN_DIR": str(tmp_path), "ATOLL_SECRET": "secret-0123456789"}
    args = parse(dry_run(DEPLOY / "syncer.sh", {**env, "ATOLL_SERVE_AFTER_BUDGET": "1"}))
    assert args.serve_after_budget and args.shards is None
    args = parse(dry_run(DEPLOY / "syncer.sh", {**env, "ATOLL_SHARDS": "2"}))
    assert args.shards == 2 and not args.serve_after_budget
    base = {"PATH": os.environ["PATH"], **env, "ATOLL_SHARDS": "2", "ATOLL_SHARD": "0/2"}
    p = subprocess.run(["bash", str(DEPLOY / "syncer.sh")], env=base, capture_output=True,
                       text=True, timeout=30)  # fmt: skip
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "ATOLL_SHARDS='2'" in p.stderr


def test_island_sh_waits_for_the_syncers_address_file(tmp_path):
    """ATOLL_SYNCER_FILE: the island starts once the syncer (a shard set: every shard) listens
    and has written RUN_DIR/syncer.addr, never with an empty address; a file that never comes
    stops it with one line after ATOLL_WAIT_S."""
    addr = tmp_path / "syncer.addr"
    env = {"ATOLL_RUN_ID": "r", "ATOLL_SECRET": "secret-0123456789", "ATOLL_ISLAND": "0",
           "ATOLL_SYNCER_FILE": str(addr), "ATOLL_WAIT_S": "30"}  # fmt: skip
    base = {"PATH": os.environ["PATH"], "ATOLL_DRY_RUN": "1", **env}
    p = subprocess.Popen(["bash", str(DEPLOY / "island.sh")], env=base, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)  # fmt: skip
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(1.0)  # waiting: no address yet
        tmp = tmp_path / "syncer.addr.tmp"  # as the syncer writes it: whole, then renamed
        tmp.write_text("10.0.0.2:7070,10.0.0.2:7071")
        tmp.replace(addr)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err.decode()
    args = parse(out.decode().rstrip("\0").split("\0"))
    assert args.syncer == "10.0.0.2:7070,10.0.0.2:7071"
    never = {**base, "ATOLL_SYNCER_FILE": str(tmp_path / "never"), "ATOLL_WAIT_S": "1"}
    p2 = subprocess.run(["bash", str(DEPLOY / "island.sh")], env=never, capture_output=True,
                        text=True, timeout=30)  # fmt: skip
    assert p2.returncode == 2 and p2.stderr.count("\n") == 1, p2.stderr
    assert "ATOLL_SYNCER_FILE=" in p2.stderr and "within 1 s" in p2.stderr


def test_k8s_island_pod_runs_a_torchrun_island_with_its_node_rank(tmp_path):
    fields = {"metadata.labels['atoll.dev/island']": "0",
              "metadata.annotations['batch.kubernetes.io/job-completion-index']": "1"}  # fmt: skip
    env = k8s_env("island-job.yaml", "Job", tmp_path, fields)
    argv = dry_run(DEPLOY / "island.sh", env)
    assert [flag_value(argv, f) for f in ISLAND_FLAGS] == [
        "8", "2", "1", "atoll-island-0-0.atoll-island-0:29400",
    ]  # fmt: skip
    args = parse(argv)
    assert (args.command, args.syncer, args.index) == ("learner", "atoll-syncer:7070", 0)
    assert args.tls_ca == env["ATOLL_TLS_CA"] and args.secret_file == env["ATOLL_SECRET_FILE"]
    assert load_job(args.overrides, args.config).sim.learners >= 1


def run_sbatch(tmp_path: Path, exits: str = "", **extra: str) -> subprocess.CompletedProcess:
    """The sbatch's body with stand-ins for Slurm's srun (one task per node, SLURM_NODEID set;
    its n-th call exits with the n-th code in `exits`, after the tasks ran: 0 past the list;
    each call is appended to calls.log) and scontrol (the node list)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'gpu-a\\ngpu-b\\n'\n")
    (bin_dir / "srun").write_text(
        '#!/usr/bin/env bash\necho "$*" >> "$TASK_OUT/calls.log"\n'
        "while [[ $1 == --* ]]; do shift; done\n"
        "for ((i = 0; i < SLURM_JOB_NUM_NODES; i++)); do\n"
        '  SLURM_NODEID=$i "$@" > "$TASK_OUT/task-$i" || exit $?\ndone\n'
        'codes=($EXITS); n=$(wc -l < "$TASK_OUT/calls.log")\n'
        "exit ${codes[n - 1]:-0}\n"
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    secret = tmp_path / "secret"
    secret.write_text("secret-0123456789\n")
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}", "ATOLL_DRY_RUN": "1", "TASK_OUT": str(tmp_path),
        "SLURM_JOB_NODELIST": "gpu-[a-b]", "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "8",
        "SLURM_SUBMIT_DIR": str(ROOT), "ATOLL_ISLAND": "3", "ATOLL_SYNCER": "syncer.example:7070",
        "ATOLL_RUN_ID": "run1", "ATOLL_SECRET_FILE": str(secret), "EXITS": exits, **extra,
    }  # fmt: skip
    return subprocess.run(["bash", str(DEPLOY / "slurm/island.sbatch")], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_sbatch_runs_island_sh_once_per_node_with_slurm_s_node_rank(tmp_path):
    p = run_sbatch(tmp_path)
    assert p.returncode == 0, p.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("--kill-on-bad-exit=1 "), calls
    for rank in (0, 1):
        argv = (tmp_path / f"task-{rank}").read_text().rstrip("\0").split("\0")
        assert [flag_value(argv, f) for f in ISLAND_FLAGS] == ["8", "2", str(rank), "gpu-a:29400"]
        args = parse(argv)
        assert (args.syncer, args.index, args.run_id) == ("syncer.example:7070", 3, "run1")
        assert args.max_restarts == 3  # torchrun in place, then `atoll island`, on each node


@pytest.mark.parametrize(
    ("exits", "restarts", "calls", "rc"),
    [
        ("1 137 0", "10", 3, 0),  # a failed island runs again until it ends well
        ("1 2", "10", 2, 2),  # a bad setting (exit 2) is not restarted
        ("1 1 1", "1", 2, 1),  # ATOLL_RESTARTS restarts at most
    ],
)
def test_sbatch_starts_the_whole_island_again_when_srun_fails(tmp_path, exits, restarts, calls, rc):
    p = run_sbatch(tmp_path, exits, ATOLL_RESTARTS=restarts, ATOLL_BACKOFF="0")
    assert p.returncode == rc, p.stderr
    assert len((tmp_path / "calls.log").read_text().splitlines()) == calls
    assert p.stderr.count("island.sbatch: srun exited") == calls - 1, p.stderr


def test_sbatch_refuses_a_bad_restart_count_with_one_line(tmp_path):
    p = run_sbatch(tmp_path, ATOLL_RESTARTS="many")
    assert p.returncode == 2 and not (tmp_path / "calls.log").exists()
    assert p.stderr == "island.sbatch: ATOLL_RESTARTS='many' is not allowed: an integer >= 0\n"


def test_the_namespace_harness_runs_the_same_commands_as_the_k8s_containers(tmp_path):
    """benchmarks/hosts.py (the e2e test's and the benchmark's hosts) and the manifests set
    the same flags; the harness adds only --events (its islands' logs) and leaves out the
    island flags (single-process islands, unless given nproc)."""
    h = hosts.Hosts(tmp_path / "h", learners=1, mbps=1.0, settings={"learners": 1})
    (tmp_path / "h/tls").mkdir()
    for f in (h.cert, h.key, tmp_path / "h/secret", tmp_path / "h/job.toml"):
        Path(f).write_text("learners = 1\n")

    def flags(argv: list[str]) -> set[str]:
        return {a for a in argv if a.startswith("--")}

    k8s_syncer = dry_run(DEPLOY / "syncer.sh", k8s_env("syncer.yaml", "Job", tmp_path, {}))
    ns_syncer = dry_run(DEPLOY / "syncer.sh", h.syncer_env())
    assert ns_syncer[0] == k8s_syncer[0] == "syncer" and flags(ns_syncer) == flags(k8s_syncer)
    fields = {"metadata.labels['atoll.dev/island']": "0",
              "metadata.annotations['batch.kubernetes.io/job-completion-index']": "0"}  # fmt: skip
    k8s_island = dry_run(DEPLOY / "island.sh", k8s_env("island-job.yaml", "Job", tmp_path, fields))
    ns_island = dry_run(DEPLOY / "island.sh", h.learner_env(0))
    assert flags(ns_island) == flags(k8s_island) - set(ISLAND_FLAGS) | {"--events"}
    ns_torchrun = dry_run(DEPLOY / "island.sh", h.learner_env(0, nproc=2))
    assert flag_value(ns_torchrun, "--nproc") == "2"
    parse(ns_island)
    parse(ns_syncer)


@pytest.mark.parametrize(
    ("script", "drop", "says"),
    [
        ("syncer.sh", "ATOLL_RUN_ID", "ATOLL_RUN_ID='' is not allowed"),
        ("syncer.sh", "ATOLL_RUN_DIR", "ATOLL_RUN_DIR='' is not allowed"),
        ("syncer.sh", "ATOLL_SECRET", "no secret: set ATOLL_SECRET_FILE"),
        ("island.sh", "ATOLL_SYNCER", "ATOLL_SYNCER='' is not allowed"),
        ("island.sh", "ATOLL_ISLAND", "ATOLL_ISLAND='' is not allowed"),
    ],
)
def test_a_missing_setting_stops_the_script_with_one_line_naming_it(script, drop, says):
    env = {"ATOLL_RUN_ID": "r", "ATOLL_RUN_DIR": "/tmp/x", "ATOLL_SECRET": "secret-0123456789",
           "ATOLL_SYNCER": "h:7070", "ATOLL_ISLAND": "0", "PATH": os.environ["PATH"]}  # fmt: skip
    del env[drop]
    p = subprocess.run(["bash", str(DEPLOY / script)], env=env, capture_output=True, text=True,
                       timeout=30)  # fmt: skip
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and says in p.stderr, p.stderr


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"NPROC": "0"}, "NPROC='0' is not allowed: an integer >= 1"),
        ({"NNODES": "2", "RDZV_ENDPOINT": "a:1"}, "NODE_RANK='' is not allowed"),
        ({"NNODES": "2", "NODE_RANK": "2", "RDZV_ENDPOINT": "a:1"}, "NODE_RANK='2'"),
        ({"NNODES": "2", "NODE_RANK": "0"}, "RDZV_ENDPOINT='' is not allowed"),
        ({"ATOLL_SET": "steps"}, "ATOLL_SET entry 'steps' is not allowed: key=value"),
        ({"NPROC": "2", "ATOLL_MAX_RESTARTS": "-1"}, "ATOLL_MAX_RESTARTS='-1' is not allowed"),
    ],
)
def test_bad_island_variables_stop_with_one_line(extra, says):
    env = {"ATOLL_RUN_ID": "r", "ATOLL_SECRET": "secret-0123456789", "ATOLL_SYNCER": "h:7070",
           "ATOLL_ISLAND": "0", "PATH": os.environ["PATH"], **extra}  # fmt: skip
    p = subprocess.run(["bash", str(DEPLOY / "island.sh")], env=env, capture_output=True,
                       text=True, timeout=30)  # fmt: skip
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and says in p.stderr, p.stderr
