"""Starts P and D API servers without `--router` (one of each, or a fleet) and the real sglang-router in front of
them (`python -m sglang_router.launch_router --pd-disaggregation --prefill P_URL P_CONNECTOR_PORT ... --decode D_URL
...`), all on 127.0.0.1, and stops every process (docs/design.md §8, "sglang-router").

sglang-router's defaults are not loopback-only: it binds 0.0.0.0 and starts a Prometheus exporter on 0.0.0.0:29000,
so both are set here. It adds an instance once the instance answers /health, checking every
`--worker-startup-check-interval` (30 s by default, 1 s here), so it starts together with P and D.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import httpx
from openai import OpenAI

from tests.services import launcher

ROUTER_MODULE = "sglang_router.launch_router"
DRAIN_S = 2
MAX_MODEL_LEN = 2048   # room for a request long enough to be killed mid-stream


@dataclass
class SglangDeployment:
    prefills: list[launcher.Server]
    decodes: list[launcher.Server]
    connector_ports: list[int]          # each P's, in order
    log_dir: Path
    router_flags: tuple[str, ...] = ()
    router: launcher.Server | None = None

    @property
    def prefill(self) -> launcher.Server:
        return self.prefills[0]

    @property
    def decode(self) -> launcher.Server:
        return self.decodes[0]

    @property
    def connector_port(self) -> int:
        return self.connector_ports[0]

    def client(self) -> OpenAI:
        return OpenAI(base_url=self.router.openai_base_url, api_key="unused", max_retries=0, timeout=120.0)

    def start_router(self) -> None:
        """The router (P and D may still be starting: it checks them every second)."""
        workers = [flag for p, port in zip(self.prefills, self.connector_ports) for flag in ("--prefill", p.url,
                                                                                            str(port))]
        workers += [flag for d in self.decodes for flag in ("--decode", d.url)]
        self.router = launcher.start(
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(launcher.free_port()),
            "--pd-disaggregation", *workers, "--worker-startup-check-interval", "1",
            "--shutdown-grace-period-secs", str(DRAIN_S), "--log-level", "warn", *self.router_flags,
            model=None, module=ROUTER_MODULE, wait_ready=False, log_dir=self.log_dir)

    def await_ready(self) -> None:
        """Every P and D answers /health 200 and the router lists each as a healthy worker."""
        for server in (*self.prefills, *self.decodes):
            launcher.await_ready(server)
        wanted = ["decode"] * len(self.decodes) + ["prefill"] * len(self.prefills)
        self.router.wait_until(lambda r: _healthy_workers(r) == wanted,
                               "sglang-router lists every P and D as a healthy worker", timeout_s=60)

    def workers(self) -> list[dict]:
        return httpx.get(self.router.url + "/workers", timeout=5).json()["workers"]

    def stop(self) -> None:
        """Router first (no new requests), then D and P; the logs go to the failure report."""
        servers = [("router", self.router), *(("decode", d) for d in self.decodes),
                   *(("prefill", p) for p in self.prefills)]
        for _, server in servers:
            if server is not None:
                launcher.stop(server)
        for name, server in servers:
            if server is not None:
                print(f"---- {name} log ({' '.join(server.flags)}) ----\n{server.log()[-4000:]}")
                server.log_path.unlink(missing_ok=True)


def _healthy_workers(router: launcher.Server) -> list[str]:
    """The worker types of the healthy workers, sorted."""
    try:
        rows = httpx.get(router.url + "/workers", timeout=5).json()["workers"]
    except (httpx.HTTPError, json.JSONDecodeError, KeyError):
        return []
    return sorted(row["worker_type"] for row in rows if row["is_healthy"])


def start_deployment(model: str, k: int, log_dir: Path, num_prefill: int = 1, num_decode: int = 1,
                     router_flags: tuple[str, ...] = ()) -> SglangDeployment:
    """`num_prefill` P (`--splitwise-role prefill --pd-comm-port PORT`), `num_decode` D (`--splitwise-role decode`)
    and the router, not waited for (see `await_ready`); their logs go to `log_dir` (a pytest tmp_path)."""
    spec = ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": k})] if k else []
    common = ["--drain-timeout-s", str(DRAIN_S), "--max-model-len", str(MAX_MODEL_LEN), *spec]
    ports = [launcher.free_port() for _ in range(num_prefill)]
    prefills = [launcher.start("--splitwise-role", "prefill", "--pd-comm-port", str(port), *common, model=model,
                               wait_ready=False, log_dir=log_dir) for port in ports]
    decodes = [launcher.start("--splitwise-role", "decode", *common, model=model, wait_ready=False, log_dir=log_dir)
               for _ in range(num_decode)]
    deployment = SglangDeployment(prefills, decodes, ports, log_dir, router_flags)
    try:
        deployment.start_router()
    except BaseException:
        deployment.stop()
        raise
    return deployment
