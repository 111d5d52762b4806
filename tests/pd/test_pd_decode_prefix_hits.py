"""D's own prefix cache under PD (PD_MTP_FLOW §13.6): D reserves with the prompt positions its cache already holds,
P sends the KV of the rest only, and the tag covers the keys of the blocks D reused. Over every transport path
(the streamed ZeroMQ hand-off into D's blocks or through a staging buffer, the one-sided Mooncake write, with and
without a secret): the same tokens as with D's cache off, fewer KV bytes across, D's shared blocks never written,
and every block back at the end. A P that ignores what D holds, or a D that names an impossible start, fails that
request with an error naming it."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fastdeploy.engine.block_pool import block_keys
from fastdeploy.engine.connector.prefill import PrefillConnector
from fastdeploy.entrypoints.pd_builder import build_engine, with_role
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.splitwise.mooncake import mooncake_unavailable_reason
from fastdeploy.splitwise.zmq_transport import ZmqTransport
from fastdeploy.worker.kv_transfer import PromptKVPort

from tests.splitwise.fakes import FakeClock

from .harness import toy_config
from .test_pd_scenarios import MODEL
from .test_pd_zmq_faults import BOUND_STEPS, DEADLINES, assert_free

SECRET = b"decode-prefix-hits"
PATHS = ["stream", "staged", "mooncake", "stream-secret", "mooncake-secret"]
BLOCK = toy_config(1).cache.block_size


def prompts() -> list[list[int]]:
    """A prompt, the same again (a whole-prompt hit on D: all but its last block), one extending it, and one
    sharing only its first blocks; each decodes past t0, so D caches what it received."""
    base = MODEL.find_prompt(12, 4 * BLOCK + 2, seed=5)
    return [base, base, base + base[1:6], base[:2 * BLOCK + 1] + base[2 * BLOCK + 2:]]


class Pair:
    """A P and a D over the ZeroMQ connector (and Mooncake when asked), driven step by step in this process."""

    def __init__(self, path: str, d_caching: bool = True):
        secret = SECRET if path.endswith("secret") else None
        config = toy_config(1)
        if path.startswith("mooncake"):
            config = replace(config, cache=replace(config.cache, transfer_protocol="mooncake-tcp"))
        self.p_transport = ZmqTransport(listen="127.0.0.1:0", secret=secret)
        self.d_transport = ZmqTransport(secret=secret)
        self.prefill = build_engine(with_role(config, "prefill"), MODEL, self.p_transport, clock=FakeClock(),
                                    deadlines=DEADLINES, idle_poll_s=0.0)
        d_config = replace(with_role(config, "decode"), enable_prefix_caching=d_caching)
        self.decode = build_engine(d_config, MODEL, self.d_transport, deadlines=DEADLINES)

    def run(self, rid: str, prompt: list[int]):
        params = SamplingParams(max_tokens=14)
        info = {"request_id": rid, "prefill_addr": self.p_transport.address}
        self.prefill.add_request(rid, prompt, params, disaggregate_info=info)
        request = self.decode.add_request(rid, prompt, params, disaggregate_info=info)
        for _ in range(BOUND_STEPS):
            self.prefill.step()
            self.decode.step(max_wait_s=0.005)
            for engine in (self.prefill, self.decode):
                engine.resources.check_invariant()
            if not self.prefill.has_unfinished() and not self.decode.has_unfinished():
                return request
        raise AssertionError("the request did not finish within the step bound")

    def close(self):
        self.prefill.close()
        self.decode.close()


def _skip_without_mooncake(path: str) -> None:
    reason = mooncake_unavailable_reason()
    if path.startswith("mooncake") and reason is not None:
        pytest.skip(f"the Mooncake transfer engine cannot load here: {reason}")


@pytest.mark.parametrize("path", PATHS)
def test_d_reuses_its_cached_prefix_and_p_sends_only_the_rest(path, monkeypatch):
    _skip_without_mooncake(path)
    if path == "staged":   # a cache outside host memory: pieces land in a staging buffer, then go into the blocks
        monkeypatch.setattr(PromptKVPort, "in_host_memory", property(lambda self: False))
    results = {}
    for d_caching in (False, True):
        pair = Pair(path, d_caching)
        try:
            runs = []
            for i, prompt in enumerate(prompts()):
                before = pair.decode.pd_counters()["kv_bytes_received"]
                request = pair.run(f"r{i}", prompt)
                assert request.error is None, request.error
                runs.append((request.output_token_ids, request.num_cached_tokens,
                             pair.decode.pd_counters()["kv_bytes_received"] - before))
            for engine in (pair.prefill, pair.decode):
                assert_free(engine)
            results[d_caching] = runs
        finally:
            pair.close()
    off, on = results[False], results[True]
    assert [tokens for tokens, _, _ in on] == [tokens for tokens, _, _ in off]
    assert all(len(tokens) > 1 for tokens, _, _ in on)
    # MTP keys a block with the token after it: D holds the blocks whose next token is a prompt token
    expected_hits = [0, 4 * BLOCK, 4 * BLOCK, 2 * BLOCK]
    assert [hit for _, hit, _ in on] == expected_hits and all(hit == 0 for _, hit, _ in off)
    per_position = off[0][2] // len(prompts()[0])
    assert [sent for _, _, sent in on] == [per_position * (len(p) - hit) for p, hit in zip(prompts(), expected_hits)]


@pytest.mark.parametrize("path", ["stream", "mooncake"])
def test_the_blocks_d_reuses_are_never_written(path, monkeypatch):
    """P writes (or D lands) only the positions after D's cached prefix: the shared blocks' bytes do not change
    while a request that reuses them receives the rest."""
    _skip_without_mooncake(path)
    pair = Pair(path)
    try:
        base = prompts()[0]
        pair.run("r0", base)
        resources = pair.decode.resources
        keys = block_keys(base, 4, BLOCK, resources.cache_identity, resources.next_token_in_key)
        shared = resources._pool.match(keys)
        assert len(shared) == 4, "D cached the four blocks it received"
        port = pair.decode.connector.kv
        before = [np.array(a, copy=True) for a in port.read_prompt_kv(shared, 4 * BLOCK)[0]]
        request = pair.run("r1", base)
        assert request.error is None and request.num_cached_tokens == 4 * BLOCK
        after = port.read_prompt_kv(shared, 4 * BLOCK)[0]
        assert all(np.array_equal(a, b) for a, b in zip(before, after))
    finally:
        pair.close()


@pytest.mark.parametrize("path", ["stream", "stream-secret"])
def test_a_p_that_sends_the_whole_prompt_anyway_fails_the_request_naming_the_start(path, monkeypatch):
    """D reserved with 16 positions cached; a P that ignores it (an older or a broken peer) streams KV from
    position 0: nothing lands in D's blocks, D fails the request at the trailer naming what it expected, and frees
    everything."""
    pair = Pair(path)
    try:
        base = prompts()[0]
        assert pair.run("r0", base).error is None
        monkeypatch.setattr(PrefillConnector, "_kv_start", lambda self, data, prompt_len: 0)
        request = pair.run("r1", base)
        assert request.finish_reason == "abort"
        assert "D's reservation said its prefix cache holds positions 0..15" in request.error, request.error
        for engine in (pair.prefill, pair.decode):
            assert_free(engine)
    finally:
        pair.close()


def test_a_p_that_ignores_the_start_cannot_write_past_the_blocks_d_reserved(monkeypatch):
    """Over Mooncake D's reservation lists only the blocks after its cached prefix: a P that would write the whole
    prompt is stopped before anything moves (its hand-off fails; D fails the request at its own deadline)."""
    _skip_without_mooncake("mooncake")
    pair = Pair("mooncake")
    try:
        base = prompts()[0]
        assert pair.run("r0", base).error is None
        monkeypatch.setattr(PrefillConnector, "_kv_start", lambda self, data, prompt_len: 0)
        params = SamplingParams(max_tokens=14)
        info = {"request_id": "r1", "prefill_addr": pair.p_transport.address}
        pair.prefill.add_request("r1", base, params, disaggregate_info=info)
        pair.decode.add_request("r1", base, params, disaggregate_info=info)
        for _ in range(BOUND_STEPS):
            pair.prefill.step()
            pair.decode.step(max_wait_s=0.005)
            if pair.prefill.pd_counters()["send_failed"]:
                break
        assert pair.prefill.pd_counters()["send_failed"] == 1
        assert pair.decode.pd_counters()["handoffs_received"] == 1, "only r0's hand-off reached D"
    finally:
        pair.close()


@pytest.mark.parametrize("kv_start", [3, -4, 1 << 40, True, "8", 4 * BLOCK + 4])
def test_p_refuses_a_start_that_is_not_a_whole_number_of_blocks_inside_the_prompt(kv_start):
    pair = Pair("stream")
    try:
        with pytest.raises(ValueError, match="'kv_start'"):
            pair.prefill.connector._kv_start({"kv_start": kv_start}, 4 * BLOCK + 2)
        assert pair.prefill.connector._kv_start({"kv_start": 4 * BLOCK}, 4 * BLOCK + 2) == 4 * BLOCK
        assert pair.prefill.connector._kv_start(None, 4 * BLOCK + 2) == 0
    finally:
        pair.close()


def test_p_and_d_must_salt_a_request_alike():
    """`cache_salt` is mixed into block 0's key on P and on D (docs/design.md §8, "Cache isolation"). The router
    sends both the same body, so both salt alike and D's hit under its salt is sent past as usual; a pair that
    salted differently disagrees on the keys of the blocks D reused, which the hand-off's tag covers, so the
    request fails at receipt instead of continuing from KV D cached for another salt."""
    pair = Pair("stream")
    try:
        prompt = prompts()[0]

        def run(rid: str, p_salt: str, d_salt: str):
            info = {"request_id": rid, "prefill_addr": pair.p_transport.address}
            pair.prefill.add_request(rid, prompt, SamplingParams(max_tokens=14, cache_salt=p_salt),
                                     disaggregate_info=info)
            request = pair.decode.add_request(rid, prompt, SamplingParams(max_tokens=14, cache_salt=d_salt),
                                              disaggregate_info=info)
            for _ in range(BOUND_STEPS):
                pair.prefill.step()
                pair.decode.step(max_wait_s=0.005)
                if not pair.prefill.has_unfinished() and not pair.decode.has_unfinished():
                    return request
            raise AssertionError("the request did not finish within the step bound")

        first = run("r0", "tenant-a", "tenant-a")
        again = run("r1", "tenant-a", "tenant-a")
        other = run("r2", "tenant-b", "tenant-b")
        mixed = run("r3", "tenant-b", "tenant-a")
        assert first.error is None and again.error is None and other.error is None
        assert (first.num_cached_tokens, again.num_cached_tokens, other.num_cached_tokens) == \
            (0, (len(prompt) - 1) // BLOCK * BLOCK, 0)
        assert mixed.finish_reason == "abort" and "integrity tag" in mixed.error, mixed.error
        assert again.output_token_ids == first.output_token_ids == other.output_token_ids
        assert_free(pair.prefill)
        assert_free(pair.decode)
    finally:
        pair.close()
