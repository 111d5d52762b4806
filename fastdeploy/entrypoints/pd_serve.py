"""Runs and supervises a local PD deployment: a router, `--num-prefill` prefill and `--num-decode` decode API
servers (1 and 1 by default) on loopback (SERVICES §2).

`fastdeploy serve --pd --model fd-tiny --mtp 1` starts `python -m fastdeploy.router.launch --splitwise` on `--port`
and the instances on free 127.0.0.1 ports (the instances register with the router, which pairs among all of
them), waits until the router lists every one as healthy, prints the router's URL and every instance's, and stops
them all on Ctrl-C or SIGTERM (SIGTERM, then SIGKILL
after a bounded wait); each child also gets SIGTERM if the supervisor itself dies. Once the deployment has been
ready, a child that exits on its own (an instance whose engine core died exits 1) is restarted on the same ports
after a backoff, at most `MAX_RESTARTS` times in a row; the restarted instance registers again and the router
pairs it again. A child that exits before the deployment is ready, or too often, stops everything: status 1.

Secrets never go on a child's command line (`ps` shows it): the API key travels as `FD_API_KEY` and the router's
registration secret as `FD_ROUTER_SECRET` (one is drawn for the deployment when neither it nor `FD_PD_SECRET` is
set, so that only this deployment's instances can register).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import httpx

from fastdeploy.entrypoints.openai.serve_args import EXIT_CANNOT_LISTEN, build_parser, cannot_listen, check_args
from fastdeploy.entrypoints.pd_budget import KVShares, share_host_budget
from fastdeploy.http.sockets import DEFAULT_KEEP_ALIVE_S, listen_socket

START_TIMEOUT_S = 300.0
# Stopping: each instance gets its --drain-timeout-s, plus this for the errors it then sends and its engine core's
# stop; the router is stopped after the instances (its streams have ended by then) and gets ROUTER_STOP_S.
STOP_GRACE_S = 15.0
ROUTER_STOP_S = 15.0
HEARTBEAT_S = 1.0
# Restarts: the n-th in a row waits BACKOFF_S * 2**(n-1), at most BACKOFF_MAX_S; a child that ran for
# STABLE_AFTER_S counts as healthy again (its next failure is the first in a row).
MAX_RESTARTS = 5
BACKOFF_S = 1.0
BACKOFF_MAX_S = 16.0
STABLE_AFTER_S = 60.0
POLL_S = 0.2
# Flags each instance takes over from `fastdeploy serve --pd` (the API server's own names). The API key is not
# one of them: it goes by environment.
INSTANCE_FLAGS = ("model", "tokenizer", "served_model_name", "chat_template", "max_num_seqs", "max_model_len",
                  "max_num_batched_tokens", "async_scheduling", "num_kv_blocks", "block_size", "speculative_config",
                  "ops_backend", "dtype", "quantization", "pd_secret_file", "pd_timeout_secs",
                  "cache_transfer_protocol", "mooncake_device", "max_concurrency", "log_level", "drain_timeout_s",
                  "pd_reservation_ack_timeout_secs", "enable_prefix_caching", "report_cached_tokens",
                  "pd_min_transfer_mbps", "generation_config", "mooncake_staging_slots")
# flags one role only takes (serve_args refuses them on the other)
ROLE_ONLY_FLAGS = {"pd_reservation_ack_timeout_secs": "decode", "mooncake_staging_slots": "prefill"}


def decode_slots(args: argparse.Namespace) -> int:
    """Each D's slots: --decode-max-num-seqs, else twice P's. A D computes no prompt, so a slot costs it only decode
    rounds; twice the slots of a mixed instance lets one D take the decode work of the two mixed instances that
    1 P + 1 D replaces, so a saturated D does not make requests wait between tokens (docs/design.md §8)."""
    return args.decode_max_num_seqs if args.decode_max_num_seqs is not None else 2 * args.max_num_seqs


def instance_flags_problem(args: argparse.Namespace, shares: KVShares | None = None) -> str | None:
    """The first problem a prefill or decode instance would refuse its flags for (one line), found before anything
    starts: each role's command line is parsed and checked as that instance's API server would."""
    for role in ("prefill", "decode"):
        argv = _instance_argv(args, role, port=1, router_port=1, shares=shares)
        problem = check_args(build_parser().parse_args(argv[3:]))   # after `python -m <module>`
        if problem is not None:
            return problem
    return None


def exit_description(status: int) -> str:
    """How a child ended, as a person reads it: "exited with status 2", "was killed by SIGKILL"."""
    if status >= 0:
        return f"exited with status {status}"
    try:
        return f"was killed by {signal.Signals(-status).name}"
    except ValueError:
        return f"was killed by signal {-status}"


def log(message: str) -> None:
    print(f"fastdeploy serve --pd: {message}", file=sys.stderr, flush=True)


@dataclass
class _Child:
    """One supervised process: how to start it, and its restart bookkeeping."""

    name: str
    argv: list[str]
    port: int
    env: dict[str, str]
    host: str = "127.0.0.1"                  # the address it listens on
    popen: subprocess.Popen | None = None
    started_at: float = 0.0
    failures_in_a_row: int = 0
    restart_at: float | None = None          # set while it waits for its backoff to pass

    @property
    def url(self) -> str:
        """Where this supervisor reaches it (loopback when it listens on every interface)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def start(self) -> None:
        # Own session: Ctrl-C in the terminal reaches only this supervisor, which stops the children in order.
        self.popen = subprocess.Popen(self.argv, env=self.env, start_new_session=True, preexec_fn=_die_with_parent,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.started_at = time.monotonic()
        # "[prefill]", "[decode 1]", "[router]": one prefix per child, numbered when a role has several
        threading.Thread(target=_relay_output, args=(self.popen.stdout, f"[{self.name.replace(' instance', '')}] "),
                         daemon=True).start()

    def exited(self) -> int | None:
        return None if self.popen is None else self.popen.poll()


def _relay_output(pipe, prefix: str) -> None:
    """Copies a child's output to this process's stderr, each line prefixed with the child's name, so that the
    lines of P, D and the router can be told apart."""
    with pipe:
        for line in pipe:
            sys.stderr.buffer.write(prefix.encode() + line)
            sys.stderr.buffer.flush()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec (Linux): SIGTERM when the supervisor dies, so no child outlives it."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _children_env(args: argparse.Namespace) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}   # their lines reach the relay as they are written
    if args.api_key:
        env["FD_API_KEY"] = args.api_key
    if not env.get("FD_ROUTER_SECRET") and not env.get("FD_PD_SECRET"):
        env["FD_ROUTER_SECRET"] = secrets.token_hex(32)
    return env


def instance_counts(args: argparse.Namespace) -> dict[str, int]:
    return {"prefill": getattr(args, "num_prefill", None) or 1, "decode": getattr(args, "num_decode", None) or 1}


def kv_shares(args: argparse.Namespace) -> KVShares | None:
    """The host's KV budget shared among the instances (entrypoints/pd_budget.py); ValueError: one line."""
    counts = instance_counts(args)
    return share_host_budget(args, counts["prefill"], counts["decode"], decode_slots(args))


def _instance_argv(args: argparse.Namespace, role: str, port: int, router_port: int,
                   shares: KVShares | None = None) -> list[str]:
    # No --pd-comm-port: each connector binds a port of its own choosing and registers it (no free-port race).
    argv = [sys.executable, "-m", "fastdeploy.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port",
            str(port), "--splitwise-role", role, "--router",
            f"127.0.0.1:{router_port}", "--health-interval-secs", str(HEARTBEAT_S)]
    for name in INSTANCE_FLAGS:
        if ROLE_ONLY_FLAGS.get(name, role) != role:
            continue
        value = decode_slots(args) if role == "decode" and name == "max_num_seqs" else getattr(args, name)
        flag = name.replace("_", "-")
        if isinstance(value, bool):        # a BooleanOptionalAction flag: --name / --no-name
            argv.append(f"--{flag}" if value else f"--no-{flag}")
        elif isinstance(value, list):      # nargs="+" (--served-model-name)
            argv += [f"--{flag}", *map(str, value)]
        elif value not in (None, ""):
            argv += [f"--{flag}", str(value)]
    return argv if shares is None else argv + shares.flags(role)   # the last --max-model-len wins


def _stop(children: list[_Child], drain_s: float) -> None:
    """SIGTERM to the instances, which drain (docs/serving.md "Supervision"), then to the router; SIGKILL for any
    that outlives its bound."""
    instances = [c for c in children if c.name != "router"]
    _stop_wave(instances, drain_s + STOP_GRACE_S)
    _stop_wave([c for c in children if c.name == "router"], ROUTER_STOP_S)


def _stop_wave(children: list[_Child], timeout_s: float) -> None:
    running = [c for c in children if c.exited() is None and c.popen is not None]
    for child in running:
        child.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for child in running:
        try:
            child.popen.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            log(f"{child.name} still running {timeout_s:g} s after SIGTERM; killing it")
            child.popen.kill()
            child.popen.wait()


def _wait_ready(router: _Child, instances: list[_Child], children: list[_Child], stopping: list) -> None:
    """Every instance answers /health and the router lists every one as healthy; RuntimeError if one exits first."""
    deadline = time.monotonic() + START_TIMEOUT_S
    wanted = {c.port for c in instances}
    with httpx.Client(timeout=2.0) as http:
        while time.monotonic() < deadline and not stopping:
            for child in children:
                if child.exited() is not None:
                    raise RuntimeError(f"{child.name} {exit_description(child.exited())} while starting")
            try:
                rows = http.get(f"{router.url}/registered").json().get("instances", [])
                if wanted <= {row["port"] for row in rows if row.get("healthy")}:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
    if not stopping:
        raise RuntimeError(f"the deployment was not ready within {START_TIMEOUT_S:.0f} s")


def _supervise_once(child: _Child, now: float) -> None:
    """Notice an exit and schedule the restart, or restart once the backoff has passed; RuntimeError when the
    child failed MAX_RESTARTS times in a row."""
    if child.restart_at is not None:
        if now >= child.restart_at:
            child.restart_at = None
            child.start()
            log(f"{child.name} restarted (pid {child.popen.pid}, attempt {child.failures_in_a_row} of "
                f"{MAX_RESTARTS})")
        return
    status = child.exited()
    if status is None:
        return
    if now - child.started_at >= STABLE_AFTER_S:
        child.failures_in_a_row = 0
    if child.failures_in_a_row >= MAX_RESTARTS:
        raise RuntimeError(f"{child.name} {exit_description(status)} after {MAX_RESTARTS} restarts in a row; "
                           "giving up")
    child.failures_in_a_row += 1
    delay = min(BACKOFF_S * 2 ** (child.failures_in_a_row - 1), BACKOFF_MAX_S)
    child.restart_at = now + delay
    log(f"{child.name} {exit_description(status)}; restarting in {delay:g} s")


def router_child(host: str, port: int, env: dict[str, str], keep_alive_s: float = DEFAULT_KEEP_ALIVE_S) -> _Child:
    """The router, the clients' server: it takes --timeout-keep-alive (the instances serve only the router)."""
    return _Child("router", [sys.executable, "-m", "fastdeploy.router.launch", "--splitwise", "--host", host,
                             "--port", str(port), "--health-interval-secs", str(HEARTBEAT_S),
                             "--timeout-keep-alive", str(keep_alive_s)], port, env, host=host)


def _instances(args: argparse.Namespace, router_port: int, env: dict[str, str],
               shares: KVShares | None) -> list[_Child]:
    """The P and D children, each on its own free ports: "prefill instance" and "decode instance" when there is
    one of a role (the names of a 1 P + 1 D deployment), numbered from 0 otherwise."""
    counts = instance_counts(args)
    children = []
    for role, count in counts.items():
        for index in range(count):
            name = f"{role} instance" if count == 1 else f"{role} instance {index}"
            port = _free_port()
            children.append(_Child(name, _instance_argv(args, role, port, router_port, shares), port, env))
    return children


def run_pd_deployment(args: argparse.Namespace) -> int:
    """`args`: the `fastdeploy serve` flags (speculative config already set from --mtp); the router listens on
    `args.host` (127.0.0.1 unless given) : `args.port`, the instances on loopback (only the router reaches them)."""
    router_port, router_host = args.port, args.host or "127.0.0.1"
    try:
        shares = kv_shares(args)
    except ValueError as error:
        log(f"error: {error}")
        return 2
    problem = instance_flags_problem(args, shares)
    if problem is not None:   # one line, as `fastdeploy serve` alone gives, and nothing started
        log(f"error: {problem}")
        return 2
    if shares is not None:
        log(shares.line)
    try:   # the router binds it: a busy port is one line now, not a router that fails after its siblings load
        listen_socket(router_host, router_port).close()
    except OSError as error:
        log(f"error: {cannot_listen(router_host, router_port, error)}")
        return EXIT_CANNOT_LISTEN
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    env = _children_env(args)
    env_note = "" if args.pd_secret_file or os.environ.get("FD_PD_SECRET") else " (no PD secret)"
    router = router_child(router_host, router_port, env, args.timeout_keep_alive)
    instances = _instances(args, router_port, env, shares)
    children = [router, *instances]
    try:
        for child in children:
            child.start()
        _wait_ready(router, instances, children, stopping)
        if stopping:
            return 0
        listed = ", ".join(f"{child.name.replace(' instance', '')} {child.url}" for child in instances)
        print(f"ready: PD deployment of {args.model} at {router.url}/v1 (router; {listed}){env_note}. Ctrl-C stops "
              f"all {len(children)}.", flush=True)
        while not stopping:
            now = time.monotonic()
            for child in children:
                _supervise_once(child, now)
            time.sleep(POLL_S)
        return 0
    except RuntimeError as error:
        log(str(error))
        return 1
    finally:
        _stop(children, args.drain_timeout_s)
