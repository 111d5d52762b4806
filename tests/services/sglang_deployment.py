"""Starts a P and a D API server without `--router` and the real sglang-router in front of them
(`python -m sglang_router.launch_router --pd-disaggregation --prefill P_URL P_CONNECTOR_PORT --decode D_URL`), all on
127.0.0.1, and stops every process (docs/design.md §8, "sglang-router").

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
    prefill: launcher.Server
    decode: launcher.Server
    connector_port: int
    log_dir: Path
    router: launcher.Server | None = None

    def client(self) -> OpenAI:
        return OpenAI(base_url=self.router.openai_base_url, api_key="unused", max_retries=0, timeout=120.0)

    def start_router(self) -> None:
        """The router (P and D may still be starting: it checks them every second)."""
        self.router = launcher.start(
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(launcher.free_port()),
            "--pd-disaggregation", "--prefill", self.prefill.url, str(self.connector_port),
            "--decode", self.decode.url, "--worker-startup-check-interval", "1",
            "--shutdown-grace-period-secs", str(DRAIN_S), "--log-level", "warn",
            model=None, module=ROUTER_MODULE, wait_ready=False, log_dir=self.log_dir)

    def await_ready(self) -> None:
        """P and D answer /health 200 and the router lists both as healthy workers."""
        for server in (self.prefill, self.decode):
            launcher.await_ready(server)
        self.router.wait_until(lambda r: _healthy_workers(r) == {"prefill", "decode"},
                               "sglang-router lists P and D as healthy workers", timeout_s=60)

    def workers(self) -> list[dict]:
        return httpx.get(self.router.url + "/workers", timeout=5).json()["workers"]

    def stop(self) -> None:
        """Router first (no new requests), then D and P; the logs go to the failure report."""
        servers = [("router", self.router), ("decode", self.decode), ("prefill", self.prefill)]
        for _, server in servers:
            if server is not None:
                launcher.stop(server)
        for name, server in servers:
            if server is not None:
                print(f"---- {name} log ({' '.join(server.flags)}) ----\n{server.log()[-4000:]}")
                server.log_path.unlink(missing_ok=True)


def _healthy_workers(router: launcher.Server) -> set[str]:
    try:
        rows = httpx.get(router.url + "/workers", timeout=5).json()["workers"]
    except (httpx.HTTPError, json.JSONDecodeError, KeyError):
        return set()
    return {row["worker_type"] for row in rows if row["is_healthy"]}


def start_deployment(model: str, k: int, log_dir: Path) -> SglangDeployment:
    """P (`--splitwise-role prefill --pd-comm-port PORT`), D (`--splitwise-role decode`) and the router, not waited
    for (see `await_ready`); their logs go to `log_dir` (a pytest tmp_path)."""
    spec = ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": k})] if k else []
    common = ["--drain-timeout-s", str(DRAIN_S), "--max-model-len", str(MAX_MODEL_LEN), *spec]
    port = launcher.free_port()
    prefill = launcher.start("--splitwise-role", "prefill", "--pd-comm-port", str(port), *common, model=model,
                             wait_ready=False, log_dir=log_dir)
    decode = launcher.start("--splitwise-role", "decode", *common, model=model, wait_ready=False, log_dir=log_dir)
    deployment = SglangDeployment(prefill, decode, port, log_dir)
    try:
        deployment.start_router()
    except BaseException:
        deployment.stop()
        raise
    return deployment
