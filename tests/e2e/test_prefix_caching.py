"""Prefix caching is exact (PD_MTP_FLOW §13): with the cache on, every request computes what it computes with the
cache off — greedy text, per-request acceptance counts under MTP (a wrong draft KV changes drafts, never greedy
text) and logprobs within the documented tolerance — single and PD, K = 0, 1, 2, over prompts that share 0, 1,
several and all full blocks with earlier ones, of exactly a block multiple and one token into a block. The hits are
counted by value: each request's cached tokens equal what the earlier requests imply."""
from __future__ import annotations

import numpy as np
import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.schema.step_io import PreemptTask

from .test_logprobs import TOLERANCE

BLOCK = 8
ENGINE = dict(model="fd-tiny", max_num_seqs=4, block_size=BLOCK, max_model_len=128, max_num_batched_tokens=24)
CONFIGS = [(pd, k) for pd in (False, True) for k in (0, 1, 2)]
IDS = [f"{'pd' if pd else 'single'}-k{k}" for pd, k in CONFIGS]


def _spec(k: int) -> dict | None:
    return {"method": "mtp", "num_speculative_tokens": k} if k else None


def sharing_prompts(seed: int = 3) -> list[list[int]]:
    """Run in this order: a base of 4 full blocks, then prompts sharing all, several, one and none of its blocks,
    each of exactly a block multiple or ending one token into a block, and repeats (a whole-prompt hit)."""
    rng = np.random.default_rng(seed)
    base = [256, *rng.integers(32, 127, 4 * BLOCK - 1).tolist()]

    def tail(n: int) -> list[int]:
        return rng.integers(32, 127, n).tolist()

    prompts = [base]
    for shared in (4, 3, 1, 0):
        head = base[:shared * BLOCK] if shared else [256]
        for length in (shared * BLOCK + BLOCK, shared * BLOCK + 1, shared * BLOCK + 2 * BLOCK + 1):
            prompts.append(head + tail(length - len(head)))
    prompts += [base, base + [40], prompts[2], base[:2 * BLOCK], base[:2 * BLOCK + 1]]
    return prompts


def expected_cached_tokens(prompts: list[list[int]], k: int) -> list[int]:
    """PD_MTP_FLOW §13 by hand, for requests run one after another that each go on past t0: a request caches its
    full blocks j with (j + 1)·bs <= L (K = 0) or <= L - 1 (MTP: the next token is a prompt token), and hits the
    longest run of blocks some earlier request cached with the same tokens (and next token), at most
    ⌊(L - 1)/bs⌋ blocks."""
    extra = 1 if k else 0
    cached: set[tuple[int, ...]] = set()
    hits = []
    for prompt in prompts:
        n = 0
        while n < (len(prompt) - 1) // BLOCK and tuple(prompt[:(n + 1) * BLOCK + extra]) in cached:
            n += 1
        hits.append(n * BLOCK)
        for j in range((len(prompt) - extra) // BLOCK):
            cached.add(tuple(prompt[:(j + 1) * BLOCK + extra]))
    return hits


def run_one_by_one(prompts, params, **engine):
    llm = LLM(**{**ENGINE, **engine})
    outputs = [llm.generate([p], [params], use_tqdm=False)[0] for p in prompts]
    return llm, outputs


@pytest.fixture(scope="module", params=CONFIGS, ids=IDS)
def runs(request):
    """(pd, k, prompts, {cache: (LLM, outputs)}), greedy with logprobs, requests one after another."""
    pd, k = request.param
    prompts = sharing_prompts()
    params = SamplingParams(max_tokens=10, ignore_eos=True, logprobs=3)
    return pd, k, prompts, {cache: run_one_by_one(prompts, params, speculative_config=_spec(k), splitwise=pd,
                                                  enable_prefix_caching=cache) for cache in (False, True)}


def test_same_text_acceptance_and_logprobs_with_the_cache_on_and_off(runs):
    _, _, _, results = runs
    _, off = results[False]
    _, on = results[True]
    atol = TOLERANCE["float32"]
    for i, (want, got) in enumerate(zip(off, on)):
        assert got.error is None and got.outputs.token_ids == want.outputs.token_ids, i
        assert got.metrics.accepted_per_round == want.metrics.accepted_per_round, \
            f"prompt {i}: acceptance differs with the cache on, a reused draft KV is not this request's"
        for j, (w, g) in enumerate(zip(want.outputs.logprobs, got.outputs.logprobs)):
            assert abs(g.logprob - w.logprob) <= atol, (i, j)
            np.testing.assert_allclose(g.top_logprobs, w.top_logprobs, rtol=0, atol=atol, err_msg=f"{i}, {j}")


def test_cached_tokens_are_what_the_earlier_requests_imply(runs):
    """Each output's num_cached_tokens, and the instance's counters, match the hand count; under PD both P and D
    hit (P computes the prompts over its cached blocks, D reserves with its own and P sends only the rest,
    PD_MTP_FLOW §13.6), the output reports D's hits, and the KV that crossed to D is exactly the positions D's
    cache did not hold."""
    pd, k, prompts, results = runs
    llm, on = results[True]
    want = expected_cached_tokens(prompts, k)
    assert sum(want) >= 10 * BLOCK and 0 in want[1:], "the workload must hit, and miss too"
    engines = {e.role: e for e in llm._engines}
    for role in ("prefill", "decode") if pd else ("mixed",):
        looked_up = engines[role].resources.prefix_counters
        assert (looked_up.requests, looked_up.hit_requests, looked_up.query_tokens, looked_up.hit_tokens) == \
            (len(prompts), sum(h > 0 for h in want), sum(map(len, prompts)), sum(want)), role
    assert [o.num_cached_tokens for o in on] == want
    _, off = results[False]
    assert all(o.num_cached_tokens == 0 for o in off)
    if pd:
        sent_off = {e.role: e for e in results[False][0]._engines}["decode"].connector.counters()
        per_position = sent_off["kv_bytes_received"] // sum(map(len, prompts))
        assert engines["decode"].connector.counters()["kv_bytes_received"] == \
            per_position * sum(len(p) - hit for p, hit in zip(prompts, want))


def preempt_each_request_once(llm: LLM, after_tokens: int) -> None:
    """Make the scheduler preempt every request once, in the step after its output reached `after_tokens`; it is
    then recomputed from prompt + outputs (PD_MTP_FLOW §7.2), over the cached blocks when the cache is on."""
    scheduler = llm.engine.scheduler
    schedule = scheduler.schedule

    def schedule_with_preemptions():
        plan = schedule()
        for request in scheduler.running:
            if len(request.output_token_ids) >= after_tokens and request.metrics.num_preemptions == 0 and \
                    not request.is_preempting and not request.is_prefilling and request.slot not in \
                    {t.slot for t in plan.preempt_tasks}:
                request.is_preempting = True
                plan.preempt_tasks.append(PreemptTask(request.slot))
        return plan

    scheduler.schedule = schedule_with_preemptions


@pytest.mark.parametrize("k", [0, 2])
def test_batched_and_preempted_requests_on_shared_blocks_give_the_same_text(k):
    """Requests sharing a prefix admitted together (hits on blocks cached a step earlier), each preempted once and
    recomputed over shared blocks, the pool small enough to evict: the same text and acceptance as without the
    cache, the block accounting whole after every step, every block back in the pool at the end."""
    prompts = sharing_prompts(seed=5) * 2
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    results = {}
    for cache in (False, True):
        llm = LLM(**{**ENGINE, "num_kv_blocks": 24}, speculative_config=_spec(k), enable_prefix_caching=cache,
                  trace_hook=lambda trace: llm.engine.resources.check_invariant())
        preempt_each_request_once(llm, after_tokens=3)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        stats = llm.resource_stats()
        assert stats.free_kv_blocks == stats.total_kv_blocks and stats.running_requests == 0
        results[cache] = [(o.outputs.token_ids, o.metrics.accepted_per_round) for o in outputs]
        assert all(o.metrics.num_preemptions >= 1 for o in outputs)
    assert results[True] == results[False]
    resources = llm.engine.resources
    assert resources.prefix_counters.hit_tokens > 0


def test_reset_prefix_cache_drops_unreferenced_blocks_so_the_next_request_misses():
    llm = LLM(**ENGINE)
    prompt = sharing_prompts()[0]
    params = SamplingParams(max_tokens=4)
    llm.generate([prompt], params, use_tqdm=False)
    assert llm.generate([prompt], params, use_tqdm=False)[0].num_cached_tokens == 3 * BLOCK
    assert llm.reset_prefix_cache() == 4 and llm.resource_stats().cached_kv_blocks == 0
    assert llm.generate([prompt], params, use_tqdm=False)[0].num_cached_tokens == 0


@pytest.mark.parametrize("pd", [False, True], ids=["single", "pd"])
@pytest.mark.parametrize("k", [1, 2])
def test_a_prompt_whose_first_token_stops_it_caches_only_chunks_its_mtp_ran_for(pd, k):
    """max_tokens = 1: t0 stops the slot and the proposer skips it, so the prompt's last chunk has no MTP KV and is
    not cached (PD_MTP_FLOW §13); a longer prompt extending it then has the acceptance it has without the cache."""
    rng = np.random.default_rng(11)
    first = [256, *rng.integers(32, 127, 5 * BLOCK + 4).tolist()]      # chunks of 24: the last holds 2 full blocks
    longer = first + rng.integers(32, 127, 9).tolist()
    results = {}
    for cache in (False, True):
        llm = LLM(**ENGINE, speculative_config=_spec(k), splitwise=pd, enable_prefix_caching=cache)
        llm.generate([first], SamplingParams(max_tokens=1), use_tqdm=False)
        out = llm.generate([longer], SamplingParams(max_tokens=12, ignore_eos=True), use_tqdm=False)[0]
        results[cache] = (out.outputs.token_ids, out.metrics.accepted_per_round)
        engine = {e.role: e for e in llm._engines}["prefill" if pd else "mixed"]
        hits = engine.resources.prefix_counters.hit_tokens
    assert results[True] == results[False], "a cached block without its MTP KV changed the drafts"
    assert hits == 3 * BLOCK, "only the blocks of the first chunk (positions 0..23) are cached"
