"""Op-level invariants of PD_MTP_FLOW §9, checked on the op's output for random in-domain states, independently of
the reference: I2 (decoder length accounting, row C), I4 (skip_prefill hides only unfinished prefill), I7
(not_need_stop after update and after schedule_cache)."""

import numpy as np

from reference.inputs import gen_inputs

from .harness import run_op

CASES = 200


def dims(rng):
    B = int(rng.integers(1, 64))
    return B, int(rng.integers(1, B + 1)), int(rng.integers(1, 9))


def test_update_advances_decoder_by_accept_num_even_when_stopped(backend):
    """I2: for every active slot with enc == 0, dec_after == dec_before + accept_num, stopped or not."""
    rng = np.random.default_rng(11)
    for seed in range(CASES):
        B, R, T = dims(rng)
        case = gen_inputs("speculate_update", seed, B, R, T)
        after, _ = run_op(case, backend)
        t = {k: case.tensors[k].reshape(-1)
             for k in ("is_block_step", "seq_lens_encoder", "seq_lens_decoder", "accept_num")}
        active = (np.arange(B) < R) & ~t["is_block_step"] & (t["seq_lens_encoder"] == 0)
        expected = t["seq_lens_decoder"].astype(np.int64) + t["accept_num"]
        np.testing.assert_array_equal(after["seq_lens_decoder"].reshape(-1)[active], expected[active],
                                      err_msg=f"seed={seed}")


def test_update_not_need_stop_counts_parked_slots_as_running(backend):
    """I7 after speculate_update: not_need_stop == ((B - R) + #{b < R: not parked and stopped}) < B."""
    rng = np.random.default_rng(12)
    for seed in range(CASES):
        B, R, T = dims(rng)
        case = gen_inputs("speculate_update", seed, B, R, T)
        after, _ = run_op(case, backend)
        stop = case.tensors["stop_flags"].reshape(-1)[:R]
        parked = case.tensors["is_block_step"].reshape(-1)[:R]
        stopped = (B - R) + int((stop & ~parked).sum())
        assert bool(after["not_need_stop"][0]) == (stopped < B), f"seed={seed}"


def test_schedule_cache_not_need_stop_counts_stopped_slots_after_the_op(backend):
    """I7 after speculate_schedule_cache: not_need_stop == ((B - R) + #{b < R: stop_flags after}) < B."""
    rng = np.random.default_rng(13)
    for seed in range(CASES):
        B, R, T = dims(rng)
        case = gen_inputs("speculate_schedule_cache", seed, B, R, T)
        after, _ = run_op(case, backend)
        stopped = (B - R) + int(after["stop_flags"].reshape(-1)[:R].sum())
        assert bool(after["not_need_stop"][0]) == (stopped < B), f"seed={seed}"


def test_save_output_hides_only_unfinished_prefill(backend):
    """I4: a non-preempted slot reports 0 only if dec < prompt_lens or accept_num == 0; a preempted slot -9."""
    rng = np.random.default_rng(14)
    for seed in range(CASES):
        B, R, T = dims(rng)
        case = gen_inputs("speculate_save_output", seed, B, R, T)
        case.attrs.update(rank_id=0, skip_prefill=True)
        _, msg = run_op(case, backend)
        t = {k: v.reshape(-1) for k, v in case.tensors.items() if k != "accept_tokens"}
        counts = msg[2:2 + B]
        preempted = t["preempted_idx"] != 0
        assert (counts[preempted] == -9).all(), f"seed={seed}"
        hidden = ~preempted & (counts == 0)
        allowed = (t["seq_lens_decoder"].astype(np.int64) < t["prompt_lens"]) | (t["accept_num"] == 0)
        assert (allowed[hidden]).all(), f"seed={seed}"
        produced = ~preempted & ~(t["seq_lens_decoder"].astype(np.int64) < t["prompt_lens"])
        np.testing.assert_array_equal(counts[produced], t["accept_num"][produced], err_msg=f"seed={seed}")
