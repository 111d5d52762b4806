"""The sampling values a P→D hand-off carries (PD_MTP_FLOW §3): exactly what P used for the request, checked by
SamplingParams' rules, and the field checks the hand-off message shares (handoff.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.schema.request import Request
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.splitwise.wire import HandoffDecodeError

__all__ = ["HandoffSamplingParams", "require_ids", "require_int"]


def require_int(owner: str, name: str, value: object, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{owner}: field '{name}' must be an int (got {type(value).__name__} {value!r})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{owner}: field '{name}' must be >= {minimum} (got {value})")
    return int(value)


def require_ids(owner: str, name: str, values: object) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise ValueError(f"{owner}: field '{name}' must be a sequence of token ids (got {type(values).__name__})")
    if isinstance(values, (list, tuple)) and all(type(v) is int for v in values) and min(values, default=0) >= 0:
        return tuple(values)   # the common case, checked in one pass (a long prompt is thousands of ids)
    return tuple(require_int(owner, f"{name}[{i}]", v, minimum=0) for i, v in enumerate(values))


# The float/int sampling controls a hand-off carries, checked and normalised by SamplingParams' rules
_CONTROLS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty")


@dataclass(frozen=True, slots=True)
class HandoffSamplingParams:
    """Exactly the sampling values P used for the request (PD_MTP_FLOW §3); D accepts the hand-off only when they
    are its own request's (receipt.py `RequestExpectation`).

    `eos_token_ids` is the resolved set the request finishes on (the model's EOS ids plus the request's
    stop_token_ids); `stop_seqs` are the stop sequences as token-id lists. `max_tokens` and `min_tokens` count t0.
    `seed` is the seed P sampled with (the request's, or the one P drew for it). The scalar values obey
    SamplingParams' rules (one set of rules: they are checked by constructing one).
    """

    max_tokens: int
    min_tokens: int = 0
    stop_seqs: tuple[tuple[int, ...], ...] = ()
    eos_token_ids: tuple[int, ...] = ()
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    logprobs: int | None = None
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    def __post_init__(self) -> None:
        owner = "HandoffSamplingParams"
        set_ = object.__setattr__  # frozen dataclass: normalise in place once, here
        if isinstance(self.stop_seqs, (str, bytes)) or not isinstance(self.stop_seqs, Sequence):
            raise ValueError(f"{owner}: field 'stop_seqs' must be a sequence of token-id lists")
        stop_seqs = tuple(require_ids(owner, f"stop_seqs[{i}]", s) for i, s in enumerate(self.stop_seqs))
        if any(len(s) == 0 for s in stop_seqs):
            raise ValueError(f"{owner}: field 'stop_seqs' must not contain an empty sequence")
        set_(self, "stop_seqs", stop_seqs)
        set_(self, "eos_token_ids", require_ids(owner, "eos_token_ids", self.eos_token_ids))
        try:
            checked = SamplingParams(max_tokens=self.max_tokens, min_tokens=self.min_tokens, seed=self.seed,
                                     logprobs=self.logprobs, **{name: getattr(self, name) for name in _CONTROLS})
        except ValueError as error:
            raise ValueError(str(error).replace("SamplingParams:", f"{owner}:", 1)) from None
        for name in _CONTROLS:
            set_(self, name, getattr(checked, name))

    @classmethod
    def of_request(cls, request: Request, seed: int | None) -> HandoffSamplingParams:
        """The values of `request` (its resolved EOS set and stop sequences), with `seed`."""
        params = request.params
        return cls(max_tokens=params.max_tokens, min_tokens=params.min_tokens, stop_seqs=request.stop_seqs,
                   eos_token_ids=request.eos_token_ids, seed=seed, logprobs=params.logprobs,
                   **{name: getattr(params, name) for name in _CONTROLS})

    def to_json(self) -> dict[str, Any]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**fields, "stop_seqs": [list(s) for s in self.stop_seqs], "eos_token_ids": list(self.eos_token_ids)}

    @classmethod
    def from_json(cls, obj: object) -> HandoffSamplingParams:
        expected = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(obj, dict) or set(obj) != expected:
            got = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
            raise HandoffDecodeError(f"handoff decode: field 'sampling' must have keys {sorted(expected)} (got {got})")
        try:
            return cls(**obj)
        except ValueError as exc:
            raise HandoffDecodeError(f"handoff decode: {exc}") from exc
