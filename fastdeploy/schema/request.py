"""Per-request state on the engine side, and the output handed back to the user."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

import msgspec

from fastdeploy.schema.sampling_params import SamplingParams


# Finish reasons (docs/glossary.md). Every request that did not complete ends with FINISH_ABORT, the cause in
# `Request.error`. FINISH_HANDED_OFF ends a request's part on a prefill instance once its hand-off to D is queued:
# internal to PD (the client's output and finish reason are D's), and the P response the router waits for
# (SERVICES §6 step 4).
FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_ABORT = "abort"
FINISH_HANDED_OFF = "handed_off"


class RequestIdInUseError(Exception):
    """A request id this instance still holds state for (a live request, or a PD hand-off, reservation or
    quarantine of that id not yet settled); the API server answers 409, not 400 (docs/serving.md, "Errors")."""


class RequestStatus(enum.Enum):
    WAITING = "waiting"                    # queued, holds no slot and no block
    WAITING_FOR_PEER = "waiting_for_peer"  # held for the other PD instance: on P until D's reservation comes (holds
                                           # nothing); on D while P computes the prompt (holds a slot and blocks)
    RUNNING = "running"                    # holds a slot and KV blocks (prefilling, decoding or parked)
    FINISHED = "finished"


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """The log probability of one output token and the most likely tokens at its position (docs/design.md §5,
    "Logprobs"): log_softmax in float64 of the target's raw logits (before EOS suppression, temperature and
    top-p) at the position that produced the token. A msgspec struct, so that the engine core's messages carry it
    as a compact array and check it on decode."""

    token_id: int
    logprob: float
    top_token_ids: tuple[int, ...] = ()      # [N] the N most likely ids, most likely first (ties: lower id first)
    top_logprobs: tuple[float, ...] = ()     # [N] their log probabilities

    def __post_init__(self):
        if isinstance(self.token_id, bool) or not isinstance(self.token_id, int) or self.token_id < 0:
            raise ValueError(f"TokenLogprob: field 'token_id' must be an int >= 0, got {self.token_id!r}")
        values = (self.logprob, *self.top_logprobs)
        if any(isinstance(v, bool) or not isinstance(v, float) or not math.isfinite(v) or v > 0 for v in values):
            raise ValueError(f"TokenLogprob: fields 'logprob' and 'top_logprobs' must be finite floats <= 0, got "
                             f"{self.logprob!r} and {self.top_logprobs!r}")
        if len(self.top_token_ids) != len(self.top_logprobs) or \
                any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in self.top_token_ids):
            raise ValueError(f"TokenLogprob: field 'top_token_ids' must be ints >= 0, one per top_logprobs entry, "
                             f"got {self.top_token_ids!r}")


@dataclass(slots=True)
class RequestMetrics:
    """Speculation counters of one request. A decode round is one target step over [last token + drafts]."""

    num_draft_tokens: int = 0                                  # drafts verified
    num_accepted_drafts: int = 0                               # sum over rounds of (tokens emitted - 1)
    num_decode_rounds: int = 0
    accepted_per_round: list[int] = field(default_factory=list)  # tokens emitted per decode round
    num_preemptions: int = 0

    @property
    def mean_accept_length(self) -> float:
        return sum(self.accepted_per_round) / len(self.accepted_per_round) if self.accepted_per_round else 0.0


@dataclass(slots=True)
class PDTimings:
    """Wall-clock points of one request under PD (time.perf_counter seconds); None where it did not get there."""

    arrival_s: float
    prefill_start_s: float | None = None     # D preallocated; P got the request
    first_token_s: float | None = None       # P's token processor recorded t0
    decode_start_s: float | None = None      # D accepted the hand-off
    finished_s: float | None = None

    @property
    def time_to_first_token_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def prefill_s(self) -> float | None:
        """P's part: from P getting the request to t0 (queueing on P included)."""
        if self.prefill_start_s is None or self.first_token_s is None:
            return None
        return self.first_token_s - self.prefill_start_s

    @property
    def decode_s(self) -> float | None:
        if self.decode_start_s is None or self.finished_s is None:
            return None
        return self.finished_s - self.decode_start_s


@dataclass(slots=True, eq=False)
class Request:
    """One request as the scheduler and the token processor see it.

    `prefill_len` is the number of known tokens (prompt + outputs already generated) the current residency
    must compute before it decodes: the prompt length at first admission, more after a preemption (PD_MTP_FLOW §7.2).
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: tuple[int, ...]            # model EOS ids + the request's stop_token_ids
    stop_seqs: tuple[tuple[int, ...], ...]    # stop strings as token ids
    arrival: int                              # admission order; preemption picks the newest
    prompt: str | None = None
    seed: int = 0                             # params.seed, or drawn at admission when it is None
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[TokenLogprob] = field(default_factory=list)   # one per output token when params.logprobs
                                                                        # is set, else empty
    status: RequestStatus = RequestStatus.WAITING
    slot: int | None = None
    block_ids: list[int] = field(default_factory=list)
    prefill_len: int = 0
    num_computed_tokens: int = 0              # known tokens whose KV is written in this residency
    num_cached_tokens: int = 0                # prompt tokens whose KV came from the prefix cache at the first
                                              # admission (the response's usage.prompt_tokens_details)
    block_keys: list[bytes] = field(default_factory=list)   # prefix-cache keys of the known tokens' leading blocks
    num_cached_blocks: int = 0                # leading blocks of block_ids the prefix cache names (this residency)
    is_parked: bool = False                   # the runner parked the slot for lack of a KV block
    is_preempting: bool = False               # a preempt task was sent; waiting for the -9 report
    is_aborting: bool = False                 # ... and the -9 report finishes it with "abort" (Scheduler.abort)
    finish_reason: str | None = None          # one of the FINISH_* reasons above
    error: str | None = None                  # why an "abort" request did not complete
    pair_mismatch: bool = False               # D: aborted because P's hand-off was made for another request than
                                              # D's (receipt step 1b): the pairing's fault, not the service's
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    # PD (set by the instance's KV connector at admission, docs/design.md §6):
    remote_decode: bool = False               # P: D decodes it, so its first token ends it here
    remote_prefill: bool = False              # D: P computes its prompt's KV (cleared once the hand-off is in)
    first_round_drafts: tuple[int, ...] = ()  # P: [t0] / [t0, d1] it handed off; D: the same, until its first round
    pd_timings: PDTimings | None = None       # PD requests only

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.prefill_len

    @property
    def known_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_decoded_positions(self) -> int:
        """seq_lens_decoder of a decoding slot: every known token but the last has its KV written."""
        return self.num_tokens - 1


@dataclass(slots=True)
class CompletionOutput:
    token_ids: list[int]      # generated tokens, including the terminating EOS / end token when there is one
    text: str                 # decoded tokens without EOS ids
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None = None   # one per token id when SamplingParams.logprobs is set


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: CompletionOutput
    metrics: RequestMetrics
    finished: bool
    error: str | None = None
    pd_timings: PDTimings | None = None    # LLM(splitwise=True) only
    num_cached_tokens: int = 0             # prompt tokens whose KV came from the prefix cache (under PD: D's)
