"""What ZmqTransport's I/O thread does with a message it received (SERVICES §7): P takes in D's reservations and
acknowledgements (binding each request's route to its first reserver, zmq_routes.py), D takes in P's acceptances,
refusals and hand-offs (only from the P it reserved at, with that reservation's nonce, once). Every message goes
through `peer_message.open_message`, which cannot raise; one that is not the receiver's to take is refused (logged
and counted), and an error in its handling refuses that message only.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

import msgspec
import zmq

from fastdeploy.splitwise.integrity import canonical_json
from fastdeploy.splitwise.peer_message import (ACCEPT, ACK, BAD_TAG, END, HANDOFF, KV, REFUSE, RESERVE, STREAM,
                                               Opened, Refused, decode_data, open_message)
from fastdeploy.splitwise.transport import Envelope, PeerUnreachableError, Reservation, TransportFullError

logger = logging.getLogger("fastdeploy.splitwise.zmq_transport")   # one logger for the whole connector

_BATCH = 64               # messages taken from one socket per loop turn (posted calls run between batches)
_REASON_TEXT = {"bad_tag": BAD_TAG, "duplicate": "another reservation of this request id is in progress there",
                "replayed": "the reservation was replayed", "version": "another protocol version",
                "malformed": "the reservation is malformed", "oversized": "the reservation is too large",
                "full": "P holds as many reservations as it may (of this D, or of all)",
                "abandoned": "P will not write: the request ended on P before its hand-off started",
                "expired": "P will not write: the request did not come to P within the reservation deadline"}


class ReceivingHalf:
    """Mixed into ZmqTransport: it provides `_router`, `_dealers`, `_routes`, `_reserved`, `_tagger`, `_mail` and
    its queues (`_reservations`, `_acks`, `_accepted`, `_handoffs`), `_refusals`, `_send`, `_require_router`,
    `_stream_message`, `_start_receiving`, `_landings` and `_landing_lock`."""

    # ---- internals: P receives ----

    def _drain_router(self) -> bool:
        """Take in at most `_BATCH` messages; True when the batch ended with the socket not read empty."""
        router = self._router
        for _ in range(_BATCH):
            with self._mail.cond:
                if len(self._reservations) >= self._queue_capacity or len(self._acks) >= self._queue_capacity:
                    return False
            try:
                parts = router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return False
            identity, sender = parts[0].bytes, _sender("D", parts)
            self._guarded(sender, lambda: self._from_d(identity, sender, parts[1:]))
        return True

    def _from_d(self, identity: bytes, sender: str, parts: list) -> None:
        message = open_message(parts, sender, self._tagger)
        if isinstance(message, Refused):
            self._refusals.refuse(message.reason, message.request_id, message.why)
            if message.kind == RESERVE and message.request_id is not None:
                self._answer_refusal(identity, message.request_id, message.nonce, message.reason)
        elif message.kind == RESERVE:
            self._reserved_by(identity, sender, message)
        elif message.kind == ACK:
            route = self._routes.get(message.request_id)
            if route is None or not route.sent or route.nonce != message.nonce:
                self._refusals.refuse("stale", message.request_id,
                                      f"an ack from {sender} for no hand-off of its reservation awaiting one")
                return
            self._routes.drop(message.request_id)
            self._mail.put(self._acks, message.request_id)
        else:
            self._refusals.refuse("unexpected_kind", message.request_id, f"a {message.kind} from {sender}")

    def _reserved_by(self, identity: bytes, sender: str, message: Opened) -> None:
        rid, nonce = message.request_id, message.nonce
        if self._routes.is_replay(nonce):
            self._refusals.refuse("replayed", rid, f"a reservation from {sender} whose nonce was used before")
            return
        encoded = bytes(message.body[0]) if message.body else None
        if encoded is not None and decode_data(message.body[0]) is None:   # checked, then kept as it came
            self._refusals.refuse("malformed", rid,
                                  f"a reservation from {sender} whose data is not a JSON object")
            self._answer_refusal(identity, rid, nonce, "malformed")
            return
        if rid in self._routes:   # the route stays with the first reserver until its ack or until P forgets it
            self._refusals.refuse("duplicate", rid,
                                  f"a reservation from {sender} for a request another reservation holds")
            self._answer_refusal(identity, rid, nonce, "duplicate")
            return
        nbytes = len(encoded or b"")
        full = self._routes.full(identity, nbytes)
        if full is not None:   # routes are never evicted: each may have a hand-off owed (SERVICES §7)
            self._refusals.refuse("full", rid, f"a reservation from {sender} while P holds {full}")
            self._answer_refusal(identity, rid, nonce, "full")
            return
        self._routes.add(rid, identity, nonce, nbytes)
        self._mail.put(self._reservations, Reservation(rid, encoded))
        self._answer(identity, ACCEPT, rid, nonce, ())

    def _answer_refusal(self, identity: bytes, rid: str, nonce: str, reason: str) -> None:
        """Tell the D that sent a reservation P refuses, so it fails that request at once (its own: D takes a
        refusal only with its reservation's nonce)."""
        self._answer(identity, REFUSE, rid, nonce, (canonical_json({"reason": reason}),))

    def _answer(self, identity: bytes, kind: str, rid: str, nonce: str, body: Sequence) -> None:
        try:
            self._send(self._require_router("send"), kind, rid, nonce, body, identity)
        except (TransportFullError, PeerUnreachableError):
            pass   # that D is gone or flooding: it fails the request at its own deadline

    # ---- internals: D receives ----

    def _drain_dealer(self, addr: str, socket: zmq.Socket) -> bool:
        """Take in at most `_BATCH` messages; True when the batch ended with the socket not read empty."""
        sender = f"P at {addr}"
        for _ in range(_BATCH):
            with self._mail.cond:
                if len(self._handoffs) >= self._queue_capacity:
                    return False
            try:
                parts = socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return False
            self._guarded(sender, lambda: self._from_p(addr, sender, parts))
            if self._dealers.sockets.get(addr) is not socket:   # its handling closed the socket
                return False
        return True

    def _from_p(self, addr: str, sender: str, parts: list) -> None:
        message = open_message(parts, sender, self._tagger)
        rid = message.request_id
        reserved = self._reserved.get(rid) if rid is not None else None
        own = reserved is not None and reserved.addr == addr and not reserved.answered
        if isinstance(message, Refused):
            self._refusals.refuse(message.reason, rid, message.why)
            if own and message.reason in ("bad_tag", "version"):   # that P cannot talk to D: fail at once
                error = BAD_TAG if message.reason == "bad_tag" else message.why
                self._deliver(rid, Envelope(rid, (), error=error))
            return
        if message.kind in (KV, END):
            self._stream_message(addr, sender, message)
        elif message.kind not in (ACCEPT, HANDOFF, REFUSE, STREAM):
            self._refusals.refuse("unexpected_kind", rid, f"a {message.kind} from {sender}")
        elif not own or message.nonce != reserved.nonce or (message.kind == ACCEPT and reserved.accepted):
            self._refusals.refuse("stale", rid, f"a {message.kind} from {sender} for no reservation of D's awaiting "
                                                "one (another P, another nonce, or answered already)")
        elif message.kind == ACCEPT:
            reserved.accepted = True
            self._mail.put(self._accepted, rid)
        elif message.kind == REFUSE:
            why = _refusal_reason(message.body)
            self._deliver(rid, Envelope(rid, (), error=f"{sender} refused the reservation: {why}"))
        elif message.kind == STREAM:
            self._start_receiving(addr, sender, reserved, message)
        else:
            self._deliver(rid, Envelope(rid, tuple(message.body)))
            self.num_handoffs_received += 1

    def _deliver(self, rid: str, envelope: Envelope) -> None:
        """Hand P's answer for one of D's reservations to the engine's thread; its blocks are no longer
        written."""
        reserved = self._reserved.get(rid)
        if reserved is not None:
            reserved.answered = True
        with self._landing_lock:
            self._landings.pop(rid, None)
        self._mail.put(self._handoffs, envelope)

    # ---- internals: refusals ----

    def _guarded(self, sender: str, handle) -> None:
        """Handle one received message; an error in its handling refuses that message only."""
        try:
            handle()
        except Exception:   # noqa: BLE001 - nothing a peer sends may stop the instance
            logger.exception("PD connector: a message from %s could not be handled", sender)
            self._refusals.count("internal")


def _sender(role: str, parts: list) -> str:
    """How a log names the peer a message came from: its role, its address, the identity libzmq gave it."""
    try:
        address = parts[1].get("Peer-Address") if len(parts) > 1 else "?"
    except (zmq.ZMQError, AttributeError):
        address = "?"
    return f"{role} at {address} (identity {parts[0].bytes.hex()[:12]})"


def _refusal_reason(body: list) -> str:
    """The text of P's refusal reason (a known reason's text; unknown ones are named, not trusted)."""
    try:
        reason = msgspec.json.decode(body[0]).get("reason") if body else None
    except (msgspec.DecodeError, AttributeError):
        reason = None
    return _REASON_TEXT.get(reason, f"reason {reason!r:.40}") if isinstance(reason, str) else "no reason given"
