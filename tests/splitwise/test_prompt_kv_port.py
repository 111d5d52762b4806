"""The worker half of the hand-off (worker/kv_transfer.py, PD_MTP_FLOW §3): positions 0..L−1 of a request's blocks
read on P and written on D with one copy of each KV byte per side, and read in place for a placed hand-off."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from fastdeploy.model_executor.layers.kv_cache import KVCache
from fastdeploy.splitwise import HandoffMessage, HandoffSamplingParams, Insert, Reject, integrity_tag, receive_handoff
from fastdeploy.worker.kv_transfer import PromptKVPort

TAILS = ((2, 3), (4,), (2, 3))   # two target layers, one MTP layer
BLOCK_SIZE, NUM_BLOCKS = 4, 12


def _port(seed: int | None = None) -> PromptKVPort:
    port = PromptKVPort(KVCache(NUM_BLOCKS, BLOCK_SIZE, TAILS), num_target_layers=2)
    if seed is not None:
        rng = np.random.default_rng(seed)
        for i in range(len(TAILS)):
            port.kv.host_view(i)[...] = rng.standard_normal(port.kv.host_view(i).shape).astype(np.float32)
    return port


def _without_host_views(port: PromptKVPort, monkeypatch) -> PromptKVPort:
    """The same cache through Paddle's gather/scatter only (the path of a cache in device memory)."""
    monkeypatch.setattr(port.kv, "host_view", lambda layer: None)
    return port


def _cache_bytes(port: PromptKVPort) -> list[np.ndarray]:
    return [layer.numpy().copy() for layer in port.kv.layers]


CASES = {"one partial block": ([5], 3), "full blocks": ([2, 3], 8), "scattered with a partial": ([7, 0, 4], 10)}


@pytest.mark.parametrize("blocks,num_tokens", CASES.values(), ids=CASES.keys())
def test_single_copy_path_reads_and_writes_the_same_bytes_as_paddle(monkeypatch, blocks, num_tokens):
    """The host-view path (one gather on P, one write on D) reads exactly what Paddle's gather reads and writes
    exactly what Paddle's scatter writes, touching no other position."""
    source = _port(seed=1)
    target, target_paddle = _port(seed=2), _port(seed=2)
    kv_t, kv_m = source.read_prompt_kv(blocks, num_tokens)
    with monkeypatch.context() as patch:
        ref_t, ref_m = _without_host_views(source, patch).read_prompt_kv(blocks, num_tokens)
    assert len(kv_t) == 2 and len(kv_m) == 1
    for mine, ref in zip(kv_t + kv_m, ref_t + ref_m):
        assert mine.shape == ref.shape and mine.flags.c_contiguous and mine.tobytes() == ref.tobytes()
    d_blocks = [(b + 3) % NUM_BLOCKS for b in blocks]
    target.write_prompt_kv(d_blocks, kv_t, kv_m)
    with monkeypatch.context() as patch:
        _without_host_views(target_paddle, patch).write_prompt_kv(d_blocks, kv_t, kv_m)
    for mine, ref in zip(_cache_bytes(target), _cache_bytes(target_paddle)):
        assert mine.tobytes() == ref.tobytes()
    back_t, back_m = target.read_prompt_kv(d_blocks, num_tokens)
    assert [a.tobytes() for a in back_t + back_m] == [a.tobytes() for a in kv_t + kv_m]


def test_read_copies_once_and_d_writes_from_the_received_frames():
    """P's arrays are one copy out of the cache (a later cache write does not change them); D decodes the frames
    into views of the received buffers (no copy) and writes those straight into its blocks."""
    source, target = _port(seed=3), _port()
    kv_t, kv_m = source.read_prompt_kv([1, 2], 6)
    before = [a.copy() for a in kv_t + kv_m]
    source.kv.host_view(0)[1] = 0.0
    assert all(np.array_equal(a, b) for a, b in zip(kv_t + kv_m, before))
    message = HandoffMessage.create(request_id="r", prompt_token_ids=list(range(1, 7)),
                                    sampling=HandoffSamplingParams(max_tokens=4), t0=2, draft_token_ids=[2, 3],
                                    kv_target=kv_t, kv_mtp=kv_m, config_hash="c")
    frames = [bytearray(f) for f in message.encode_frames()]   # what arrived: the receiver's own buffers
    received = HandoffMessage.decode(frames)
    for array, frame in zip(received.kv_target + received.kv_mtp, frames[1:]):
        assert np.shares_memory(array, np.frombuffer(frame, np.uint8))
    target.write_prompt_kv([9, 4], received.kv_target, received.kv_mtp)
    back_t, back_m = target.read_prompt_kv([9, 4], 6)
    assert [a.tobytes() for a in back_t + back_m] == [a.tobytes() for a in before]


@pytest.mark.parametrize("blocks,num_tokens", CASES.values(), ids=CASES.keys())
def test_in_place_chunks_hash_exactly_like_the_gathered_arrays(blocks, num_tokens):
    """A placed hand-off is verified over D's own blocks: the in-place chunks are the bytes of positions 0..L−1 of
    every layer in the tag's order, so their tag equals the tag over the gathered arrays; they are views of the
    cache, not copies."""
    port = _port(seed=4)
    kv_t, kv_m = port.read_prompt_kv(blocks, num_tokens)
    chunks = port.prompt_kv_chunks(blocks, num_tokens)
    assert integrity_tag({"f": 1}, chunks) == integrity_tag({"f": 1}, kv_t + kv_m)
    chunks[0][0] ^= 0x01
    assert port.read_prompt_kv(blocks, num_tokens)[0][0].tobytes() != kv_t[0].tobytes()


def test_block_regions_locate_every_block():
    """block b of layer l starts at region_l + b * block bytes: the destinations D's reservation carries."""
    port = _port(seed=5)
    for layer, ((base, block_bytes), row) in enumerate(zip(port.block_regions(), port.row_bytes())):
        view = port.kv.host_view(layer)
        assert base == view.ctypes.data and block_bytes == view[0].nbytes == row * BLOCK_SIZE
        assert view[7].ctypes.data == base + 7 * block_bytes
    assert port.memory_regions() == [(v.ctypes.data, v.nbytes) for v in map(port.kv.host_view, range(3))]


@pytest.mark.parametrize("blocks,num_tokens,fragment", [
    ([1], 5, "has 1 blocks, 5 positions need 2"),
    ([1, NUM_BLOCKS], 5, "outside the cache"),
    ([1], 0, "'num_tokens' must be an int >= 1"),
])
def test_bad_block_ids_are_refused_naming_the_argument(blocks, num_tokens, fragment):
    """Reading or writing outside a request's blocks would use another request's KV: refused before any copy."""
    port = _port()
    with pytest.raises(ValueError, match=fragment):
        port.read_prompt_kv(blocks, num_tokens)
    with pytest.raises(ValueError, match=fragment):
        port.prompt_kv_chunks(blocks, num_tokens)


def _placed(port: PromptKVPort, blocks, num_tokens: int, key=None) -> HandoffMessage:
    return HandoffMessage.create_placed(
        request_id="r", prompt_token_ids=list(range(1, num_tokens + 1)), sampling=HandoffSamplingParams(max_tokens=4),
        t0=2, draft_token_ids=[2, 3], placed_kv=port.placed_kv(num_tokens),
        kv_chunks=port.prompt_kv_chunks(blocks, num_tokens), config_hash="c", key=key)


def test_placed_hand_off_is_a_header_verified_over_d_blocks():
    """PD_MTP_FLOW §5.2 step 1 for a placed hand-off: it encodes to its header alone; D inserts it only when the tag
    over its own blocks matches, rejects it when its blocks differ by one byte, and rejects it when D expects inline
    KV (the transports differ)."""
    p, d = _port(seed=6), _port()
    kv_t, kv_m = p.read_prompt_kv([3, 8, 5], 9)
    d.write_prompt_kv([0, 1, 2], kv_t, kv_m)     # what the transfer engine does, here by hand
    message = _placed(p, [3, 8, 5], 9)
    frames = message.encode_frames()
    assert len(frames) == 1 and not HandoffMessage.decode(frames).kv_inline
    check = dict(config_hash="c", num_speculative_tokens=1, kv_layout=d.layout)
    in_place = lambda num_tokens: d.prompt_kv_chunks([0, 1, 2], num_tokens)  # noqa: E731
    assert isinstance(receive_handoff("r", frames, **check, kv_in_place=in_place), Insert)
    d.prompt_kv_chunks([0, 1, 2], 9)[2][5] ^= 0x04
    flipped = receive_handoff("r", frames, **check, kv_in_place=in_place)
    assert isinstance(flipped, Reject) and "integrity tag" in flipped.error
    inline_only = receive_handoff("r", frames, **check)
    assert isinstance(inline_only, Reject) and "the transports differ" in inline_only.error


def test_source_ranges_hold_exactly_the_in_place_chunks():
    """P's source regions of a request (what the transfer engine reads) are the in-place chunks, block by block,
    in the tag's order."""
    port = _port(seed=7)
    ranges = port.prompt_kv_ranges([7, 0, 4], 10)
    kv_t, kv_m = port.read_prompt_kv([7, 0, 4], 10)
    assert len(ranges) == 3 * len(TAILS)
    assert b"".join(ctypes.string_at(a, n) for a, n in ranges) == b"".join(a.tobytes() for a in kv_t + kv_m)


def test_gathered_hand_off_is_one_kv_frame():
    """P gathers every layer into one buffer in the hand-off's order: the hand-off is its header and one KV frame
    (no copy of the buffer), which D decodes into the same arrays."""
    port = _port(seed=8)
    kv_t, kv_m = port.read_prompt_kv([7, 0, 4], 10)
    message = HandoffMessage.create(request_id="r", prompt_token_ids=list(range(1, 11)),
                                    sampling=HandoffSamplingParams(max_tokens=4), t0=2, draft_token_ids=[2, 3],
                                    kv_target=kv_t, kv_mtp=kv_m, config_hash="c")
    frames = message.encode_frames()
    assert len(frames) == 2 and np.shares_memory(np.frombuffer(frames[1], np.uint8), kv_t[0])
    decoded = HandoffMessage.decode([bytes(f) for f in frames])
    assert [a.tobytes() for a in decoded.kv_target + decoded.kv_mtp] == [a.tobytes() for a in kv_t + kv_m]
