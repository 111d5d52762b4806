"""P→D connector (splitwise): the hand-off P sends D, its checks on receipt, its transport and its deadlines.

See docs/design.md §4 for how the engine drives it (PD_MTP_FLOW §2–§5, I10). Framework-free: NumPy and BLAKE3 (the
ZeroMQ and Mooncake transports add pyzmq and, optionally, the Mooncake transfer engine).
"""

from fastdeploy.splitwise.deadline import (
    Clock,
    Deadline,
    ExpiredWait,
    HandoffDeadlines,
    MonotonicClock,
    PendingWaits,
    WaitKind,
)
from fastdeploy.splitwise.handoff import (
    HandoffDecodeError,
    HandoffMessage,
    HandoffSamplingParams,
    KVSpec,
    Payload,
    PlacedKV,
)
from fastdeploy.splitwise.integrity import PROTOCOL_VERSION, TRANSPORTS, HandoffKey, config_hash, integrity_tag
from fastdeploy.splitwise.receipt import (
    FinishAtReceipt,
    InPlaceKV,
    Insert,
    KVLayout,
    ReceiptCheck,
    ReceiptVerdict,
    Reject,
    RequestExpectation,
    check_receipt,
    receive_handoff,
)
from fastdeploy.splitwise.transport import (
    Envelope,
    HandoffTransport,
    InProcessTransport,
    Reservation,
    TransportFullError,
)

__all__ = [
    "PROTOCOL_VERSION",
    "TRANSPORTS",
    "Clock",
    "Deadline",
    "Envelope",
    "ExpiredWait",
    "FinishAtReceipt",
    "HandoffDeadlines",
    "HandoffKey",
    "HandoffDecodeError",
    "HandoffMessage",
    "HandoffSamplingParams",
    "HandoffTransport",
    "InPlaceKV",
    "InProcessTransport",
    "Insert",
    "KVLayout",
    "KVSpec",
    "MonotonicClock",
    "Payload",
    "PendingWaits",
    "PlacedKV",
    "ReceiptCheck",
    "ReceiptVerdict",
    "Reject",
    "RequestExpectation",
    "Reservation",
    "TransportFullError",
    "WaitKind",
    "check_receipt",
    "config_hash",
    "integrity_tag",
    "receive_handoff",
]
