"""deploy/: every file parses, the Kubernetes objects fit together (kinds, volumes, ports,
secret references), the sbatch's #SBATCH lines are options Slurm takes, and every command
they run is a deploy/ script whose atoll flags exist in `atoll syncer --help` / `atoll learner
--help` (the parsers themselves, in this process). The scripts are run (bash -n, and with
ATOLL_DRY_RUN on the environment these files give them) in tests/integration/test_deploy_scripts.py;
tests/e2e/test_multihost.py runs the same scripts in network namespaces."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
import yaml

from atoll.cli import build_parser
from atoll.config import load_job

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# flags island.sh passes only for an island of several processes or nodes (torchrun)
ISLAND_FLAGS = {"--nproc", "--nnodes", "--node-rank", "--rdzv-endpoint"}


def docs(name: str) -> dict[str, dict]:
    """The objects of deploy/k8s/<name>, by kind (each kind once per file)."""
    objs = list(yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()))
    kinds = [o["kind"] for o in objs]
    assert len(set(kinds)) == len(kinds), kinds
    return {o["kind"]: o for o in objs}


def container(obj: dict) -> tuple[dict, dict]:
    """(the one container, the pod spec) of a Job."""
    pod = obj["spec"]["template"]["spec"]
    assert len(pod["containers"]) == 1
    return pod["containers"][0], pod


def env_of(c: dict) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def mounts(c: dict, pod: dict) -> dict[str, dict]:
    """mount path -> the volume mounted there."""
    vols = {v["name"]: v for v in pod["volumes"]}
    return {m["mountPath"]: vols[m["name"]] for m in c["volumeMounts"]}


def mounted_from(path: str, c: dict, pod: dict) -> dict:
    """The volume a path lies in: the one mounted on its longest leading directory."""
    under = [m for m in mounts(c, pod) if Path(m) in Path(path).parents]
    assert under, f"{path} is on no volume"
    return mounts(c, pod)[max(under, key=len)]


def script_of(c: dict) -> str:
    """The deploy script a container runs: `bash /opt/atoll/deploy/<script>`."""
    cmd = c["command"]
    assert cmd[0] == "bash" and len(cmd) == 2 and cmd[1].startswith("/opt/atoll/deploy/"), cmd
    return Path(cmd[1]).name


def script_vars(*names: str) -> set[str]:
    """The environment variables deploy scripts read."""
    text = "\n".join((DEPLOY / n).read_text() for n in (*names, "lib.sh"))
    return set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", text))


def script_flags(name: str) -> tuple[str, set[str]]:
    """(the atoll subcommand, the flags) that the `args` arrays of deploy/<name> and
    deploy/lib.sh hold."""
    words: list[str] = []
    for n in (name, "lib.sh"):
        for m in re.finditer(r"^\s*args\+?=\((.*?)\)\s*$", (DEPLOY / n).read_text(), re.M):
            words += shlex.split(m.group(1))
    start = re.search(r"^args=\((\w+)", (DEPLOY / name).read_text(), re.M)
    assert start, name
    return start.group(1), {w for w in words if w.startswith("--")}


def options(command: str) -> set[str]:
    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {o for a in sub.choices[command]._actions for o in a.option_strings}


# -- the scripts and the atoll parsers ---------------------------------------------------------
@pytest.mark.parametrize(("script", "command"), [("syncer.sh", "syncer"), ("island.sh", "learner")])
def test_each_script_runs_its_atoll_command_with_flags_the_parser_has(script, command):
    sub, flags = script_flags(script)
    assert sub == command
    assert {"--run-id", "--secret-file", "--set"} <= flags  # lib.sh's
    missing = flags - options(command)
    assert not missing, f"deploy/{script} passes {sorted(missing)}, unknown to atoll {command}"


def test_island_flags_are_the_learners():
    _, flags = script_flags("island.sh")
    assert ISLAND_FLAGS <= flags
    assert ISLAND_FLAGS <= options("learner")


def test_the_syncer_flags_the_script_sets_are_its_own():
    _, flags = script_flags("syncer.sh")
    assert {"--run-dir", "--tls-cert", "--tls-key", "--init", "--no-budget"} <= flags
    assert {"--serve-after-budget", "--shards", "--shard"} <= flags


# -- Kubernetes -------------------------------------------------------------------------------
def test_syncer_manifest_is_a_config_a_volume_one_syncer_and_its_service():
    d = docs("syncer.yaml")
    assert set(d) == {"ConfigMap", "PersistentVolumeClaim", "Job", "Service"}
    dep, svc, pvc = d["Job"], d["Service"], d["PersistentVolumeClaim"]
    # one syncer; its exit says what follows: 0, the run is over (the Job is complete, nothing
    # restarts it); non-zero, a failure: a new pod resumes from the tape; EXIT_STORE (a state
    # on disk it cannot restore) fails the Job at once
    from atoll.errors import EXIT_STORE

    assert dep["spec"]["completions"] == dep["spec"]["parallelism"] == 1
    c, pod = container(dep)
    assert pod["restartPolicy"] == "Never" and dep["spec"]["backoffLimit"] >= 10
    (rule,) = dep["spec"]["podFailurePolicy"]["rules"]
    codes = rule["onExitCodes"]
    assert rule["action"] == "FailJob" and codes["values"] == [EXIT_STORE]
    assert codes["operator"] == "In" and codes["containerName"] == c["name"]
    assert script_of(c) == "syncer.sh"
    env = env_of(c)
    assert set(env) <= script_vars("syncer.sh"), set(env) - script_vars("syncer.sh")
    # the tape and snapshots on the claim
    data = mounted_from(env["ATOLL_RUN_DIR"], c, pod)
    assert data["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    # the secret, the certificate and key, the settings: files from a Secret / ConfigMap
    assert mounted_from(env["ATOLL_SECRET_FILE"], c, pod)["secret"]["secretName"] == "atoll-secret"
    for key in ("ATOLL_TLS_CERT", "ATOLL_TLS_KEY"):
        assert mounted_from(env[key], c, pod)["secret"]["secretName"] == "atoll-tls"
    assert Path(env["ATOLL_TLS_CERT"]).name == "tls.crt"  # a kubernetes.io/tls Secret's keys
    assert Path(env["ATOLL_TLS_KEY"]).name == "tls.key"
    cfg = mounted_from(env["ATOLL_CONFIG"], c, pod)["configMap"]["name"]
    assert cfg == d["ConfigMap"]["metadata"]["name"]
    assert Path(env["ATOLL_CONFIG"]).name in d["ConfigMap"]["data"]
    assert mounts(c, pod)["/opt/atoll/deploy"]["configMap"]["name"] == "atoll-deploy"
    # the port: the script's, the container's, the Service's
    (port,) = c["ports"]
    assert port["containerPort"] == int(env["ATOLL_PORT"]) and port["name"] == "grpc"
    (sport,) = svc["spec"]["ports"]
    assert sport["targetPort"] in ("grpc", port["containerPort"])
    assert svc["spec"]["selector"].items() <= pod_labels(dep).items()
    assert "ATOLL_SERVE_AFTER_BUDGET" not in env and "ATOLL_NO_BUDGET" not in env  # it ends


def pod_labels(obj: dict) -> dict:
    return obj["spec"]["template"]["metadata"]["labels"]


def test_the_settings_in_the_config_map_are_a_valid_job(tmp_path):
    data = docs("syncer.yaml")["ConfigMap"]["data"]
    (name,) = data
    path = tmp_path / name
    path.write_text(data[name])
    job = load_job([], path)
    assert job.sim.learners >= 1 and job.sim.steps >= 1


def test_island_job_is_an_indexed_job_of_nnodes_pods_with_their_rendezvous_service():
    syncer, island = docs("syncer.yaml"), docs("island-job.yaml")
    assert set(island) == {"Service", "Job"}
    job, rdzv = island["Job"], island["Service"]
    spec = job["spec"]
    c, pod = container(job)
    assert script_of(c) == "island.sh"
    env = env_of(c)
    assert set(env) <= script_vars("island.sh"), set(env) - script_vars("island.sh")
    # NNODES pods, one per node; NPROC ranks each, one per GPU
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == int(env["NNODES"])
    assert int(env["NPROC"]) == c["resources"]["limits"]["nvidia.com/gpu"]
    index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env["NODE_RANK"]["fieldRef"]["fieldPath"] == index
    # the island's index from its label, within the run's learners
    field = env["ATOLL_ISLAND"]["fieldRef"]["fieldPath"]
    label = re.fullmatch(r"metadata\.labels\['(.+)'\]", field)
    island_index = int(pod_labels(job)[label.group(1)])
    toml = next(iter(syncer["ConfigMap"]["data"].values()))
    learners = int(re.search(r"^learners = (\d+)", toml, re.M).group(1))
    assert 0 <= island_index < learners
    # the rendezvous on pod 0, found through the headless Service that is the pods' subdomain
    host, port = env["RDZV_ENDPOINT"].rsplit(":", 1)
    assert host == f"{job['metadata']['name']}-0.{pod['subdomain']}"
    assert rdzv["metadata"]["name"] == pod["subdomain"] and rdzv["spec"]["clusterIP"] == "None"
    assert rdzv["spec"]["selector"].items() <= pod_labels(job).items()
    assert [p["port"] for p in rdzv["spec"]["ports"]] == [int(port)]
    assert [p["containerPort"] for p in c["ports"]] == [int(port)]
    # the syncer: its Service's name and port, the same run id, secret and settings
    s_svc, s_dep = syncer["Service"], syncer["Job"]
    (s_port,) = s_svc["spec"]["ports"]
    assert env["ATOLL_SYNCER"] == f"{s_svc['metadata']['name']}:{s_port['port']}"
    s_env = env_of(container(s_dep)[0])
    assert env["ATOLL_RUN_ID"] == s_env["ATOLL_RUN_ID"]
    assert mounted_from(env["ATOLL_SECRET_FILE"], c, pod)["secret"]["secretName"] == "atoll-secret"
    ca = mounted_from(env["ATOLL_TLS_CA"], c, pod)
    assert "secret" in ca or "configMap" in ca  # the certificate only, never the syncer's key
    assert ca.get("secret", {}).get("secretName") != "atoll-tls"
    assert mounted_from(env["ATOLL_CONFIG"], c, pod)["configMap"]["name"] == "atoll-config"
    assert mounts(c, pod)["/opt/atoll/deploy"]["configMap"]["name"] == "atoll-deploy"
    assert pod["restartPolicy"] in ("OnFailure", "Never")


# -- Slurm ------------------------------------------------------------------------------------
SBATCH = DEPLOY / "slurm" / "island.sbatch"


def sbatch_options() -> tuple[list[str], list[str]]:
    """(the #SBATCH options Slurm reads: those before the first command, the script's body
    lines). Slurm ignores #SBATCH lines after the first command; there must be none."""
    lines = SBATCH.read_text().splitlines()
    assert lines[0].startswith("#!")
    head, body = [], []
    for line in lines[1:]:
        if body or not (line.startswith("#") or not line.strip()):
            body.append(line)
        elif line.startswith("#SBATCH"):
            head += shlex.split(line[len("#SBATCH") :])
    assert not [x for x in body if x.lstrip().startswith("#SBATCH")], "an #SBATCH after a command"
    return head, body


def test_sbatch_lines_parse_as_slurm_options():
    p = argparse.ArgumentParser(prog="sbatch", exit_on_error=False)
    p.add_argument("--job-name", required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--ntasks-per-node", type=int, required=True)
    p.add_argument("--gpus-per-node", type=int)
    p.add_argument("--cpus-per-task", type=int)
    p.add_argument("--time", required=True)
    p.add_argument("--requeue", action="store_true")
    p.add_argument("--output")
    head, _ = sbatch_options()
    assert all(re.fullmatch(r"--[a-z-]+=\S+|--[a-z-]+", h) for h in head), head
    opts = p.parse_args(head)  # an unknown option raises
    assert opts.nodes >= 1 and opts.ntasks_per_node == 1  # island.sh once per node
    assert re.fullmatch(r"(\d+-)?\d{1,2}:\d{2}:\d{2}", opts.time), opts.time


def test_sbatch_runs_island_sh_on_every_node_with_the_island_variables():
    _, body = sbatch_options()
    text = "\n".join(x for x in body if not x.lstrip().startswith("#"))
    assert "export NNODES=$SLURM_JOB_NUM_NODES" in text
    for var in ("NPROC", "RDZV_ENDPOINT"):
        assert re.search(rf"^export {var}=", text, re.M), var
    (srun,) = [x.strip() for x in text.splitlines() if x.strip().startswith("srun ")]
    assert "NODE_RANK=$SLURM_NODEID" in srun and srun.startswith("srun --kill-on-bad-exit=1 ")
    assert srun.endswith('"$deploy/island.sh" || rc=$?')  # its exit decides a restart
    assert {"NNODES", "NPROC", "NODE_RANK", "RDZV_ENDPOINT"} <= script_vars("island.sh")
