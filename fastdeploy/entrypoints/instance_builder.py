"""Builds the engine instance an engine core hosts from the API server's parsed flags (`build_instance`).

This is the Paddle side of the engine core: the core imports it by name at process start. Every role is one
LLMEngine: `--splitwise-role mixed` computes and decodes every request itself (PD_MTP_FLOW §1's single instance);
`prefill` and `decode` plug in their KV connector (docs/design.md §6) over the ZeroMQ transport bound to
`--host:--pd-comm-port` (docs/design.md §8; a free port when the flag is absent), keyed with `--pd-secret-file` or
FD_PD_SECRET.
"""
from __future__ import annotations

import argparse

import blake3

from fastdeploy.engine.engine import LLMEngine
from fastdeploy.entrypoints.openai.advertise import advertised_host
from fastdeploy.entrypoints.openai.serve_args import config_from_args
from fastdeploy.entrypoints.pd_builder import build_engine
from fastdeploy.model_executor.models import get_model
from fastdeploy.splitwise import HandoffDeadlines
from fastdeploy.splitwise.secret import load_pd_secret
from fastdeploy.splitwise.zmq_transport import ZmqTransport


def build_instance(args: argparse.Namespace) -> LLMEngine:
    config = config_from_args(args)
    model = get_model(config.model, dtype=config.dtype, speculative=config.speculative,
                      quantization=config.quantization)
    if config.role == "mixed":
        return build_engine(config, model)
    transport = ZmqTransport(listen=f"{args.host}:{args.pd_comm_port or 0}",
                             secret=load_pd_secret(args.pd_secret_file),
                             max_model_len=config.scheduler.max_model_len)   # sizes ZMQ_MAXMSGSIZE
    deadlines = pd_deadlines(args.pd_timeout_secs, args.pd_reservation_ack_timeout_secs, args.pd_min_transfer_mbps)
    return build_engine(config, model, transport, deadlines=deadlines,
                        transfer_host=advertised_host(args), mooncake_device=args.mooncake_device,
                        staging_slots=args.mooncake_staging_slots,
                        chat_template=chat_template_identity(args.chat_template))


def chat_template_identity(path: str | None) -> str:
    """What names the chat template in the config hash: the BLAKE3 of its --chat-template file, or "built-in" for
    the model's own (the embedded template, or a checkpoint's, which the tokenizer's identity already digests)."""
    if path is None:
        return "built-in"
    with open(path, "rb") as handle:   # serve_args checked it is readable
        return "blake3:" + blake3.blake3(handle.read()).hexdigest(16)


def pd_deadlines(timeout_s: float | None, reservation_ack_s: float | None = None,
                 min_transfer_mbps: float | None = None) -> HandoffDeadlines:
    """--pd-timeout-secs: every hand-off wait that long; the reservation match longer, since it spans the decode
    allocation that precedes D's reservation (docs/design.md §6). --pd-reservation-ack-timeout-secs: how long D
    waits for P to acknowledge a reservation (docs/design.md §8). --pd-min-transfer-mbps: the floor rate the
    waits the KV moves in are scaled at (SERVICES §6)."""
    ack = {} if reservation_ack_s is None else {"reservation_ack_s": reservation_ack_s}
    if min_transfer_mbps is not None:
        ack["min_transfer_mbps"] = min_transfer_mbps
    if timeout_s is None:
        return HandoffDeadlines(**ack)
    return HandoffDeadlines(decode_allocation_s=timeout_s, kv_transfer_s=timeout_s, prefill_result_s=timeout_s,
                            reservation_s=1.5 * timeout_s, **ack)
