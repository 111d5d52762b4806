"""Starts a router and its P and D instances on hosts of a Network (tests/hosts/netns.py), each as a user would on
its own machine (README "PD across hosts"): the router bound to its host's address, the instances bound to every
interface (`--host 0.0.0.0`) with `--router <router host>:PORT`, so that what they advertise is what the code under
test chose. The test process talks to every server from a thread inside a host (`Host.call`).

Every process runs in its host's namespace with this tree first on PYTHONPATH; `Network.close` kills whatever a test
leaves behind.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field

import httpx
from openai import OpenAI

from tests.hosts.netns import Host
from tests.services import launcher
from tests.services.deployment import DRAIN_S, INTERVAL_S, NothingHeld, spec_flags

ROUTER_PORT = 9000
INSTANCE_PORT = 8180
PD_COMM_PORT = 8191
MOONCAKE = ("--cache-transfer-protocol", "mooncake-tcp")


@dataclass
class HostServer(launcher.Server):
    """A server on a host: its URL is the host's address, and the test reaches it from inside that host."""

    host: Host | None = None
    address: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def health(self) -> int:
        return self.host.call(super().health, timeout=10)

    def metrics(self) -> dict[str, float]:
        return self.host.call(super().metrics, timeout=10)

    def get(self, path: str) -> httpx.Response:
        return self.host.call(lambda: httpx.get(self.url + path, timeout=5), timeout=10)


def _start(host: Host, module: str, *flags: str, port: int, bind: str) -> HostServer:
    log_path = launcher.log_file(f"fd-{host.name}-")
    argv = [sys.executable, "-m", module, "--host", bind, "--port", str(port), *flags]
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(launcher.REPO), environment.get("PYTHONPATH")) if p)
    with open(log_path, "wb") as log:
        process = host.popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=launcher.REPO, env=environment)
    return HostServer(process, port, log_path, list(flags), host=host, address=host.address)


def _answers_200(server: HostServer, path: str) -> bool:
    try:
        return server.get(path).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class HostDeployment(NothingHeld):
    """A router on one host and instances on others; `stop` stops every process (the Network removes the rest)."""

    router: HostServer
    client_host: Host
    instances: dict[str, HostServer] = field(default_factory=dict)

    def add(self, name: str, host: Host, *flags: str, model: str = "fd-tiny", bind: str = "0.0.0.0",
            register: bool = True) -> HostServer:
        """An instance on `host`, registering with this deployment's router (unless not `register`: behind
        sglang-router, which is given the instances instead)."""
        router = ("--router", f"{self.router.address}:{self.router.port}") if register else ()
        server = _start(host, launcher.API_SERVER, "--model", model, *router, "--health-interval-secs",
                        str(INTERVAL_S), "--drain-timeout-s", str(DRAIN_S), "--pd-comm-port", str(PD_COMM_PORT),
                        *flags, port=INSTANCE_PORT, bind=bind)
        self.instances[name] = server
        return server

    def registered(self) -> dict[str, dict]:
        """The router's `/registered` rows by instance key (host:port)."""
        rows = self.router.get("/registered").json()["instances"]
        return {f"{row['host']}:{row['port']}": row for row in rows}

    def await_ready(self) -> None:
        """Every instance answers /health 200 from the router's host and the router lists it as healthy."""
        for server in self.instances.values():
            server.wait_until(lambda s: _answers_200(s, "/health"), "instance ready (/health 200)",
                              launcher.START_TIMEOUT_S)
        wanted = {f"{s.address}:{s.port}" for s in self.instances.values()}
        self.router.wait_until(lambda r: wanted <= {k for k, row in self.registered().items() if row["healthy"]},
                               "every instance registered and healthy at the router")

    def client(self) -> OpenAI:
        """An OpenAI client for the router; use it through `self.client_host.call` (its sockets are that host's)."""
        return OpenAI(base_url=f"{self.router.url}/v1", api_key="unused", max_retries=0, timeout=120.0)

    def complete(self, model: str, prompt: str, max_tokens: int, **options):
        """One greedy completion through the router, sent from the client's host."""
        def send():
            with self.client() as client:
                return client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                                 **options)
        return self.client_host.call(send, timeout=180)

    def stop(self) -> None:
        for name, server in (*self.instances.items(), ("router", self.router)):
            launcher.stop(server)
            print(f"---- {name} log on {server.address} ({' '.join(server.flags)}) ----\n{server.log()[-4000:]}")
            server.log_path.unlink(missing_ok=True)


def start_router(host: Host, client_host: Host | None = None) -> HostDeployment:
    """A splitwise router bound to `host`'s address (clients on `client_host`, default: the router's host)."""
    router = _start(host, "fastdeploy.router.launch", "--splitwise", "--health-interval-secs", str(INTERVAL_S),
                    port=ROUTER_PORT, bind=host.address)
    deployment = HostDeployment(router, client_host or host)
    router.wait_until(lambda r: _answers_200(r, "/registered"), "router ready (/registered 200)",
                      launcher.START_TIMEOUT_S)
    return deployment


def pd_across_hosts(router: Host, prefill: Host, decode: Host, k: int = 1, model: str = "fd-tiny",
                    flags: tuple[str, ...] = ()) -> HostDeployment:
    """Router, P and D on three hosts, not yet awaited (see `HostDeployment.await_ready`)."""
    deployment = start_router(router)
    deployment.add("prefill", prefill, "--splitwise-role", "prefill", *spec_flags(k), *flags, model=model)
    deployment.add("decode", decode, "--splitwise-role", "decode", *spec_flags(k), *flags, model=model)
    return deployment


def sglang_across_hosts(router: Host, prefills: list[Host], decodes: list[Host], k: int = 1,
                        model: str = "fd-tiny", flags: tuple[str, ...] = (), advertise: bool = False) -> HostDeployment:
    """P and D on their hosts without `--router` (with `flags`, and `--advertise-host <its address>` when
    `advertise`), and the real sglang-router on `router` given their URLs (each P with its connector port, the
    bootstrap port): not yet awaited (see `await_sglang_ready`)."""
    workers = [flag for p in prefills for flag in ("--prefill", f"http://{p.address}:{INSTANCE_PORT}",
                                                   str(PD_COMM_PORT))]
    workers += [flag for d in decodes for flag in ("--decode", f"http://{d.address}:{INSTANCE_PORT}")]
    server = _start(router, "sglang_router.launch_router", "--prometheus-host", router.address, "--prometheus-port",
                    "29000", "--pd-disaggregation", *workers, "--worker-startup-check-interval", "1",
                    "--shutdown-grace-period-secs", str(DRAIN_S), "--log-level", "warn", port=ROUTER_PORT,
                    bind=router.address)
    deployment = HostDeployment(server, router)
    for role, hosts in (("prefill", prefills), ("decode", decodes)):
        for index, host in enumerate(hosts):
            own = ("--advertise-host", host.address) if advertise else ()
            deployment.add(f"{role}{index}", host, "--splitwise-role", role, *spec_flags(k), *flags, *own,
                           model=model, register=False)
    return deployment


def await_sglang_ready(deployment: HostDeployment) -> None:
    """Every instance answers /health and sglang-router lists each as a healthy worker."""
    for server in deployment.instances.values():
        server.wait_until(lambda s: _answers_200(s, "/health"), "instance ready (/health 200)",
                          launcher.START_TIMEOUT_S)

    def healthy(router: HostServer) -> int:
        try:
            return sum(row["is_healthy"] for row in router.get("/workers").json()["workers"])
        except (httpx.HTTPError, ValueError, KeyError):
            return 0
    deployment.router.wait_until(lambda r: healthy(r) == len(deployment.instances),
                                 "sglang-router lists every P and D as healthy", timeout_s=60)
