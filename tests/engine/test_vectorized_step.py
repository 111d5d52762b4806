"""The step's array operations over the batch give what the per-request walks they replaced gave: packing
(pre_process, logit_rows), verify's greedy path, the acceptance rule, the MTP proposer's sub-step batches; and the
leaner step-message decoding and token appending give what they gave before. Each reference below is the walk over
requests, written out as it was; random batches mix prefill chunks, decode rounds, stopped slots, EOS and
max_tokens."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.models.base import ForwardBatch
from fastdeploy.model_executor.ops.step_message import decode_step_message
from fastdeploy.model_executor import xpu_pre_and_post_process as step
from fastdeploy.model_executor.step_state import ShareInputs
from fastdeploy.model_executor.xpu_pre_and_post_process import (_verify_rows, accept_runs, logit_rows, pre_process,
                                                                verify)
from fastdeploy.schema.step_io import SlotSampling
from fastdeploy.spec_decode.mtp import MTPProposer

from .helpers import EOS, add_request, make_config, make_engine_parts

V, M = 40, 64


def sampling(max_tokens=30, min_tokens=0, eos=(EOS % V,)) -> SlotSampling:
    return SlotSampling(temperature=0.0, top_p=1.0, seed=0, min_tokens=min_tokens, max_tokens=max_tokens,
                        eos_token_ids=eos, stop_seqs=())


def random_state(rng, slots=12, k=2) -> ShareInputs:
    """Slots idle, in a prefill chunk (completing its prompt or not) or in a decode round of 1..K+1 tokens."""
    state = ShareInputs.allocate(slots, k, M, 8, 1, 2, (EOS % V,))
    state.input_ids[:] = rng.integers(0, V, (slots, M))
    state.draft_tokens[:] = rng.integers(0, V, state.draft_tokens.shape)
    for b in range(slots):
        kind = rng.integers(3)
        if kind == 0:
            continue
        state.stop_flags[b] = False
        state.seq_lens_decoder[b] = dec = int(rng.integers(0, 20))
        state.block_tables[b, :4] = np.arange(4 * b, 4 * b + 4)
        state.step_idx[b] = int(rng.integers(0, 10))
        state.max_dec_len[b] = int(state.step_idx[b] + rng.integers(1, 6))
        if kind == 1:
            state.seq_lens_encoder[b] = state.seq_lens_this_time[b] = chunk = int(rng.integers(1, 9))
            state.prompt_lens[b] = dec + chunk + int(rng.integers(0, 2)) * int(rng.integers(1, 4))
        else:
            state.seq_lens_this_time[b] = int(rng.integers(1, k + 2))
    return state


def old_pre_process(state):
    active = np.flatnonzero(~state.stop_flags & (state.seq_lens_this_time > 0))
    tokens, positions, starts = [], [], [0]
    for b in active:
        dec, stlt = int(state.seq_lens_decoder[b]), int(state.seq_lens_this_time[b])
        tokens.append(state.input_ids[b, dec:dec + stlt] if state.seq_lens_encoder[b] > 0
                      else state.draft_tokens[b, :stlt])
        positions.append(np.arange(dec, dec + stlt))
        starts.append(starts[-1] + stlt)
    return np.concatenate(tokens), np.concatenate(positions), np.asarray(starts), active


def old_counts(state, packed):
    out = []
    for i, b in enumerate(packed.slots):
        if not packed.is_prefill[i]:
            out.append(len(packed.rows(i)))
        else:
            out.append(0 if state.seq_lens_decoder[b] + state.seq_lens_encoder[b] < state.prompt_lens[b] else 1)
    return out


def _check(batch: ForwardBatch) -> None:
    """A batch built without the constructor's checks passes them, in the dtypes they give."""
    checked = ForwardBatch(batch.token_ids, batch.positions, batch.seq_starts, batch.block_tables)
    for name in ("token_ids", "positions", "seq_starts", "block_tables"):
        assert getattr(batch, name).dtype == getattr(checked, name).dtype, name


@pytest.mark.parametrize("seed", range(30))
def test_packing_matches_the_walk_over_slots(seed):
    rng = np.random.default_rng(seed)
    state = random_state(rng)
    if seed % 3 == 0:   # decode rounds only, one width: the reshape path
        state.seq_lens_encoder[:] = 0
        state.seq_lens_this_time[~state.stop_flags] = 2
    packed = pre_process(state)
    _check(packed.batch)
    if not packed.slots.size:
        return
    tokens, positions, starts, active = old_pre_process(state)
    np.testing.assert_array_equal(packed.batch.token_ids, tokens)
    np.testing.assert_array_equal(packed.batch.positions, positions)
    np.testing.assert_array_equal(packed.batch.seq_starts, starts)
    np.testing.assert_array_equal(packed.slots, active)
    np.testing.assert_array_equal(packed.batch.block_tables, state.block_tables[active])
    counts = old_counts(state, packed)
    ends = [packed.rows(i).stop for i in range(len(packed.slots))]
    rows = np.concatenate([np.arange(end - n, end) for end, n in zip(ends, counts)])
    np.testing.assert_array_equal(logit_rows(state, packed), rows)


def old_accept(tokens, counts, next_drafts, step_idx, limit, is_eos):
    accepted, stopped = [], []
    for r in range(len(counts)):
        n, stop = 0, False
        for a in range(counts[r]):
            n = a + 1
            if is_eos[r, a] or step_idx[r] + n >= limit[r]:
                stop = True
                break
            if a + 1 < counts[r] and next_drafts[r, a] != tokens[r, a]:
                break
        accepted.append(n)
        stopped.append(stop)
    return accepted, stopped


@pytest.mark.parametrize("seed", range(20))
def test_accept_runs_matches_the_walk_over_rounds(seed):
    rng = np.random.default_rng(seed)
    rounds, width = 30, 4
    tokens = rng.integers(0, 3, (rounds, width))
    next_drafts = np.where(rng.random((rounds, width)) < 0.7, tokens, rng.integers(0, 3, (rounds, width)))
    counts = rng.integers(1, width + 1, rounds)
    step_idx, limit = rng.integers(0, 10, rounds), rng.integers(1, 14, rounds)
    is_eos = rng.random((rounds, width)) < 0.1
    accepted, stopped = accept_runs(tokens, counts, next_drafts, step_idx, limit, is_eos)
    assert (accepted.tolist(), stopped.tolist()) == old_accept(tokens, counts, next_drafts, step_idx, limit, is_eos)


@pytest.mark.parametrize("min_rounds", [1, 4])
@pytest.mark.parametrize("seed", range(20))
def test_greedy_verify_matches_the_row_by_row_path(seed, min_rounds, monkeypatch):
    """Fields verify writes, on a batch where some slots take the array path and others (min_tokens not reached,
    other EOS ids) the row path or both; the same batch all row by row is the reference."""
    monkeypatch.setattr(step, "ARRAY_PATH_MIN_ROUNDS", min_rounds)
    rng = np.random.default_rng(seed)
    state = random_state(rng)
    params = [sampling(int(state.max_dec_len[b]), min_tokens=int(rng.choice([0, 0, 12])),
                       eos=((EOS % V,) if rng.random() < 0.7 else (3, 5))) for b in range(len(state.stop_flags))]
    packed = pre_process(state)
    rows = logit_rows(state, packed)
    logits = rng.normal(size=(rows.size, V)).astype(np.float32)
    logits[rng.random(rows.size) < 0.2, EOS % V] = 9.0     # some EOS picks
    reference = ShareInputs(**{name: getattr(state, name).copy() for name in state.__dataclass_fields__
                               if name != "views"})
    counts = verify(state, packed, logits, params)
    seqs = np.flatnonzero(packed.num_candidates > 0)
    _verify_rows(reference, packed, logits, params, seqs)
    reference.accept_num[packed.slots[packed.num_candidates == 0]] = 0
    for name in ("accept_tokens", "accept_num", "step_idx", "stop_flags"):
        np.testing.assert_array_equal(getattr(state, name), getattr(reference, name), err_msg=name)
    decode = packed.slots[~packed.is_prefill]
    assert counts[decode].tolist() == (packed.num_candidates[~packed.is_prefill] - 1).tolist()


def old_decode(msg):
    words = msg.tolist()
    bsz = words[1]
    width = (len(words) - 2 - bsz) // bsz
    slots = []
    for j in range(bsz):
        count = words[2 + j]
        slots.append([count] if count in (-9, -3) else words[2 + bsz + j * width: 2 + bsz + j * width + count])
    return words[0] > 0, slots


@pytest.mark.parametrize("seed", range(10))
def test_step_message_decoding_matches_the_walk_over_slots(seed):
    rng = np.random.default_rng(seed)
    bsz, width = 9, 3
    msg = np.zeros(2 + bsz + bsz * width, np.int64)
    msg[0], msg[1] = rng.choice([1, -1]), bsz
    msg[2:2 + bsz] = rng.choice([-9, -3, 0, 1, 2, 3], bsz)
    msg[2 + bsz:] = rng.integers(0, 50, bsz * width)
    assert decode_step_message(msg) == old_decode(msg)
    bad = msg.copy()
    bad[2 + 4] = 2
    bad[2 + bsz + 4 * width + 1] = -5
    with pytest.raises(ValueError, match=r"slot 4: negative token in \[\d+, -5\]"):
        decode_step_message(bad)
    bad[2 + 2] = 7
    with pytest.raises(ValueError, match=r"slot 2: count 7 is neither -9, -3 nor in \[0, 3\]"):
        decode_step_message(bad)


class _Recorder:
    """mtp_forward of a model that records the batches it is given and drafts token (position * 7) % V."""

    def __init__(self):
        self.batches = []

    def mtp_forward(self, batch, prev_hidden, kv, rows=None):
        _check(batch)
        self.batches.append((batch.token_ids.tolist(), batch.positions.tolist(), batch.seq_starts.tolist(),
                             batch.block_tables.tolist(), prev_hidden.numpy()[:, 0].tolist()))
        picked = batch.positions if rows is None else batch.positions[rows]
        logits = np.zeros((len(picked), V), np.float32)
        logits[np.arange(len(picked)), (picked * 7) % V] = 1.0
        return paddle.to_tensor(logits), paddle.to_tensor(np.asarray(batch.token_ids, np.float32)[:, None] + 1000)


def old_first_round_batch(proposer, state, packed, hidden):
    """The first sub-step's batch and hidden rows, slot by slot as the proposer built it."""
    tokens, positions, starts, slots, hidden_rows = [], [], [0], [], []
    for i, b in enumerate(int(s) for s in packed.slots):
        if state.stop_flags[b]:
            continue
        rows = np.arange(packed.batch.seq_starts[i], packed.batch.seq_starts[i + 1])
        start = int(proposer.seq_lens_decoder[b])
        if proposer.seq_lens_encoder[b] > 0:
            end = start + int(proposer.seq_lens_encoder[b])
            ids = proposer.input_ids[b].copy()
            if end >= state.prompt_lens[b]:
                ids[end - 1] = state.accept_tokens[b, 0]
            tokens.append(ids[start:end])
            hidden_rows.append(rows)
        else:
            n = int(state.accept_num[b])
            tokens.append(state.accept_tokens[b, :n])
            hidden_rows.append(rows[:n])
            end = start + n
        positions.append(np.arange(start, end))
        starts.append(starts[-1] + len(tokens[-1]))
        slots.append(b)
    return (np.concatenate(tokens).tolist(), np.concatenate(positions).tolist(), starts,
            state.block_tables[slots].tolist(), hidden[np.concatenate(hidden_rows)].tolist())


@pytest.mark.parametrize("seed", range(10))
def test_mtp_first_round_batch_matches_the_walk_over_slots(seed):
    rng = np.random.default_rng(seed)
    k = 2
    state = random_state(rng, k=k)
    packed = pre_process(state)
    recorder = _Recorder()
    proposer = MTPProposer(recorder, None, len(state.stop_flags), k, M)
    proposer.input_ids[:] = rng.integers(0, V, proposer.input_ids.shape)
    for b in np.flatnonzero(~state.stop_flags):
        proposer.seq_lens_encoder[b] = state.seq_lens_encoder[b]
        proposer.seq_lens_decoder[b] = state.seq_lens_decoder[b]
    state.accept_num[:] = rng.integers(1, np.maximum(state.seq_lens_this_time, 1) + 1)   # 1 .. its inputs
    state.accept_tokens[:] = rng.integers(0, V, state.accept_tokens.shape)
    state.stop_flags[packed.slots[rng.random(len(packed.slots)) < 0.2]] = True   # stopped by verify
    hidden = np.arange(packed.batch.num_tokens, dtype=np.float32)
    expected = old_first_round_batch(proposer, state, packed, hidden)
    before = proposer.seq_lens_decoder.copy()
    proposal = proposer.propose(state, packed, paddle.to_tensor(hidden[:, None]))
    if not recorder.batches:
        assert not expected[0]
        return
    assert recorder.batches[0] == expected
    running = packed.slots[~state.stop_flags[packed.slots]]
    for b in running:   # drafts: the first from the last committed position, then one position further each
        last = int(proposer.seq_lens_decoder[b]) - 1
        n = int(proposal.num_drafts[b])
        assert n == (k if state.seq_lens_encoder[b] == 0 else
                     int(before[b] + state.seq_lens_encoder[b] >= state.prompt_lens[b]))
        assert proposal.draft_tokens[b, :n].tolist() == [((last + j) * 7) % V for j in range(n)]


def old_append(request, tokens, logprobs):
    for i, token in enumerate(tokens):
        request.output_token_ids.append(token)
        request.output_logprobs.extend(logprobs[i:i + 1])
        reason = "stop" if token in request.eos_token_ids else (
            "length" if len(request.output_token_ids) >= request.params.max_tokens else None)
        if reason is not None:
            return reason
    return None


@pytest.mark.parametrize("seed", range(10))
def test_token_appending_matches_the_walk_over_tokens(seed):
    from fastdeploy.schema.step_io import SlotEvent, SlotReport
    rng = np.random.default_rng(seed)
    scheduler, _ = make_engine_parts(make_config())
    mine, theirs = add_request(scheduler, "1", max_tokens=6), add_request(scheduler, "2", max_tokens=6)
    for _ in range(4):
        tokens = tuple(int(t) for t in rng.choice([EOS, 5, 6, 7], int(rng.integers(1, 4)), p=[0.1, 0.3, 0.3, 0.3]))
        logprobs = tuple(range(len(tokens)))
        reason = scheduler._append_tokens(mine, SlotReport(0, SlotEvent.TOKENS, tokens, 1, -1, logprobs))
        assert reason == old_append(theirs, tokens, logprobs)
        assert (mine.output_token_ids, mine.output_logprobs) == (theirs.output_token_ids, theirs.output_logprobs)
        if reason is not None:
            break
