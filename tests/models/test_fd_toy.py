"""fd-toy, the deterministic test model of PD_MTP_FLOW §10.3."""
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.models import get_model
from fastdeploy.model_executor.models.fd_toy import FREQUENT_TOKENS, extend_hash, prefix_hashes
from fastdeploy.model_executor.models.tokenizer import BOS_ID, EOS_ID
from fastdeploy.worker.kv_transfer import PromptKVPort

from .paged_runner import greedy_decode, packed_batch, scattered_tables

BLOCK = 4


def _prompt(rng, length):
    return [BOS_ID, *rng.integers(32, 127, length - 1).tolist()]


def test_prefix_hashes_equal_token_by_token_extension():
    """The vectorised prefix hash is the same polynomial as extending one token at a time."""
    tokens = np.random.default_rng(0).integers(0, 259, 300)
    h, step = prefix_hashes(tokens), np.zeros(1, np.uint64)
    for i, t in enumerate(tokens):
        step = extend_hash(step, [t])
        assert step[0] == h[i]


def test_paged_forward_matches_the_pure_greedy_reference():
    """Target outputs read from scattered cache blocks equal greedy_generate (no cache) for many prompts."""
    model, rng = get_model("fd-toy"), np.random.default_rng(1)
    for _ in range(10):
        prompt = _prompt(rng, int(rng.integers(2, 20)))
        kv = model.new_kv_cache(32, BLOCK)
        table = scattered_tables(rng, 1, 12, 32)[0]
        ref = model.greedy_generate(prompt, 12)
        got = greedy_decode(model, kv, prompt, table, len(ref))
        assert got == ref


def test_corrupting_one_cache_block_changes_the_next_prediction():
    """PD_MTP_FLOW §10.3: the next token depends on the whole context read back from the blocks; a lost block shows."""
    model, rng = get_model("fd-toy"), np.random.default_rng(2)
    prompt = _prompt(rng, 14)
    table = np.array([9, 3, 6, 1, 0], np.int32)
    changed = 0
    for victim in range(3):                       # the three full blocks of the prompt
        kv = model.new_kv_cache(10, BLOCK)
        model.forward(packed_batch([prompt], [0], table[None]), kv)
        logits, _ = model.forward(packed_batch([[ord("x")]], [14], table[None]), kv)
        clean = logits.numpy()[0]
        kv.layers[0][int(table[victim])] = kv.layers[0][int(table[victim])] + 1.0
        logits, _ = model.forward(packed_batch([[ord("x")]], [14], table[None]), kv)
        changed += int(not np.array_equal(logits.numpy()[0], clean))
    assert changed == 3


def test_batched_sequences_equal_sequences_run_alone():
    """Packing several sequences (prefill and decode mixed) changes nothing for each of them."""
    model, rng = get_model("fd-toy"), np.random.default_rng(3)
    prompts = [_prompt(rng, n) for n in (3, 9, 6)]
    tables = scattered_tables(rng, 3, 4, 16)
    kv = model.new_kv_cache(16, BLOCK)
    batched, _ = model.forward(packed_batch(prompts, [0, 0, 0], tables), kv)
    for i, prompt in enumerate(prompts):
        alone, _ = model.forward(packed_batch([prompt], [0], tables[i:i + 1]), model.new_kv_cache(16, BLOCK))
        lo = sum(len(p) for p in prompts[:i])
        np.testing.assert_array_equal(batched.numpy()[lo:lo + len(prompt)], alone.numpy())


def test_logit_ranking_is_strict_and_second_choice_is_never_eos():
    """Argmax = prediction; runner-up is a printable token other than EOS (min_tokens suppression is
    deterministic, PD_MTP_FLOW §10.2); all logits distinct."""
    model, rng = get_model("fd-toy", eos_rate=0.2), np.random.default_rng(4)
    prompts = [_prompt(rng, 12) for _ in range(40)]
    tables = scattered_tables(rng, 40, 3, 120)
    logits, _ = model.forward(packed_batch(prompts, [0] * 40, tables), model.new_kv_cache(120, BLOCK))
    logits = logits.numpy()
    order = np.argsort(-logits, axis=1)
    assert (order[:, 1] != EOS_ID).all() and (order[:, 0] == EOS_ID).any()
    assert all(len(set(row.tolist())) == row.size for row in logits)


def test_eos_and_frequent_tokens_occur_at_their_configured_rates():
    """EOS ~ eos_rate per position; the frequent tokens ~ 10 % each (stop sequences are buildable)."""
    model, rng = get_model("fd-toy", eos_rate=0.04), np.random.default_rng(5)
    preds = np.array([model.target_choices(_prompt(rng, 8))[0] for _ in range(4000)])
    assert 0.025 < np.mean(preds == EOS_ID) < 0.055
    for tok in FREQUENT_TOKENS:
        assert np.mean(preds == tok) > 0.08


@pytest.mark.parametrize("agreement", [0.0, 0.7, 1.0])
def test_mtp_agrees_with_the_target_at_the_configured_rate(agreement):
    """The MTP draft for p + 2 equals the target's prediction with probability mtp_agreement."""
    model, rng = get_model("fd-toy", mtp_agreement=agreement), np.random.default_rng(6)
    contexts = [_prompt(rng, 10) for _ in range(2000)]
    rate = np.mean([model.mtp_draft(c) == model.target_choices(c)[0] for c in contexts])
    assert abs(rate - agreement) < 0.04


def test_mtp_forward_reads_its_own_cache_and_chains_on_its_hidden():
    """MTP prefill at p (hidden at p, token p+1) drafts for p + 2 = mtp_draft(context 0..p+1); feeding its
    hidden back with the next token drafts one further, as the proposer does for K > 1 (docs/design.md §3)."""
    model, rng = get_model("fd-toy"), np.random.default_rng(7)
    prompt = _prompt(rng, 11)
    table = scattered_tables(rng, 1, 5, 20)
    kv = model.new_kv_cache(20, BLOCK)
    logits, hidden = model.forward(packed_batch([prompt], [0], table), kv)
    t0 = int(logits.numpy()[-1].argmax())
    context = prompt + [t0]
    mtp_logits, mtp_hidden = model.mtp_forward(packed_batch([context[1:]], [0], table), hidden, kv)
    drafts = mtp_logits.numpy().argmax(axis=1)
    for p in range(len(prompt)):
        assert drafts[p] == model.mtp_draft(context[:p + 2])
    d1 = int(drafts[-1])
    chained, _ = model.mtp_forward(packed_batch([[d1]], [len(prompt)], table), mtp_hidden[-1:], kv)
    assert int(chained.numpy()[0].argmax()) == model.mtp_draft(context + [d1])


def test_mtp_output_changes_when_its_cache_layer_is_lost():
    """D continues from P's MTP KV (PD_MTP_FLOW §3): an MTP layer that was not transferred changes drafts."""
    model, rng = get_model("fd-toy", mtp_agreement=0.5), np.random.default_rng(8)
    prompts = [_prompt(rng, 9) for _ in range(16)]
    tables = scattered_tables(rng, 16, 3, 48)
    kv = model.new_kv_cache(48, BLOCK)
    _, hidden = model.forward(packed_batch(prompts, [0] * 16, tables), kv)
    shifted = [p[1:] + [ord("e")] for p in prompts]
    model.mtp_forward(packed_batch(shifted, [0] * 16, tables), hidden, kv)
    step = packed_batch([[ord("a")]] * 16, [9] * 16, tables)
    step_hidden = np.full((16, 1), ord("e"), np.float32)
    clean = model.mtp_forward(step, paddle.to_tensor(step_hidden), kv)[0].numpy().argmax(1)
    kv.layers[1][:] = 0.0
    lost = model.mtp_forward(step, paddle.to_tensor(step_hidden), kv)[0].numpy().argmax(1)
    assert (clean != lost).any()


def test_block_copy_to_another_cache_preserves_outputs():
    """The P->D hand-off: the prompt KV moved to different block ids in another cache gives the same
    continuation."""
    model, rng = get_model("fd-toy"), np.random.default_rng(9)
    prompt = _prompt(rng, 10)
    p_table, d_table = np.array([4, 1, 7, 2], np.int32), np.array([0, 5, 3, 6], np.int32)
    p_kv, d_kv = model.new_kv_cache(8, BLOCK), model.new_kv_cache(8, BLOCK)
    logits, _ = model.forward(packed_batch([prompt], [0], p_table[None]), p_kv)
    t0 = int(logits.numpy()[-1].argmax())
    PromptKVPort(d_kv, model.num_target_layers).write_prompt_kv(
        d_table[:3], *PromptKVPort(p_kv, model.num_target_layers).read_prompt_kv(p_table[:3], len(prompt)))
    on_p, _ = model.forward(packed_batch([[t0]], [10], p_table[None]), p_kv)
    on_d, _ = model.forward(packed_batch([[t0]], [10], d_table[None]), d_kv)
    np.testing.assert_array_equal(on_p.numpy(), on_d.numpy())


def test_float64_model_gives_the_same_tokens_as_float32():
    """dtype changes the tensor type only; the integer function is identical."""
    rng = np.random.default_rng(10)
    prompt = _prompt(rng, 7)
    table = np.arange(6, dtype=np.int32)
    out32 = greedy_decode(get_model("fd-toy"), get_model("fd-toy").new_kv_cache(6, BLOCK), prompt, table, 10)
    m64 = get_model("fd-toy", dtype="float64")
    logits, hidden = m64.forward(packed_batch([prompt], [0], table[None]), m64.new_kv_cache(6, BLOCK))
    assert logits.dtype == paddle.float64 and hidden.dtype == paddle.float64
    out64 = greedy_decode(m64, m64.new_kv_cache(6, BLOCK), prompt, table, 10)
    assert out32 == out64
