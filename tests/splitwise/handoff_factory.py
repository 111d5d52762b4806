"""Builders of hand-off messages and configurations shared by the splitwise tests (seeded, deterministic)."""

from __future__ import annotations

import dataclasses

import numpy as np

from fastdeploy.splitwise import HandoffMessage, HandoffSamplingParams, KVLayout, config_hash

EOS = 0
TARGET_TAILS = ((2, 3), (2, 3))  # two target layers: [heads=2, head_dim=3] per token
MTP_TAILS = ((2, 3),)  # one MTP layer

MTP_CONFIG_HASH = config_hash(model_name="fd-toy", vocab_size=64, num_speculative_tokens=1,
                              mtp_model="fd-toy-mtp", block_size=4, kv_dtype="float32")
NO_SPEC_CONFIG_HASH = config_hash(model_name="fd-toy", vocab_size=64, num_speculative_tokens=0,
                                  mtp_model=None, block_size=4, kv_dtype="float32")
KV_LAYOUT = KVLayout(TARGET_TAILS, MTP_TAILS, "float32")


def make_kv(rng: np.random.Generator, num_tokens: int, tails, dtype=np.float32) -> tuple[np.ndarray, ...]:
    """Random KV arrays [L, *tail], one per tail."""
    return tuple(rng.standard_normal((num_tokens, *tail)).astype(dtype) for tail in tails)


def make_message(seed: int = 0, *, request_id: str = "req-0", num_prompt_tokens: int = 5, t0: int = 7,
                 draft_token_ids=None, with_kv: bool = True, config: str = MTP_CONFIG_HASH, key=None,
                 **sampling) -> HandoffMessage:
    """A well-formed, sealed MTP hand-off; `draft_token_ids` defaults to [t0, d1] with d1 = 9."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(1, 64, size=num_prompt_tokens).tolist()
    params = {"max_tokens": 16, "eos_token_ids": (EOS,), **sampling}
    return HandoffMessage.create(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling=HandoffSamplingParams(**params),
        t0=t0,
        draft_token_ids=(t0, 9) if draft_token_ids is None else draft_token_ids,
        kv_target=make_kv(rng, num_prompt_tokens, TARGET_TAILS) if with_kv else (),
        kv_mtp=make_kv(rng, num_prompt_tokens, MTP_TAILS) if with_kv else (),
        config_hash=config,
        key=key,
    )


def forge(message: HandoffMessage, **changes) -> HandoffMessage:
    """The message with fields changed but its old tag kept, as corruption in transit would leave it."""
    return dataclasses.replace(message, **changes)


def assert_same_message(a: HandoffMessage, b: HandoffMessage) -> None:
    """Every field equal; KV arrays bit-identical (dtype, shape and bytes, so NaN payloads count too)."""
    for field in dataclasses.fields(HandoffMessage):
        if field.name in ("kv_target", "kv_mtp"):
            xs, ys = getattr(a, field.name), getattr(b, field.name)
            assert len(xs) == len(ys), field.name
            for x, y in zip(xs, ys):
                assert x.dtype == y.dtype and x.shape == y.shape, field.name
                assert x.tobytes() == y.tobytes(), field.name
        else:
            assert getattr(a, field.name) == getattr(b, field.name), field.name
