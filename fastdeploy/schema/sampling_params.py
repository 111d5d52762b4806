"""Per-request sampling parameters, validated at construction so a bad request fails at the call."""
from __future__ import annotations

import math
from dataclasses import dataclass


# The most alternatives a request may ask for per token (OpenAI's bound on chat `top_logprobs`).
MAX_LOGPROBS = 20
MAX_CACHE_SALT = 1024


def _fail(name: str, what: str, value) -> None:
    raise ValueError(f"SamplingParams: field '{name}' {what}, got {value!r}")


@dataclass(slots=True)
class SamplingParams:
    """temperature 0 is greedy. With temperature > 0 the token at output index i is drawn from the target
    distribution with a generator seeded by (seed, i), so a given seed yields the same output with and
    without speculation (docs/design.md, "Serving slice").

    `logprobs` None returns no log probabilities; N in 0..MAX_LOGPROBS returns, for every output token, its log
    probability and the N most likely tokens at its position, from the target's raw distribution (docs/design.md
    §5, "Logprobs")."""

    temperature: float = 0.0
    top_p: float = 1.0
    # docs/serving.md "Sampling controls": 0 or -1 top_k = every token (vLLM and FastDeploy); 0 min_p = off;
    # repetition_penalty 1, frequency_penalty 0, presence_penalty 0 leave the logits unchanged
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    max_tokens: int = 16
    min_tokens: int = 0
    stop: tuple[str, ...] | list[str] | str | None = None
    stop_token_ids: tuple[int, ...] | list[int] | None = None
    seed: int | None = None
    include_stop_str_in_output: bool = False   # False: the returned text ends before the stop string (OpenAI)
    ignore_eos: bool = False                   # the model's EOS ids do not end the request (stop_token_ids still do)
    logprobs: int | None = None
    # vLLM's per-request prefix-cache salt: mixed into the key of the request's first block, so requests with
    # different salts never share a cached block (and `cached_tokens` tells no client about another's prompt)
    cache_salt: str | None = None

    def __post_init__(self):
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not math.isfinite(self.temperature) or self.temperature < 0:
            _fail("temperature", "must be a finite number >= 0", self.temperature)
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            _fail("top_p", "must be in (0, 1]", self.top_p)
        self._check_controls()
        for name, minimum in (("max_tokens", 1), ("min_tokens", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                _fail(name, f"must be an int >= {minimum}", value)
        if self.min_tokens > self.max_tokens:
            _fail("min_tokens", f"must be <= max_tokens ({self.max_tokens})", self.min_tokens)
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if any(not isinstance(s, str) or not s for s in stop):
            _fail("stop", "must be a non-empty string or a list of them", self.stop)
        self.stop = stop
        ids = tuple(self.stop_token_ids or ())
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in ids):
            _fail("stop_token_ids", "must be a list of non-negative ints", self.stop_token_ids)
        self.stop_token_ids = ids
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or self.seed < 0):
            _fail("seed", "must be None or an int >= 0", self.seed)
        for name in ("include_stop_str_in_output", "ignore_eos"):
            if not isinstance(getattr(self, name), bool):
                _fail(name, "must be a bool", getattr(self, name))
        if self.ignore_eos and stop:
            # a matched stop string ends the request through the model's EOS id (OPS §5.3), which ignore_eos drops
            _fail("ignore_eos", "cannot be combined with 'stop' strings (use stop_token_ids)", self.ignore_eos)
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= MAX_LOGPROBS):
            _fail("logprobs", f"must be None or an int in [0, {MAX_LOGPROBS}]", self.logprobs)
        if self.cache_salt is not None and (not isinstance(self.cache_salt, str) or
                                            not 0 < len(self.cache_salt) <= MAX_CACHE_SALT):
            _fail("cache_salt", f"must be None or a non-empty string of at most {MAX_CACHE_SALT} characters",
                  self.cache_salt)
        self.temperature = float(self.temperature)
        self.top_p = float(self.top_p)

    def _check_controls(self) -> None:
        """The ranges vLLM's SamplingParams enforces for top_k, min_p and the three penalties."""
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            _fail("top_k", "must be an int: -1 or 0 (every token) or >= 1", self.top_k)
        if self.top_k == -1:
            self.top_k = 0
        ranges = (("min_p", 0.0, 1.0, "in [0, 1]"), ("repetition_penalty", 0.0, math.inf, "a finite number > 0"),
                  ("frequency_penalty", -2.0, 2.0, "in [-2, 2]"), ("presence_penalty", -2.0, 2.0, "in [-2, 2]"))
        for name, low, high, what in ranges:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not low <= value <= high or (name == "repetition_penalty" and value == 0):
                _fail(name, f"must be {what}", value)
            setattr(self, name, float(value))

    @property
    def uses_penalties(self) -> bool:
        """True when a penalty changes the logits (then the runner counts the prompt's and outputs' tokens)."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
