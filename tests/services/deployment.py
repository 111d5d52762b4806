"""Starts a router with its instances on 127.0.0.1 for the services tests (a P and a D, or mixed instances),
waits until the router can use them, and stops every process, router included (SERVICES §5, §8).

Instances heartbeat and are health-checked every `INTERVAL_S`, so registration, health changes and re-registration
after a router restart take a second or two instead of the default 5 s. It grows with the machine's load: the
router drops an instance silent for 3 intervals, calls one unhealthy after 3 checks that each failed to answer
within one, and ends a silent stream of an unhealthy instance as lost, so an API server starved for 0.75 s (the
0.25 s interval used before) could fail a good request on a loaded machine.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

import httpx
from openai import OpenAI

from tests.services import launcher

ROUTER = "fastdeploy.router.launch"
INTERVAL_S = 0.5 * launcher.load_slowdown()   # 0.5 s idle, up to 2 s on a loaded machine
# Tests stop instances with nothing left to finish; a short drain keeps a leftover from stalling teardown.
DRAIN_S = 2


def spec_flags(k: int) -> list[str]:
    return ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": k})] if k else []


def secret_flags(directory, secret: str | None) -> tuple[str, ...]:
    """The instance flags that give it PD secret `secret` (written to a file in `directory`); none for None."""
    if secret is None:
        return ()
    path = directory / "pd.secret"
    path.write_text(secret)
    return ("--pd-secret-file", str(path))


def start_router(*flags: str, port: int | None = None) -> launcher.Server:
    """`python -m fastdeploy.router.launch --host 127.0.0.1 --port <free> --health-interval-secs 0.25 FLAGS`."""
    port = port or launcher.free_port()
    log_path = launcher.log_file("fd-router-")
    argv = [sys.executable, "-m", ROUTER, "--host", "127.0.0.1", "--port", str(port),
            "--health-interval-secs", str(INTERVAL_S), *flags]
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(launcher.REPO), environment.get("PYTHONPATH")) if p)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=launcher.REPO, env=environment,
                                   start_new_session=True)
    router = launcher.Server(process, port, log_path, list(flags))
    launcher.await_ready(router, "/registered")   # its /health is 503 until it has instances to serve with
    return router


def registered(router: launcher.Server) -> dict[int, dict]:
    """The router's `/registered` rows by instance port."""
    rows = httpx.get(router.url + "/registered", timeout=5).json()["instances"]
    return {row["port"]: row for row in rows}


class NothingHeld:
    """SERVICES §8 checks over a deployment's `instances` (name -> launcher.Server), here and across hosts."""

    instances: dict

    def nothing_held(self, *names: str) -> bool:
        """No slot, block or request held on the named instances (default: all)."""
        return all(launcher.nothing_held(self.instances[name]) for name in names or self.instances)

    def wait_nothing_held(self, *names: str, timeout_s: float = 60.0) -> None:
        """Waits (bounded) until `nothing_held`; polled through an instance, so the router may be down."""
        names = names or tuple(self.instances)
        self.instances[names[0]].wait_until(lambda _: self.nothing_held(*names),
                                            f"nothing held on {', '.join(names)}", timeout_s)


@dataclass
class Deployment(NothingHeld):
    router: launcher.Server
    instances: dict[str, launcher.Server] = field(default_factory=dict)

    def client(self, **options) -> OpenAI:
        return OpenAI(base_url=self.router.openai_base_url, api_key="unused", max_retries=0,
                      **{"timeout": 120.0, **options})

    def add(self, name: str, *flags: str, model: str = "fd-toy", env: dict | None = None,
            port: int | None = None) -> launcher.Server:
        """Starts an instance registering with this router (not waited for: see `await_ready`); on `port` when
        given (an instance restarted at its address), else a free one."""
        server = launcher.start("--router", f"127.0.0.1:{self.router.port}", "--health-interval-secs",
                                str(INTERVAL_S), "--drain-timeout-s", str(DRAIN_S), *flags, model=model,
                                wait_ready=False, env=env, port=port)
        self.instances[name] = server
        return server

    def await_ready(self) -> None:
        """Every instance answers /health 200 and the router lists it as healthy."""
        try:
            for server in self.instances.values():
                launcher.await_ready(server)
            wanted = {server.port for server in self.instances.values()}
            self.router.wait_until(
                lambda r: wanted <= {p for p, row in registered(r).items() if row["healthy"]},
                "every instance registered and healthy at the router")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> int | None:
        """Stops every instance, then the router; returns the router's exit status. The logs are printed, which
        pytest shows only for a failing test: the failure report."""
        for server in self.instances.values():
            launcher.stop(server)
        status = launcher.stop(self.router)
        for name, server in (*self.instances.items(), ("router", self.router)):
            print(f"---- {name} log ({' '.join(server.flags)}) ----\n{server.log()[-4000:]}")
            server.log_path.unlink(missing_ok=True)
        return status


def pd_deployment(model: str = "fd-toy", k: int = 0, prefill_flags: tuple[str, ...] = (),
                  decode_flags: tuple[str, ...] = (), router_flags: tuple[str, ...] = (), env: dict | None = None,
                  wait: bool = True) -> Deployment:
    """A splitwise router with one P and one D of the same configuration (unless the flags say otherwise)."""
    deployment = Deployment(start_router("--splitwise", *router_flags))
    deployment.add("prefill", "--splitwise-role", "prefill", *spec_flags(k), *prefill_flags, model=model, env=env)
    deployment.add("decode", "--splitwise-role", "decode", *spec_flags(k), *decode_flags, model=model, env=env)
    if wait:
        deployment.await_ready()
    return deployment


def fleet_flags(role: str, k: int, flags: tuple[str, ...] = ()) -> tuple[str, ...]:
    """An instance's flags in a fleet (also those to restart it with)."""
    return ("--splitwise-role", role, *spec_flags(k), *flags)


def fleet_deployment(model: str = "fd-toy", k: int = 0, num_prefill: int = 2, num_decode: int = 2,
                     flags: tuple[str, ...] = (), decode_flags: tuple[str, ...] = (),
                     router_flags: tuple[str, ...] = (), wait: bool = True) -> Deployment:
    """A splitwise router with `num_prefill` P ("prefill0", ...) and `num_decode` D ("decode0", ...) of one
    configuration (`flags` for every instance, then `decode_flags` for each D)."""
    deployment = Deployment(start_router("--splitwise", *router_flags))
    for role, count, own in (("prefill", num_prefill, ()), ("decode", num_decode, decode_flags)):
        for index in range(count):
            deployment.add(f"{role}{index}", *fleet_flags(role, k, (*flags, *own)), model=model)
    if wait:
        deployment.await_ready()
    return deployment


def mixed_deployment(model: str = "fd-toy", k: int = 0, count: int = 2, flags: tuple[str, ...] = (),
                     wait: bool = True) -> Deployment:
    """A mixed-mode router with `count` mixed instances."""
    deployment = Deployment(start_router())
    for i in range(count):
        deployment.add(f"mixed{i}", *spec_flags(k), *flags, model=model)
    if wait:
        deployment.await_ready()
    return deployment
