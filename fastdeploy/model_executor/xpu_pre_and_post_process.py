"""The per-step work around the target forward (OPS §4 stages 2, 3, 6, 7, 10): token packing before it,
verification and the state ops after it.

Each op stage brackets its ops with `state.push()` / `state.pull()`: the explicit host <-> device copies of the
runner state (no-ops on the host place, where the ops' tensors are the NumPy arrays; step_state.py).

Verify (stage 6) is not a native op here; it is written below in NumPy from OPS §4 and PD_MTP_FLOW §10.2:

* Greedy (temperature 0) is lossless: a draft is accepted iff it equals the target's argmax at its position; the
  accepted tokens are the accepted drafts plus the target's token at the first mismatch (corrected) or after the
  last draft (bonus).
* Temperature > 0 uses the same acceptance test against a *sample*: the target token at output index i is drawn
  from softmax(logits / temperature), restricted by min_p, top_k and top_p (sampler.py), by inverse CDF with a
  uniform from a generator seeded by (request seed, i). A draft is accepted iff it equals that sample. The emitted tokens are
  exactly the tokens non-speculative decoding with the same seed emits, so the output distribution is the target's
  and a seeded request is reproducible with and without speculation.
* Penalties (sampler.py) are applied to each candidate row before choosing, with the row's own context: the
  outputs before the step plus the drafts accepted before the row, so greedy and seeded outputs stay lossless.
* EOS suppression is per position: a token at output index i may be one of the request's EOS ids only if
  i + 1 >= min_tokens; the EOS logits are masked before choosing, for every verified position.
* A slot stops at EOS or when step_idx reaches max_dec_len (n is capped so step_idx <= max_dec_len);
  step_idx += n; slots already stopped at entry are not written. A prefill chunk that does not complete the known
  tokens produces nothing (accept_num = 0; the message hides it and schedule_cache stops it).

Logprobs (docs/design.md §5, "Logprobs") come from the same logits rows verify reads: for a slot whose request
asked, `verified_logprob_rows` keeps log_softmax in float64 of the raw logits (before EOS suppression, temperature
and top-p) of each position whose token verify accepted, and `emitted_logprobs` picks from them the logprob of the
token the step message finally reports at that position (a stop sequence replaces it with EOS in stage 7.1) and
the top-N alternatives. Slots that did not ask cost nothing.
"""
from __future__ import annotations

import numpy as np

from fastdeploy.schema.step_io import SlotSampling, StepLogprobs
from fastdeploy.model_executor.models import ForwardBatch
from fastdeploy.model_executor.sampler import DistributionHook, SlotControls, choose_token, penalize
from fastdeploy.model_executor.ops import state_ops as ops
from fastdeploy.model_executor.ops.step_message import decode_step_message
from fastdeploy.model_executor.step_state import PackedStep, ShareInputs


def recover_parked_slots(state: ShareInputs, block_size: int, k: int) -> None:
    """Stage 2: resume parked slots whose block table now covers their next step."""
    if not state.is_block_step.any():   # the op touches parked slots only (OPS §5.5): none, nothing to do
        return
    v = state.views
    state.push()
    ops.recover_decode_task(v.stop_flags, v.seq_lens_this_time, v.seq_lens_encoder, v.seq_lens_decoder,
                            v.step_seq_lens_decoder, v.block_tables, v.is_block_step, v.draft_tokens,
                            v.step_draft_tokens, v.step_seq_lens_this_time, block_size, k)
    state.pull()


def pre_process(state: ShareInputs) -> PackedStep:
    """Stage 3: encoder slots feed input_ids[b, dec : dec + stlt], decode slots draft_tokens[b, 0 : stlt], at
    positions dec .. dec + stlt - 1. Packed as array operations over the active slots (no loop over them); a step
    of decode rounds all of one width (the usual step) is a reshape."""
    active = np.flatnonzero(~state.stop_flags & (state.seq_lens_this_time > 0))
    lens = state.seq_lens_this_time[active].astype(np.int64)
    dec = state.seq_lens_decoder[active].astype(np.int64)
    is_prefill = state.seq_lens_encoder[active] > 0
    width = int(lens[0]) if lens.size else 0
    if not is_prefill.any() and (lens == width).all():
        starts = np.arange(0, active.size * width + 1, max(width, 1), dtype=np.int64)
        tokens = state.draft_tokens[active, :width].reshape(-1)
        positions = (dec[:, None] + np.arange(width)).reshape(-1)
        num_candidates = lens
    else:
        starts = np.zeros(active.size + 1, np.int64)
        np.cumsum(lens, out=starts[1:])
        seq = np.repeat(np.arange(active.size), lens)                 # [N] packed sequence of each token
        offset = np.arange(starts[-1], dtype=np.int64) - starts[seq]  # [N] index of each token in its sequence
        slot = active[seq]
        positions = dec[seq] + offset
        prefill = is_prefill[seq]
        tokens = np.empty(positions.size, np.int64)
        tokens[prefill] = state.input_ids[slot[prefill], positions[prefill]]
        decode = ~prefill
        tokens[decode] = state.draft_tokens[slot[decode], offset[decode]]
        completes = dec + state.seq_lens_encoder[active] >= state.prompt_lens[active]
        num_candidates = np.where(is_prefill, completes.astype(np.int64), lens)
    batch = ForwardBatch.unchecked(token_ids=tokens, positions=positions, seq_starts=starts,
                                   block_tables=state.block_tables[active])
    return PackedStep(batch=batch, slots=active.astype(np.int64), is_prefill=is_prefill,
                      num_candidates=num_candidates)


def candidate_counts(state: ShareInputs, packed: PackedStep) -> np.ndarray:
    """[S] int64: how many of each packed sequence's rows choose tokens, its last ones (PackedStep.num_candidates):
    a chunk that does not complete the known tokens produces nothing."""
    return packed.num_candidates


def logit_rows(state: ShareInputs, packed: PackedStep) -> np.ndarray:
    """[R] int64: the packed rows that choose tokens, sequence after sequence; the target forward computes logits
    of these rows only, and `verify` reads them in this order. Call before verify (it reads the stage-3 state)."""
    counts = candidate_counts(state, packed)
    if counts.sum() == packed.batch.num_tokens:   # every row chooses (decode rounds only)
        return np.arange(packed.batch.num_tokens, dtype=np.int64)
    first = np.repeat(packed.batch.seq_starts[1:] - counts, counts)
    within = np.arange(first.size, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return first + within


def _candidate_logits(state: ShareInputs, packed: PackedStep, logits, only: np.ndarray | None = None):
    """(i, slot, its logits rows [n, V] or None) per packed sequence (those in `only`, if given), walking logits
    [R, V] of `logit_rows`."""
    counts = candidate_counts(state, packed)
    starts = np.cumsum(counts) - counts
    for i in (range(len(packed.slots)) if only is None else only):
        n, start = int(counts[i]), int(starts[i])
        yield i, packed.slots[i], (logits[start:start + n] if n else None)


def _penalized(state: ShareInputs, packed: PackedStep, logits: np.ndarray,
               sampling: list[SlotSampling | None]) -> np.ndarray | list:
    """logits [R, V] with the penalties of the slots that set one applied to their rows (sampler.penalize), as
    float64 rows in a list indexable like `logits`; `logits` itself when no slot sets one. Row a of a slot's
    candidates is sampled after its outputs so far (pre_ids[b, 1 : 1 + step_idx]) and the drafts
    draft_tokens[b, 1 : 1 + a] it is verified after."""
    penalized = [i for i, b in enumerate(packed.slots.tolist()) if sampling[b].uses_penalties]
    if not penalized:
        return logits
    picked, params, outputs = [], [], []
    for _, b, candidates in _candidate_logits(state, packed, np.arange(len(logits)), penalized):
        if candidates is None:
            continue
        before = state.pre_ids[b, 1:1 + int(state.step_idx[b])]
        for a, row in enumerate(candidates):
            picked.append(row)
            params.append(sampling[b])
            outputs.append(np.concatenate([before, state.draft_tokens[b, 1:1 + a]]) if a else before)
    if not picked:
        return logits
    rows = list(logits)
    for row, values in zip(picked, penalize(logits[picked], params, outputs)):
        rows[row] = values
    return rows


def accept_runs(tokens: np.ndarray, counts: np.ndarray, next_drafts: np.ndarray, step_idx: np.ndarray,
                limit: np.ndarray, is_eos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The acceptance rule of verify over a batch of decode rounds at once. Round r chose tokens[r, :counts[r]]
    ([F, T], counts >= 1) at output indices step_idx[r] + a, and had drafted next_drafts[r, a] for position a + 1
    (draft_tokens[b, a + 1]); is_eos [F, T] says which chosen tokens are the request's EOS. Position a is accepted
    when every earlier one was, and ends the run when it is EOS or reaches `limit` (stopped), when the draft after
    it differs (corrected), or when it is the last (bonus). Returns (accepted counts [F], stopped [F] bool)."""
    width = tokens.shape[1]
    a = np.arange(width)
    valid = a < counts[:, None]
    stop = valid & (is_eos | (step_idx[:, None] + a + 1 >= limit[:, None]))
    mismatch = (a + 1 < counts[:, None]) & (next_drafts != tokens)
    end = stop | mismatch | (a == counts[:, None] - 1)
    first = np.argmax(end, axis=1)
    return first + 1, stop[np.arange(tokens.shape[0]), first]


# verify walks the rounds one by one below this many array-path rounds: the array path's fixed cost (some thirty
# NumPy calls) exceeds a short walk's
ARRAY_PATH_MIN_ROUNDS = 4


def verify(state: ShareInputs, packed: PackedStep, logits: np.ndarray, sampling: list[SlotSampling | None],
           controls: SlotControls | None = None, on_distribution: DistributionHook | None = None) -> np.ndarray:
    """Stage 6 over logits [R, V] of the rows `logit_rows` names: fills accept_tokens / accept_num, advances
    step_idx, sets stop_flags. Returns draft_counts [B] int32: drafts verified per slot, -1 for slots without a
    decode round. Greedy rounds without penalties and past min_tokens are verified together as array operations
    (one argmax over their rows, `accept_runs`); the others row by row (`choose_token`), with the same rule.
    `controls` are `sampling`'s as arrays (the runner keeps them; None: derived here). `on_distribution`, if
    given, sees the distribution of every emitted position (sampler.DistributionHook); every round then takes the
    row-by-row path, where that distribution exists."""
    draft_counts = np.full(state.stop_flags.shape[0], -1, np.int32)
    slots = packed.slots
    counts = packed.num_candidates
    draft_counts[slots[~packed.is_prefill]] = counts[~packed.is_prefill] - 1
    state.accept_num[slots[counts == 0]] = 0
    fast = np.zeros(slots.size, bool)
    if slots.size >= ARRAY_PATH_MIN_ROUNDS and on_distribution is None:   # a few rounds: the walk costs less
        controls = controls if controls is not None else SlotControls.of(sampling)
        # min_tokens: a greedy round whose first position may already be EOS masks nothing (choose_token)
        fast = (counts > 0) & controls.plain_greedy[slots] & \
            (state.step_idx[slots] + 1 >= controls.min_tokens[slots])
        if np.count_nonzero(fast) >= ARRAY_PATH_MIN_ROUNDS:
            _verify_greedy(state, slots, counts, fast, logits, controls)
        else:
            fast[:] = False
    slow = np.flatnonzero(~fast & (counts > 0))
    if slow.size:
        _verify_rows(state, packed, _penalized(state, packed, logits, sampling), sampling, slow, on_distribution)
    return draft_counts


def _verify_greedy(state: ShareInputs, slots: np.ndarray, counts: np.ndarray, fast: np.ndarray,
                   logits: np.ndarray, controls: SlotControls) -> None:
    """verify's array path: the rounds `fast` selects, every one greedy without penalties and past min_tokens."""
    width = state.draft_tokens.shape[1]
    first_row = np.cumsum(counts) - counts
    seqs = np.flatnonzero(fast)
    b, n = slots[seqs], counts[seqs]
    a = np.arange(width)
    rows = np.minimum(first_row[seqs][:, None] + a, len(logits) - 1)     # [F, T], clamped past each count
    tokens = np.asarray(logits).argmax(axis=1)[rows] if len(seqs) * 2 > len(logits) else \
        np.asarray(logits)[rows.ravel()].argmax(axis=1).reshape(rows.shape)
    next_drafts = np.full((len(seqs), width), -1, np.int64)
    next_drafts[:, :-1] = state.draft_tokens[b, 1:]
    eos_set = controls.eos_set[b]
    if (eos_set == eos_set[0]).all():
        is_eos = np.isin(tokens, controls.eos_sets[eos_set[0]])
    else:
        is_eos = np.zeros(tokens.shape, bool)
        for index in np.unique(eos_set).tolist():
            members = eos_set == index
            is_eos[members] = np.isin(tokens[members], controls.eos_sets[index])
    step = state.step_idx[b]
    accepted, stopped = accept_runs(tokens, n, next_drafts, step, state.max_dec_len[b], is_eos)
    keep = a < accepted[:, None]
    state.accept_tokens[b] = np.where(keep, tokens, state.accept_tokens[b])
    state.accept_num[b] = accepted
    state.step_idx[b] = step + accepted
    state.stop_flags[b] = stopped


def _verify_rows(state: ShareInputs, packed: PackedStep, logits, sampling: list[SlotSampling | None],
                 seqs: np.ndarray, on_distribution: DistributionHook | None = None) -> None:
    """verify's row-by-row path, for the packed sequences `seqs` (each with candidates)."""
    for _, b, candidates in _candidate_logits(state, packed, logits, seqs):
        params = sampling[b]
        s, limit = int(state.step_idx[b]), int(state.max_dec_len[b])
        n, stopped = 0, False
        for a, row_logits in enumerate(candidates):
            record = None if on_distribution is None else \
                (lambda probs, b=b, i=s + a, params=params: on_distribution(b, params, i, probs))
            token = choose_token(row_logits, s + a, params, record)
            state.accept_tokens[b, a] = token
            n = a + 1
            if token in params.eos_token_ids or s + n >= limit:
                stopped = True
                break
            if a + 1 < len(candidates) and state.draft_tokens[b, a + 1] != token:
                break
        state.accept_num[b] = n
        state.step_idx[b] = s + n
        state.stop_flags[b] = stopped


def log_softmax64(logits: np.ndarray) -> np.ndarray:
    """log_softmax over the last axis in float64: logits [..., V] (any float dtype, cast exactly) -> [..., V]."""
    x = logits.astype(np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def verified_logprob_rows(state: ShareInputs, packed: PackedStep, logits: np.ndarray,
                          sampling: list[SlotSampling | None],
                          controls: SlotControls | None = None) -> dict[int, np.ndarray]:
    """After verify, over the same logits [R, V]: slot -> log_softmax64 of its first accept_num candidate rows
    ([n, V] float64), for the slots whose request asked for logprobs and that accepted tokens this step."""
    rows = {}
    if controls is not None:
        asked = np.flatnonzero(controls.logprobs[packed.slots])
    else:
        asked = [i for i, b in enumerate(packed.slots.tolist()) if sampling[b].logprobs is not None]
    for _, b, candidates in _candidate_logits(state, packed, logits, asked) if len(asked) else ():
        n = int(state.accept_num[b])
        if candidates is not None and n > 0:
            rows[int(b)] = log_softmax64(candidates[:n])
    return rows


def emitted_logprobs(message: np.ndarray, rows: dict[int, np.ndarray],
                     sampling: list[SlotSampling | None]) -> StepLogprobs | None:
    """The logprobs of the tokens the step message reports (after stage 7.1), for the slots in `rows`; None when
    there are none. The top-N ids are ordered by logprob, ties by lower id (a stable sort)."""
    decoded = decode_step_message(message) if rows else None
    if decoded is None:
        return None
    entries = decoded[1]
    num_slots, width = len(entries), (message.shape[0] - 2 - len(entries)) // len(entries)
    n_max = max(sampling[b].logprobs for b in rows)
    out = StepLogprobs(token_logprobs=np.full((num_slots, width), np.nan),
                       top_token_ids=np.full((num_slots, width, n_max), -1, np.int64),
                       top_logprobs=np.full((num_slots, width, n_max), np.nan))
    for b, logp in rows.items():
        tokens = entries[b]
        if not tokens or tokens[0] < 0:   # no tokens (or a -9 / -3 count word) reported for the slot
            continue
        n, top = len(tokens), sampling[b].logprobs
        order = np.argsort(-logp[:n], axis=-1, kind="stable")[:, :top]
        out.token_logprobs[b, :n] = logp[np.arange(n), tokens]
        out.top_token_ids[b, :n, :top] = order
        out.top_logprobs[b, :n, :top] = np.take_along_axis(logp[:n], order, axis=-1)
    return out


def post_process(state: ShareInputs) -> np.ndarray:
    """Stages 7.1-7.5 in OPS §4 order. Returns the step message (int64 [2 + B + B*T])."""
    v = state.views
    state.push()
    ops.speculate_set_stop_value_multi_seqs(v.accept_tokens, v.accept_num, v.pre_ids, v.step_idx, v.stop_flags,
                                            v.seq_lens_this_time, v.stop_seqs, v.stop_seqs_len, v.eos_token_id,
                                            v.min_dec_len)
    ops.speculate_update(v.seq_lens_encoder, v.seq_lens_decoder, v.not_need_stop, v.draft_tokens,
                         v.actual_draft_token_nums, v.accept_tokens, v.accept_num, v.stop_flags,
                         v.seq_lens_this_time, v.is_block_step, v.mask_rollback)
    message = state.to_host_message(ops.speculate_save_output(v.accept_tokens, v.accept_num, v.not_need_stop,
                                                              v.seq_lens_decoder, v.prompt_lens, v.preempted_idx, 0,
                                                              False, True))
    ops.speculate_clear_accept_nums(v.accept_num, v.seq_lens_decoder)
    ops.speculate_set_value_by_flags_and_idx(v.pre_ids, v.accept_tokens, v.accept_num, v.stop_flags,
                                             v.seq_lens_this_time, v.seq_lens_encoder, v.seq_lens_decoder,
                                             v.step_idx)
    state.pull()
    return message


def schedule_cache(state: ShareInputs, block_size: int, k: int, prefill_one_step_stop: bool) -> None:
    """Stage 10: stop finished prefill chunks (and, on P, every slot after one step); park decode slots whose
    lookahead block is missing."""
    v = state.views
    state.push()
    ops.speculate_schedule_cache(v.draft_tokens, v.block_tables, v.stop_flags, v.prompt_lens,
                                 v.seq_lens_this_time, v.seq_lens_encoder, v.seq_lens_decoder,
                                 v.step_seq_lens_decoder, v.step_draft_tokens, v.step_seq_lens_this_time,
                                 v.accept_num, v.accept_tokens, v.is_block_step, v.not_need_stop, block_size, k,
                                 prefill_one_step_stop)
    state.pull()
