"""Builds a private network of hosts out of Linux network namespaces, runs processes on them, shapes and cuts their
links, and removes everything again (docs/testing.md, "Hosts").

Layout: an outer namespace of the network's own holds a bridge; each host is a namespace joined to that bridge by a
veth pair (`eth0` inside the host), with address `SUBNET.<index + 1>`. No interface, route or address of the
machine's own namespace is touched, and the subnet (10.241.0.0/24, private) exists only inside these namespaces, so
networks built at once (one per pytest worker) never see each other.

Shaping acts on one host's link to the bridge: `rate` puts a `tbf` qdisc on both ends of the veth pair (what the
host sends and what it receives); `loss` and `partition` are nftables rules in the host's namespace that drop
packets to and from given peers (`numgen random mod 100 < N` for loss), so a fault can be confined to one pair of
hosts. The kernel of this machine kind has no `netem`, so there is no delay here.

Every namespace is named `fdh<pid>-...` after the process that made it: `close` kills every process left in the
hosts (`ip netns pids`) and deletes the namespaces (the veth pairs and the bridge go with them), and a network built
later first deletes those of a creator that no longer runs (one killed before it could clean up).
"""
from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.241.0"         # /24, private; only inside the namespaces a Network builds
PREFIX_LENGTH = 24
_NAME_PREFIX = "fdh"
_CLONE_NEWNET = 0x40000000
_COUNTER = itertools.count()
_KILL_WAIT_S = 10.0
# TCP's retransmission backoff on every host, capped (Linux >= 6.15 has the per-namespace sysctl; elsewhere the
# kernel's 120 s stays): a connection a partition stalled retries within this of healing instead of up to two
# minutes later, so the tests of recovery after a long partition do not wait out the backoff (docs/testing.md).
_RTO_MAX_SYSCTL = Path("/proc/sys/net/ipv4/tcp_rto_max_ms")
RTO_MAX_MS = 5000


class HostsUnavailable(RuntimeError):
    """This machine cannot build hosts (not root, no `ip`/`nft`, namespaces not permitted); the message says why."""


def _run(*argv: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, input=input)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit status {result.returncode}: {result.stderr.strip()}")
    return result


def unavailable_reason() -> str | None:
    """Why a Network cannot be built here, or None when it can (checked by building and deleting a namespace)."""
    if os.geteuid() != 0:
        return "building hosts needs root (ip netns add, veth, bridge)"
    for tool in ("ip", "tc", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2, nftables)"
    probe = f"{_NAME_PREFIX}{os.getpid()}-probe{next(_COUNTER)}"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"network namespaces are not permitted here: ip netns add: {made.stderr.strip()}"
    try:
        for argv in (("ip", "-n", probe, "link", "add", "br0", "type", "bridge"),
                     ("ip", "-n", probe, "link", "add", "va", "type", "veth", "peer", "name", "vb"),
                     ("ip", "netns", "exec", probe, "nft", "add", "table", "inet", "probe")):
            tried = _run(*argv, check=False)
            if tried.returncode != 0:
                return f"{' '.join(argv[3:] if argv[1] == '-n' else argv[4:])}: {tried.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_orphans() -> list[str]:
    """Deletes the namespaces (and kills their processes) of creators that no longer run; returns their names."""
    swept = []
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(_NAME_PREFIX):
            continue
        creator = name[len(_NAME_PREFIX):].partition("-")[0]
        if creator.isdigit() and not _alive(int(creator)):
            _kill_all_in(name)
            _run("ip", "netns", "del", name, check=False)
            swept.append(name)
    return swept


def _pids_in(namespace: str) -> list[int]:
    out = _run("ip", "netns", "pids", namespace, check=False).stdout.split()
    return [int(pid) for pid in out if pid.isdigit()]


def _kill_all_in(namespace: str) -> None:
    """SIGKILL every process in `namespace`, waiting (bounded) until none is left."""
    deadline = time.monotonic() + _KILL_WAIT_S
    while (pids := _pids_in(namespace)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _enter(namespace: str) -> None:
    """Moves the calling thread (only it: a network namespace is per thread) into `namespace`."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/var/run/netns/{namespace}") as handle:
        if libc.setns(handle.fileno(), _CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns into {namespace}: {os.strerror(error)}")


@dataclass
class Host:
    """One host: a namespace with `eth0` at `address` on the network's bridge."""

    name: str
    namespace: str
    address: str
    veth_outer: str              # the bridge's end of its link (in the outer namespace)
    outer: str
    processes: list[subprocess.Popen] = field(default_factory=list)
    _executor: ThreadPoolExecutor | None = None
    _rules: dict[str, str] = field(default_factory=dict)   # nft rule name -> its statements

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        """Starts `argv` on this host (`ip netns exec`), in a session of its own; killed by `Network.close`."""
        process = subprocess.Popen(["ip", "netns", "exec", self.namespace, *argv], start_new_session=True, **kwargs)
        self.processes.append(process)
        return process

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return _run("ip", "netns", "exec", self.namespace, *argv, check=check)

    def call(self, fn, *args, timeout: float | None = None, **kwargs):
        """`fn(*args, **kwargs)` from a thread inside this host's namespace (sockets it opens are this host's):
        how the test process itself talks to the hosts. Waits at most `timeout` seconds."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix=self.name,
                                                initializer=_enter, initargs=(self.namespace,))
        return self._executor.submit(fn, *args, **kwargs).result(timeout)

    def submit(self, fn, *args, **kwargs):
        """Like `call`, returning the future (requests sent concurrently)."""
        self.call(lambda: None)   # the executor exists
        return self._executor.submit(fn, *args, **kwargs)

    # ---- shaping and faults -------------------------------------------------------------------------------------

    def set_rate(self, rate: str, burst: str = "64kb", latency: str = "50ms", inbound: bool = True) -> None:
        """A `tbf` rate limit (e.g. "100mbit") on what this host sends and, unless not `inbound`, on what it
        receives: `burst` bytes pass at once, and a packet that would wait longer than `latency` in the queue is
        dropped (give slow rates a long one)."""
        ends = [("ip", "netns", "exec", self.namespace, "tc", "qdisc", "replace", "dev", "eth0")]
        if inbound:
            ends.append(("ip", "netns", "exec", self.outer, "tc", "qdisc", "replace", "dev", self.veth_outer))
        for argv in ends:
            _run(*argv, "root", "tbf", "rate", rate, "burst", burst, "latency", latency)

    def clear_rate(self) -> None:
        for argv in (("ip", "netns", "exec", self.namespace, "tc", "qdisc", "del", "dev", "eth0", "root"),
                     ("ip", "netns", "exec", self.outer, "tc", "qdisc", "del", "dev", self.veth_outer, "root")):
            _run(*argv, check=False)

    def set_loss(self, percent: int, *peers: "Host") -> None:
        """Drop `percent` % of the packets between this host and `peers` (every host when none), both ways."""
        if not 0 <= percent <= 100:
            raise ValueError(f"set_loss: argument 'percent' must be within 0..100 (got {percent})")
        # nftables: `mod 100` yields 0..99, so `< 100` is refused; 100 % is a plain drop
        self._set_rule("loss", "drop" if percent == 100 else f"numgen random mod 100 < {int(percent)} drop", peers)

    def partition(self, *peers: "Host") -> None:
        """Drop every packet between this host and `peers` (every other host when none), both ways."""
        self._set_rule("partition", "drop", peers)

    def heal(self) -> None:
        """Remove every loss and partition rule of this host."""
        self._rules.clear()
        self._load_rules()

    def _set_rule(self, kind: str, verdict: str, peers: tuple["Host", ...]) -> None:
        if peers:
            wanted = "{ " + ", ".join(peer.address for peer in peers) + " }"
            self._rules[kind] = (f"ip daddr {wanted} {verdict}", f"ip saddr {wanted} {verdict}")
        else:
            subnet = f"{SUBNET}.0/{PREFIX_LENGTH}"
            self._rules[kind] = (f"ip daddr {subnet} {verdict}", f"ip saddr {subnet} {verdict}")
        self._load_rules()

    def _load_rules(self) -> None:
        """Replaces this host's nftables table by one holding the current rules (one atomic `nft -f`)."""
        out_rules = "".join(f"    {rules[0]}\n" for rules in self._rules.values())
        in_rules = "".join(f"    {rules[1]}\n" for rules in self._rules.values())
        script = ("table inet fdhosts\ndelete table inet fdhosts\n"
                  "table inet fdhosts {\n"
                  f"  chain out {{ type filter hook output priority 0; policy accept;\n{out_rules}  }}\n"
                  f"  chain in {{ type filter hook input priority 0; policy accept;\n{in_rules}  }}\n"
                  "}\n")
        _run("ip", "netns", "exec", self.namespace, "nft", "-f", "-", input=script)

    def link_down(self) -> None:
        """Takes this host's link down (both ends): the host is cut off from every other."""
        _run("ip", "-n", self.outer, "link", "set", self.veth_outer, "down")

    def link_up(self) -> None:
        _run("ip", "-n", self.outer, "link", "set", self.veth_outer, "up")

    def kill_all(self) -> None:
        """SIGKILL every process on this host (a host lost)."""
        _kill_all_in(self.namespace)
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(_KILL_WAIT_S)

    def pids(self) -> list[int]:
        return _pids_in(self.namespace)


class Network:
    """N hosts on one bridge; a context manager that removes every namespace, interface and process at exit."""

    def __init__(self, names: list[str] | tuple[str, ...]):
        reason = unavailable_reason()
        if reason is not None:
            raise HostsUnavailable(reason)
        sweep_orphans()
        self.tag = f"{_NAME_PREFIX}{os.getpid()}-{next(_COUNTER)}"
        self.outer = f"{self.tag}-net"
        self.hosts: dict[str, Host] = {}
        self._lock = threading.Lock()
        try:
            self._build(list(names))
        except BaseException:
            self.close()
            raise

    def _build(self, names: list[str]) -> None:
        _run("ip", "netns", "add", self.outer)
        _run("ip", "-n", self.outer, "link", "set", "lo", "up")
        _run("ip", "-n", self.outer, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.outer, "link", "set", "br0", "up")
        for index, name in enumerate(names):
            namespace, veth = f"{self.tag}-{name}", f"v{index}"
            _run("ip", "netns", "add", namespace)
            self.hosts[name] = Host(name, namespace, f"{SUBNET}.{index + 1}", veth, self.outer)
            _run("ip", "-n", self.outer, "link", "add", veth, "type", "veth", "peer", "name", "eth0",
                 "netns", namespace)
            _run("ip", "-n", self.outer, "link", "set", veth, "master", "br0", "up")
            _run("ip", "-n", namespace, "addr", "add", f"{SUBNET}.{index + 1}/{PREFIX_LENGTH}", "dev", "eth0")
            _run("ip", "-n", namespace, "link", "set", "eth0", "up")
            _run("ip", "-n", namespace, "link", "set", "lo", "up")
            if _RTO_MAX_SYSCTL.exists():
                _run("ip", "netns", "exec", namespace, "sysctl", "-q", "-w", f"net.ipv4.tcp_rto_max_ms={RTO_MAX_MS}")

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def namespaces(self) -> list[str]:
        return [self.outer, *(host.namespace for host in self.hosts.values())]

    def close(self) -> None:
        """Kill every process on every host, then delete the namespaces (their interfaces go with them)."""
        with self._lock:
            for host in self.hosts.values():
                for process in host.processes:
                    if process.poll() is None:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(process.pid, signal.SIGKILL)
                _kill_all_in(host.namespace)
                for process in host.processes:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(_KILL_WAIT_S)
                if host._executor is not None:
                    host._executor.shutdown(wait=False, cancel_futures=True)
            for namespace in reversed(self.namespaces()):
                if Path(f"/var/run/netns/{namespace}").exists():
                    _run("ip", "netns", "del", namespace, check=False)


def leftovers(tag_prefix: str | None = None) -> list[str]:
    """The namespaces of this process (or of `tag_prefix`) that still exist: none after every Network closed."""
    prefix = tag_prefix or f"{_NAME_PREFIX}{os.getpid()}-"
    return [line.split()[0] for line in _run("ip", "netns", "list", check=False).stdout.splitlines()
            if line.split() and line.split()[0].startswith(prefix)]
