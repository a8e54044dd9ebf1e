"""Hosts as Linux network namespaces: the syncer and each learner island in a namespace of its
own, joined to the host by a tc-tbf shaped veth link (peer/netns.py), each started with the
deploy/ scripts (deploy/syncer.sh, deploy/island.sh) and the environment a real host gives
them: TLS with a certificate for the syncer's own address, the shared secret in a file, a fixed
port, one settings file for all. benchmarks/multihost.py and tests/e2e/test_multihost.py run
on it.

    with Hosts(root, learners=2, mbps=2.0, settings={"learners": 2, "steps": 100}) as h:
        h.start_syncer()
        h.wait_ready()
        for i in range(2):
            h.start_learner(i)
        h.wait_learners(timeout=300)
        h.stop_syncer()

Host 0 (namespace ``<prefix>0``, address ``<subnet>.0.2``) is the syncer; island i is host
i + 1. Learner-to-syncer traffic is routed by the host: a learner's upload crosses its own
link's upload shaper and the syncer link's download shaper. Files under ``root``: ``job.toml``
(the settings), ``secret``, ``tls/`` (certificate and key), ``syncer/`` (the syncer's run
directory), ``L<i>.events.jsonl`` and one log per process. Leaving the ``with`` (also on an
error) ends every process this object started, then removes every namespace, link and qdisc.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peer"))

from netns import Islands, leftovers, unavailable  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
PORT = 7070
RUN_ID = "multihost"
__all__ = ["Hosts", "leftovers", "self_signed", "unavailable", "write_toml"]


def self_signed(folder: Path, ips: list[str], dns: list[str] | None = None) -> tuple[str, str]:
    """A self-signed certificate (its own CA) for `ips` and `dns` names, and its key: PEM
    files in `folder` (what `atoll syncer --tls-cert/--tls-key` take; the certificate is also
    the learners' `--tls-ca`)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "atoll-syncer")])
    now = datetime.datetime.now(datetime.timezone.utc)
    alt = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    alt += [x509.DNSName(d) for d in dns or []]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.touch(mode=0o600)
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_file), str(key_file)


def write_toml(path: Path, settings: dict[str, object]) -> None:
    """Bare `key = value` lines (README: a settings file may hold bare keys)."""
    lines = []
    for k, v in settings.items():
        value = ("true" if v else "false") if isinstance(v, bool) else json.dumps(v)
        lines.append(f"{k} = {value}")
    path.write_text("\n".join(lines) + "\n")


class Hosts:
    """A syncer host and `learners` island hosts (module docstring)."""

    def __init__(
        self,
        root: Path,
        learners: int,
        mbps: float,
        settings: dict[str, object],
        syncer_mbps: float | None = None,
        prefix: str = "amh",
        subnet: str = "10.81",
    ) -> None:
        self.root, self.learners = Path(root), learners
        self.root.mkdir(parents=True, exist_ok=True)
        syncer_rate = learners * mbps if syncer_mbps is None else syncer_mbps
        self.net = Islands(1 + learners, [syncer_rate] + [mbps] * learners, prefix, subnet)
        self.prefix = prefix
        self.settings = dict(settings)
        self.syncer_proc: subprocess.Popen | None = None
        self.learner_procs: dict[int, subprocess.Popen] = {}
        self.samples: list[dict] = []  # link counters over time (sample_links)
        self._stop_sampling = threading.Event()
        self._sampler: threading.Thread | None = None
        self.secret = "multihost-secret-" + os.urandom(8).hex()
        self.cert, self.key = str(self.root / "tls/cert.pem"), str(self.root / "tls/key.pem")

    # -- addresses and files ------------------------------------------------------------------
    @property
    def syncer_ip(self) -> str:
        return self.net.islands[0].ns_ip

    @property
    def address(self) -> str:
        return f"{self.syncer_ip}:{PORT}"

    @property
    def run_dir(self) -> Path:
        return self.root / "syncer"

    def events_file(self, i: int) -> Path:
        return self.root / f"L{i}.events.jsonl"

    def __enter__(self) -> Hosts:
        self.net.__enter__()
        try:
            self_signed(self.root / "tls", [self.syncer_ip])  # self.cert, self.key
            secret_file = self.root / "secret"
            secret_file.touch(mode=0o600)
            secret_file.write_text(self.secret + "\n")
            write_toml(self.root / "job.toml", self.settings)
        except BaseException:
            self.net.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._stop_sampling.set()
            if self._sampler is not None:
                self._sampler.join(10)
            for p in [*self.learner_procs.values(), self.syncer_proc]:
                if p is not None:
                    _end(p)
        finally:
            self.net.__exit__(None, None, None)

    # -- processes, through the deploy scripts ------------------------------------------------
    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        """This machine's environment less any atoll or island variable, and the run's."""
        own = ("ATOLL", "NPROC", "NNODES", "NODE_RANK", "RDZV_ENDPOINT", "LOCAL_ADDR")
        env = {k: v for k, v in os.environ.items() if not k.startswith(own)}
        src = str(ROOT / "src")
        env["PYTHONPATH"] = os.pathsep.join(x for x in (src, env.get("PYTHONPATH")) if x)
        env.update(
            ATOLL=f"{sys.executable} -m atoll.cli",
            ATOLL_RUN_ID=RUN_ID,
            ATOLL_SECRET_FILE=str(self.root / "secret"),
            ATOLL_CONFIG=str(self.root / "job.toml"),
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
        )
        env.update(extra)
        return env

    def _start(self, host: int, script: str, log: str, env: dict[str, str]) -> subprocess.Popen:
        argv = self.net.islands[host].wrap(["bash", str(DEPLOY / script)])
        with open(self.root / log, "a") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)  # fmt: skip

    def syncer_env(self) -> dict[str, str]:
        return self._env({
            "ATOLL_RUN_DIR": str(self.run_dir), "ATOLL_PORT": str(PORT),
            "ATOLL_TLS_CERT": self.cert, "ATOLL_TLS_KEY": self.key,
        })  # fmt: skip

    def learner_env(self, i: int, nproc: int | None = None) -> dict[str, str]:
        """Island i's environment; `nproc`: a torchrun island of that many ranks."""
        env = {"ATOLL_SYNCER": self.address, "ATOLL_ISLAND": str(i), "ATOLL_TLS_CA": self.cert,
               "ATOLL_EVENTS": str(self.events_file(i))}  # fmt: skip
        if nproc is not None:
            env["NPROC"] = str(nproc)
        return self._env(env)

    def start_syncer(self) -> subprocess.Popen:
        """deploy/syncer.sh in host 0 (again after a kill: it resumes from its run directory)."""
        (self.run_dir / "syncer.addr").unlink(missing_ok=True)
        self.syncer_proc = self._start(0, "syncer.sh", "syncer.log", self.syncer_env())
        return self.syncer_proc

    def start_learner(self, i: int, nproc: int | None = None) -> subprocess.Popen:
        """deploy/island.sh for island i in host i + 1."""
        env = self.learner_env(i, nproc)
        self.learner_procs[i] = self._start(i + 1, "island.sh", f"L{i}.log", env)
        return self.learner_procs[i]

    def start_island_node(self, i: int, node: int, hosts: list[int], nproc: int = 1,
                          rdzv_port: int = 29400) -> subprocess.Popen:  # fmt: skip
        """deploy/island.sh for node `node` of island i, an island over len(hosts) hosts (island
        host numbers, 0-based as in `start_learner`): torchrun's c10d rendezvous on the first
        host, gloo over each host's own link (GLOO_SOCKET_IFNAME, as on a multi-NIC node)."""
        first = self.net.islands[hosts[0] + 1]
        here = self.net.islands[hosts[node] + 1]
        env = self.learner_env(i, nproc)
        env.update(NNODES=str(len(hosts)), NODE_RANK=str(node), GLOO_SOCKET_IFNAME=here.ns_if,
                   RDZV_ENDPOINT=f"{first.ns_ip}:{rdzv_port}", LOCAL_ADDR=here.ns_ip)  # fmt: skip
        proc = self._start(hosts[node] + 1, "island.sh", f"L{i}-node{node}.log", env)
        self.learner_procs[100 * i + node] = proc
        return proc

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until the syncer answers Status over TLS from the host (through its link)."""
        from atoll.live.client import wait_ready

        p = self.syncer_proc
        assert p is not None, "start_syncer first"
        if wait_ready(self.address, RUN_ID, self.secret, timeout, self.cert,
                      alive=lambda: p.poll() is None) is None:  # fmt: skip
            raise RuntimeError(f"the syncer exited ({p.returncode}): {self.tail('syncer.log')}")

    def status(self, timeout: float = 5.0):  # noqa: ANN201 - atoll_pb2.StatusReply
        from atoll.live.client import status

        return status(self.address, RUN_ID, self.secret, timeout, self.cert)

    def wait_learners(self, timeout: float) -> dict[int, int]:
        """Until every learner process has ended; their exit codes. Raises past `timeout`."""
        until = time.time() + timeout
        for i, p in self.learner_procs.items():
            try:
                p.wait(max(until - time.time(), 0.1))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"L{i} still running after {timeout} s: "
                                   f"{self.tail(f'L{i}.log')}") from None  # fmt: skip
        return {i: p.returncode for i, p in self.learner_procs.items()}

    def stop_syncer(self, timeout: float = 60.0) -> int:
        """SIGTERM: the syncer writes its final model and books (syncer_final.json)."""
        p = self.syncer_proc
        assert p is not None
        p.send_signal(signal.SIGTERM)
        return p.wait(timeout)

    def kill_syncer(self) -> None:
        """SIGKILL, as a node that dies: what it had taped is all that survives."""
        p = self.syncer_proc
        assert p is not None
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)

    def tail(self, log: str, n: int = 2000) -> str:
        path = self.root / log
        return path.read_text()[-n:] if path.exists() else "(no log)"

    # -- the links ----------------------------------------------------------------------------
    def counters(self) -> list[dict[str, int]]:
        """Frame bytes and frames each host sent (tx) and received (rx) on its link, and its
        TCP segments sent, retransmitted and received: syncer first."""
        return [{**isl.counters(), **isl.tcp_counters()} for isl in self.net.islands]

    def sample_links(self, every_s: float = 1.0) -> None:
        """Record every host's counters every `every_s` in `samples` (a thread), until exit."""

        def run() -> None:
            while not self._stop_sampling.is_set():
                try:
                    self.samples.append({"t": time.time(), "hosts": self.counters()})
                except (RuntimeError, json.JSONDecodeError, IndexError,
                        subprocess.CalledProcessError, ValueError):  # fmt: skip
                    return  # the namespaces are going away
                self._stop_sampling.wait(every_s)

        self._sampler = threading.Thread(target=run, name="link-sampler", daemon=True)
        self._sampler.start()


def _end(p: subprocess.Popen, grace_s: float = 10.0) -> None:
    """End a process group this module started: SIGTERM, then SIGKILL after `grace_s`."""
    if p.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
