"""PD disaggregation in one process: a prefill instance P and a decode instance D joined by an InProcessTransport.

PD_MTP_FLOW §2–§7, SERVICES §6 and docs/design.md §6. The two halves are the ones the services run
(fastdeploy/engine/pd_prefill.py, pd_decode.py); they talk only through the transport. `PDEngine` adds the
router's part: it gives every request to both halves, takes D's request objects as the results, and aborts a
request on one half when the other failed it. Nothing here imports paddle.
"""
from __future__ import annotations


from fastdeploy.engine.pd_decode import DecodeInstance
from fastdeploy.engine.pd_prefill import PrefillInstance
from fastdeploy.engine.request import Request
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.splitwise import InProcessTransport


class PDEngine:
    """Steps P and then D in one thread; both halves share `transport` (and its clock)."""

    def __init__(self, prefill: PrefillInstance, decode: DecodeInstance, transport: InProcessTransport):
        if prefill.transport is not transport or decode.transport is not transport:
            raise ValueError("PDEngine: arguments 'prefill' and 'decode' must be built on argument 'transport'")
        self.prefill, self.decode, self.transport = prefill, decode, transport
        self._live: dict[str, Request] = {}     # D's object of every unfinished request, by id
        self._num_finished = 0

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    stop_seqs: tuple[tuple[int, ...], ...] = (), prompt: str | None = None) -> Request:
        """The router's send to both halves (SERVICES §6 steps 1 and 3); a bad request raises ValueError and is
        held by neither. Returns D's request: its outputs are the client's."""
        if request_id in self._live:
            raise ValueError(f"PDEngine.add_request: argument 'request_id' {request_id!r} is already in use")
        self.prefill.add_request(request_id, prompt_token_ids, params, stop_seqs, prompt=prompt)
        try:
            request = self.decode.add_request(request_id, prompt_token_ids, params, stop_seqs, prompt=prompt)
        except ValueError:
            self.prefill.abort(request_id)
            raise
        self._live[request_id] = request
        return request

    def step(self) -> list[Request]:
        """One step of P, then one of D; returns the requests that finished or failed in it (D's objects)."""
        for request in self.prefill.step():
            mine = self._live.get(request.request_id)
            if mine is None:
                continue
            if request.error is not None:     # P failed it: D frees its reservation now, not at its deadline
                self.decode.abort(request.request_id, request.error)
            else:
                mine.pd_timings.prefill_start_s = request.pd_timings.prefill_start_s
                mine.pd_timings.first_token_s = request.pd_timings.first_token_s
        done = self.decode.step(max_wait_s=0.0 if self.prefill.has_prefill_work() else None)
        for request in done:
            self.prefill.abort(request.request_id)     # D gave up before the hand-off: P stops too
            del self._live[request.request_id]
        self._num_finished += len(done)
        return done

    def has_unfinished(self) -> bool:
        return bool(self.prefill.has_unfinished() or self.decode.has_unfinished() or self.transport.num_in_flight()
                    or self.transport.num_pending_acks() or self.transport.num_pending_reservations())

    def has_peer_waits(self) -> bool:
        """True while some request waits on the other instance (progress then comes from a deadline)."""
        return self.prefill.has_peer_waits() or self.decode.has_peer_waits() or bool(self.transport.num_in_flight())

    @property
    def num_finished(self) -> int:
        """Requests finished or failed so far, on D or at receipt (a monotone progress count, engine/watchdog.py)."""
        return self._num_finished
