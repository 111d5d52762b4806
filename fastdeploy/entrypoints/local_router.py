"""The router's part of PD for two instances in one process (`LLM(splitwise=True)`, `fastdeploy generate --pd`).

PD_MTP_FLOW §1 and SERVICES §6 steps 1 and 3, as fastdeploy/router does it between services: every request goes
to the prefill instance P and to the decode instance D, D's request object is the client's result, and when one
instance fails a request the other is told to abort it. P and D are ordinary `LLMEngine`s with their connectors,
joined by an `InProcessTransport`; this class adds no instance surface of its own.
"""
from __future__ import annotations

from fastdeploy.engine.engine import LLMEngine
from fastdeploy.schema.request import Request
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.splitwise import InProcessTransport


class LocalPDRouter:
    """Steps P and then D in one thread; both connectors share `transport` (and its clock)."""

    def __init__(self, prefill: LLMEngine, decode: LLMEngine, transport: InProcessTransport):
        if (prefill.role, decode.role) != ("prefill", "decode"):
            raise ValueError(f"LocalPDRouter: arguments 'prefill' and 'decode' must have those roles, got "
                             f"{prefill.role!r} and {decode.role!r}")
        self.prefill, self.decode, self.transport = prefill, decode, transport
        self.engines = (prefill, decode)
        self._live: dict[str, Request] = {}     # D's object of every unfinished request, by id

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    stop_seqs: tuple[tuple[int, ...], ...] = (), prompt: str | None = None) -> Request:
        """The router's send to both instances; a bad request raises ValueError and is held by neither. Returns
        D's request: its outputs are the client's."""
        info = {"request_id": request_id}
        self.prefill.add_request(request_id, prompt_token_ids, params, stop_seqs, prompt, disaggregate_info=info)
        try:
            request = self.decode.add_request(request_id, prompt_token_ids, params, stop_seqs, prompt,
                                              disaggregate_info=info)
        except ValueError:
            self.prefill.abort(request_id)
            raise
        self._live[request_id] = request
        return request

    def abort(self, request_id: str, error: str | None = None) -> bool:
        """The router's abort: both instances stop the request (D's object reports it)."""
        self.prefill.abort(request_id, error)
        return self.decode.abort(request_id, error)

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
        done = self.decode.step(max_wait_s=0.0 if self.prefill.scheduler.has_local_work() else None)
        for request in done:
            self.prefill.abort(request.request_id)     # D gave up before the hand-off: P stops too
            del self._live[request.request_id]
        return done

    def has_unfinished(self) -> bool:
        return bool(self.prefill.has_unfinished() or self.decode.has_unfinished() or self.transport.num_in_flight()
                    or self.transport.num_pending_acks() or self.transport.num_pending_reservations())
