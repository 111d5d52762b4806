"""Runs a local PD deployment: a router, one prefill and one decode API server on loopback (SERVICES §2).

`fastdeploy serve --pd --model fd-tiny --mtp 1` starts `python -m fastdeploy.router.launch --splitwise` and the two
instances on free 127.0.0.1 ports (the instances register with the router), waits until the router lists both as
healthy, prints the router's URL, and stops all three on Ctrl-C or SIGTERM (SIGTERM, then SIGKILL after a bounded
wait); each child also gets SIGTERM if the supervisor itself dies. If any of them exits on its own, the others are
stopped too and the exit status is 1.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 20.0
HEARTBEAT_S = 1.0
# Flags each instance takes over from `fastdeploy serve --pd` (the API server's own names).
INSTANCE_FLAGS = ("model", "max_num_seqs", "max_model_len", "max_num_batched_tokens", "num_kv_blocks", "block_size",
                  "speculative_config", "ops_backend", "dtype", "pd_secret_file", "pd_timeout_secs", "api_key",
                  "max_concurrency", "log_level")


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _instance_argv(args: argparse.Namespace, role: str, port: int, router_port: int) -> list[str]:
    argv = [sys.executable, "-m", "fastdeploy.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port",
            str(port), "--splitwise-role", role, "--pd-comm-port", str(_free_port()), "--router",
            f"127.0.0.1:{router_port}", "--health-interval-secs", str(HEARTBEAT_S)]
    for name in INSTANCE_FLAGS:
        value = getattr(args, name)
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def _die_with_parent() -> None:
    """In the child, before exec (Linux): SIGTERM when the supervisor dies, so no child outlives it."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _start(name: str, argv: list[str], port: int) -> _Process:
    # Own session: Ctrl-C in the terminal reaches only this supervisor, which stops the children in order.
    return _Process(name, subprocess.Popen(argv, start_new_session=True, preexec_fn=_die_with_parent), port)


def _stop(processes: list[_Process]) -> None:
    for process in processes:
        if process.popen.poll() is None:
            process.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for process in processes:
        try:
            process.popen.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.popen.kill()
            process.popen.wait()


def _wait_ready(router: _Process, instances: list[_Process], processes: list[_Process]) -> None:
    """Every instance answers /health and the router lists both as healthy; RuntimeError if one exits first."""
    deadline = time.monotonic() + START_TIMEOUT_S
    wanted = {p.port for p in instances}
    with httpx.Client(timeout=2.0) as http:
        while time.monotonic() < deadline:
            for process in processes:
                if process.popen.poll() is not None:
                    raise RuntimeError(f"{process.name} exited with status {process.popen.returncode} while starting")
            try:
                rows = http.get(f"{router.url}/registered").json().get("instances", [])
                if wanted <= {row["port"] for row in rows if row.get("healthy")}:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
    raise RuntimeError(f"the deployment was not ready within {START_TIMEOUT_S:.0f} s")


def run_pd_deployment(args: argparse.Namespace) -> int:
    """`args`: the `fastdeploy serve` flags (speculative config already set from --mtp)."""
    router_port, p_port, d_port = _free_port(), _free_port(), _free_port()
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    env_note = "" if args.pd_secret_file or os.environ.get("FD_PD_SECRET") else " (no PD secret)"
    router = _start("router", [sys.executable, "-m", "fastdeploy.router.launch", "--splitwise", "--host",
                               "127.0.0.1", "--port", str(router_port), "--health-interval-secs", str(HEARTBEAT_S)],
                    router_port)
    instances = [_start(f"{role} instance", _instance_argv(args, role, port, router_port), port)
                 for role, port in (("prefill", p_port), ("decode", d_port))]
    processes = [router, *instances]
    try:
        _wait_ready(router, instances, processes)
        print(f"ready: PD deployment of {args.model} at {router.url}/v1 (router; prefill {instances[0].url}, "
              f"decode {instances[1].url}){env_note}. Ctrl-C stops all three.", flush=True)
        while not stopping:
            exited = [p for p in processes if p.popen.poll() is not None]
            if exited:
                print(f"fastdeploy serve --pd: {exited[0].name} exited with status {exited[0].popen.returncode}; "
                      "stopping the others", file=sys.stderr)
                return 1
            time.sleep(0.2)
        return 0
    except RuntimeError as error:
        print(f"fastdeploy serve --pd: {error}", file=sys.stderr)
        return 1
    finally:
        _stop(processes)
