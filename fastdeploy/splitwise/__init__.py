"""P→D connector (splitwise): the hand-off P sends D, its checks on receipt, its transport and its deadlines.

See docs/design.md §4 for how the engine drives it (PD_MTP_FLOW §2–§5, I10). Framework-free: NumPy only.
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
from fastdeploy.splitwise.handoff import HandoffDecodeError, HandoffMessage, HandoffSamplingParams, Payload
from fastdeploy.splitwise.integrity import PROTOCOL_VERSION, config_hash, integrity_tag
from fastdeploy.splitwise.receipt import (
    FinishAtReceipt,
    Insert,
    KVLayout,
    ReceiptCheck,
    ReceiptVerdict,
    Reject,
    check_receipt,
    receive_handoff,
)
from fastdeploy.splitwise.transport import (
    Envelope,
    HandoffTransport,
    InProcessTransport,
    TransportFullError,
)

__all__ = [
    "PROTOCOL_VERSION",
    "Clock",
    "Deadline",
    "Envelope",
    "ExpiredWait",
    "FinishAtReceipt",
    "HandoffDeadlines",
    "HandoffDecodeError",
    "HandoffMessage",
    "HandoffSamplingParams",
    "HandoffTransport",
    "InProcessTransport",
    "Insert",
    "KVLayout",
    "MonotonicClock",
    "Payload",
    "PendingWaits",
    "ReceiptCheck",
    "ReceiptVerdict",
    "Reject",
    "TransportFullError",
    "WaitKind",
    "check_receipt",
    "config_hash",
    "integrity_tag",
    "receive_handoff",
]
