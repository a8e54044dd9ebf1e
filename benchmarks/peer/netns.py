"""Per-learner Linux network namespaces with a tc-tbf shaped veth link to the host.

    with Islands(2, mbps=5) as isl:                 # island i = namespace "apb<i>"
        subprocess.Popen(isl.islands[0].wrap([sys.executable, "learner.py"]))
        ...
        print(isl.totals())                         # bytes the learners sent / received

Island i is namespace ``<prefix><i>``, joined to the host by a veth pair ``<prefix><i>h`` (host
end, ``<subnet>.<i>.1/24``) <-> ``<prefix><i>n`` (namespace end, ``<subnet>.<i>.2/24``). A tbf
qdisc at ``mbps`` sits on the egress of both ends: the namespace end shapes the learner's upload,
the host end its download (``mbps=0``: unshaped). Learner-to-learner traffic is routed by the
host, so it crosses the sender's upload and the receiver's download shaper.

Choices that differ from a plain "default route + net.ipv4.ip_forward=1" setup:

* Each namespace routes only ``<subnet>.0.0/16`` via its host end (no default route): a learner
  reaches the host veth ends and the other islands, and anything else fails at once with
  "Network is unreachable" instead of leaking out of the host's uplink.
* Forwarding is enabled per interface (``net.ipv4.conf.<host_if>.forwarding=1``). IPv4 decides
  forwarding by the ingress device, so only packets out of an island are forwarded; the global
  ``ip_forward`` is never touched, nothing needs restoring, the setting dies with the interface.
  A firewall FORWARD chain dropping routed traffic (e.g. Docker's) would still block islands from
  each other: ``__enter__`` probes island 0 -> island n-1 with a TCP connect and raises if so.
* Counters are the namespace end's ``tx_bytes``/``rx_bytes``: whole Ethernet frames (Ethernet
  + IP + TCP headers), what the learner put on / took off its link. ``frame_counters=True``
  (default) sets ``gso_max_segs 1`` on both veth ends so TCP hands the device one segment per
  packet; otherwise a GSO super-packet counts its headers once and overhead is under-stated.

tbf: ``burst`` = max(32 KiB, 4 ms of traffic) unless ``burst_kb`` is given; 4 ms is one jiffy at
HZ=250, the floor keeps ~20 full frames of credit so TCP is not starved at low rates. The queue
holds ``latency_ms`` (50) of traffic: limit = rate * latency + burst. Overflow drops at a local
sender's own link are seen by TCP before the wire (it backs off, nothing is retransmitted); on a
forwarded island-to-island path whose download is slower than the upload they are real losses.

Use a distinct ``prefix`` and ``subnet`` per concurrent run: ``__enter__`` first deletes any
namespace ``<prefix><digits>`` and link ``<prefix><digits>h`` left by a crashed run. A process
still running in a namespace keeps it alive (without its veth) after ``__exit__``: stop it first.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass


def _run(cmd: str, check: bool = True) -> str:
    """Run a whitespace-separated command line (our names and addresses have no spaces)."""
    p = subprocess.run(cmd.split(), capture_output=True, text=True)
    if check and p.returncode:
        raise RuntimeError(f"`{cmd}` failed: {p.stderr.strip() or p.returncode}")
    return p.stdout


def _reachable(ns: str, ip: str, port: int = 9) -> bool:
    """TCP connect from namespace ``ns`` to ``ip``; a refusal (an RST came back) counts as yes."""
    code = (
        "import socket,sys\ntry: socket.create_connection((sys.argv[1], int(sys.argv[2])), 2)\n"
        "except ConnectionRefusedError: pass\nexcept OSError: sys.exit(1)"
    )
    cmd = ["ip", "netns", "exec", ns, sys.executable, "-c", code, ip, str(port)]
    return subprocess.run(cmd, capture_output=True).returncode == 0


def _tbf(mbps: float, burst_kb: float | None, latency_ms: float) -> str:
    rate = mbps * 1e6 / 8  # bytes/s
    burst = int(burst_kb * 1024) if burst_kb else max(32 * 1024, int(rate * 0.004))
    return f"root tbf rate {int(mbps * 1e6)}bit burst {burst} latency {latency_ms}ms"


@dataclass
class Island:
    """One learner's namespace and its veth link to the host."""

    name: str
    host_if: str
    ns_if: str
    host_ip: str
    ns_ip: str
    mbps: float  # 0 = unshaped

    def wrap(self, argv: list[str]) -> list[str]:
        """The command line ``argv``, run inside this namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def tcp_counters(self) -> dict:
        """This namespace's TCP segment counters (/proc/net/snmp): segments sent (pure ACKs
        included), retransmitted and received."""
        out = subprocess.run(self.wrap(["cat", "/proc/net/snmp"]), capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
        names, values = (line.split()[1:] for line in out.splitlines() if line.startswith("Tcp:"))
        tcp = dict(zip(names, (int(v) for v in values), strict=True))
        return {"tcp_out_segs": tcp["OutSegs"], "tcp_retrans_segs": tcp["RetransSegs"],
                "tcp_in_segs": tcp["InSegs"]}  # fmt: skip

    def counters(self) -> dict:
        """Frame bytes sent (tx) and received (rx) by the namespace end, i.e. by the learner,
        and frames (``tx_packets``, ``rx_packets``)."""
        link = json.loads(_run(f"ip -n {self.name} -s -j link show dev {self.ns_if}"))[0]
        return {
            f"{k}_{u}": link["stats64"][k][u] for k in ("tx", "rx") for u in ("bytes", "packets")
        }


def leftovers(prefix: str) -> list[str]:
    """Namespaces ``<prefix><digits>`` and host links ``<prefix><digits>h`` that exist now."""
    names = [ns["name"] for ns in json.loads(_run("ip -j netns list") or "[]")]
    names += [link["ifname"] for link in json.loads(_run("ip -j link show"))]
    return [x for x in names if re.fullmatch(rf"{re.escape(prefix)}\d+h?", x)]


class Islands:
    """Context manager building ``n`` islands (module docstring); ``.islands`` lists them."""

    def __init__(
        self,
        n: int,
        mbps: float | list[float],
        prefix: str = "apb",
        subnet: str = "10.77",
        burst_kb: float | None = None,
        latency_ms: float = 50,
        frame_counters: bool = True,
    ):
        rates = list(mbps) if isinstance(mbps, list | tuple) else [mbps] * n
        if not 1 <= n <= 254 or len(rates) != n:
            raise ValueError(f"need 1 <= n <= 254 and one rate per island (n={n}, mbps={mbps})")
        # Letters only, so "<prefix><digits>" is unambiguous; "<prefix>253h" must fit IFNAMSIZ.
        if not re.fullmatch(r"[a-z]{1,10}", prefix):
            raise ValueError(f"prefix must be 1-10 lowercase letters: {prefix!r}")
        self.prefix, self.subnet = prefix, subnet
        self.burst_kb, self.latency_ms, self.frame_counters = burst_kb, latency_ms, frame_counters
        self.islands = [
            Island(f"{prefix}{i}", f"{prefix}{i}h", f"{prefix}{i}n",
                   f"{subnet}.{i}.1", f"{subnet}.{i}.2", float(r))
            for i, r in enumerate(rates)
        ]  # fmt: skip

    def __enter__(self) -> Islands:
        try:
            self._cleanup(leftovers(self.prefix))
            for isl in self.islands:
                name, h, ns, nsx = isl.name, isl.host_if, isl.ns_if, f"-n {isl.name}"
                _run(f"ip netns add {name}")
                _run(f"ip link add {h} type veth peer name {ns} netns {name}")
                _run(f"ip addr add {isl.host_ip}/24 dev {h}")
                _run(f"ip {nsx} addr add {isl.ns_ip}/24 dev {ns}")
                if self.frame_counters:  # one TCP segment per packet: counters = wire frames
                    _run(f"ip link set {h} gso_max_segs 1")
                    _run(f"ip {nsx} link set {ns} gso_max_segs 1")
                _run(f"ip link set {h} up")
                _run(f"ip {nsx} link set lo up")
                _run(f"ip {nsx} link set {ns} up")
                _run(f"ip {nsx} route add {self.subnet}.0.0/16 via {isl.host_ip}")
                with open(f"/proc/sys/net/ipv4/conf/{h}/forwarding", "w") as f:
                    f.write("1")
                if isl.mbps > 0:  # egress of the host end = download, of the ns end = upload
                    tbf = _tbf(isl.mbps, self.burst_kb, self.latency_ms)
                    _run(f"tc qdisc replace dev {h} {tbf}")
                    _run(f"tc {nsx} qdisc replace dev {ns} {tbf}")
            first, last = self.islands[0], self.islands[-1]
            if len(self.islands) > 1 and not _reachable(first.name, last.ns_ip):
                raise RuntimeError(
                    f"{first.name} cannot reach {last.ns_ip} through the host: does a firewall "
                    "FORWARD chain drop routed traffic?"
                )
        except BaseException:
            self._cleanup()
            raise
        return self

    def _cleanup(self, names: list[str] | None = None) -> None:
        """Delete links (both veth ends go, synchronously), then namespaces; errors ignored."""
        if names is None:
            names = [x for isl in self.islands for x in (isl.host_if, isl.name)]
        for x in sorted(names, key=lambda x: not x.endswith("h")):
            _run(f"ip link del {x}" if x.endswith("h") else f"ip netns del {x}", check=False)

    def __exit__(self, *exc) -> None:
        self._cleanup()

    def totals(self) -> dict:
        """Counters summed over all islands."""
        per = [isl.counters() for isl in self.islands]
        return {k: sum(c[k] for c in per) for k in ("tx_bytes", "rx_bytes")}


def unavailable() -> str | None:
    """None if islands can be built here, else the reason why not (to skip shaped scenarios)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "network namespaces need root (run the benchmark as root)"
    if missing := [tool for tool in ("ip", "tc") if shutil.which(tool) is None]:
        return f"{' and '.join(missing)} not found (install iproute2)"
    probe = "probe" + "".join(
        chr(97 + int(d)) for d in str(os.getpid() % 100000)
    )  # the real thing once, no addresses or routes
    cmds = [f"ip netns add {probe}", f"ip link add {probe}h type veth peer name {probe}n",
            f"ip link set {probe}h gso_max_segs 1", f"tc qdisc add dev {probe}h {_tbf(1, 32, 50)}",
            f"ip link set {probe}n netns {probe}"]  # fmt: skip
    try:
        for cmd in cmds:
            _run(cmd)
    except RuntimeError as e:
        return f"cannot build a shaped network namespace: {e}"
    finally:
        _run(f"ip link del {probe}h", check=False)
        _run(f"ip netns del {probe}", check=False)
    return None


_CLIENT = (
    "import socket,sys\ns = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n"
    "s.sendall(b'x' * int(sys.argv[3]))\ns.shutdown(socket.SHUT_WR)\ns.recv(1)"
)


def _selftest(mbps: float = 5.0, nbytes: int = 2 * 1024 * 1024) -> int:
    import socket
    import threading

    if why := unavailable():
        print("unavailable:", why)
        return 1
    prefix = "apbst"  # not the harness's default, so a running benchmark is left alone
    with Islands(2, mbps, prefix=prefix, subnet="10.79") as isl:
        a, b = isl.islands
        srv, got = socket.create_server((a.host_ip, 0)), {}
        srv.settimeout(10)  # never hang if the client fails

        def serve() -> None:  # host side: time from accept to EOF
            conn, _ = srv.accept()
            t0, n = time.monotonic(), 0
            while chunk := conn.recv(1 << 16):
                n += len(chunk)
            got.update(n=n, s=time.monotonic() - t0)
            conn.sendall(b"k")
            conn.close()

        th = threading.Thread(target=serve)
        th.start()
        before, port = a.counters(), srv.getsockname()[1]
        subprocess.run(a.wrap([sys.executable, "-c", _CLIENT, a.host_ip, str(port), str(nbytes)]))
        th.join()
        after = a.counters()
        tx, rx = (after[k] - before[k] for k in ("tx_bytes", "rx_bytes"))
        mbit = got["n"] * 8 / got["s"] / 1e6
        wire = tx * 8 / got["s"] / 1e6
        print(f"{a.name} -> {a.host_ip}: {got['n']} B in {got['s']:.2f} s: payload {mbit:.2f}"
              f" Mbit/s, frames {wire:.2f} Mbit/s (tbf at {mbps})")  # fmt: skip
        print(f"{a.name} counters: tx {tx} B = {tx / nbytes:.4f} x payload, rx {rx} B (acks)")
        print(f"totals: {isl.totals()}")
        ok = _reachable(a.name, b.ns_ip)
        print(f"{a.name} -> {b.name} ({b.ns_ip}) reachable: {ok}")
    left = leftovers(prefix)
    print(f"left after exit: {left or 'nothing'}")
    return 0 if ok and not left and got["n"] == nbytes else 1


if __name__ == "__main__":
    if sys.argv[1:] != ["--selftest"]:
        sys.exit(f"usage: {sys.argv[0]} --selftest")
    sys.exit(_selftest())
