"""A bounded soak against PD services through the router (SERVICES §8 "Load"): 32 concurrent clients, a few
hundred requests with random prompt and output lengths, stop strings, min_tokens, streamed and not, some clients
leaving mid-stream. Zero hangs (every request bounded), zero unexpected errors, every completed request equal to
the in-process LLM (PD_MTP_FLOW §10.1 O1), and every slot and block free on P and D at the end (O3)."""
from __future__ import annotations

import asyncio
import random

import httpx
from openai import AsyncOpenAI

from fastdeploy import LLM, SamplingParams
from tests.services import deployment as deploy

CLIENTS, REQUESTS, SEED, K = 32, 256, 20261202, 1
WORDS = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "seven", "orbit", "quiet"]
REQUEST_BOUND_S = 120.0  # far beyond any request here: only a hang reaches it


def workload() -> list[dict]:
    rng = random.Random(SEED)
    jobs = []
    for _ in range(REQUESTS):
        max_tokens = rng.randint(1, 32)
        jobs.append({"prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))),
                     "max_tokens": max_tokens, "min_tokens": min(max_tokens, rng.choice([0, 0, 0, 2, 5])),
                     "stop": rng.choice([None, None, ["e"], ["a", "o "], ["ta"]]),
                     "stream": rng.random() < 0.5, "disconnect": rng.random() < 0.1})
    return jobs


async def run_one(client: AsyncOpenAI, raw: httpx.AsyncClient, job: dict) -> str | None:
    common = dict(model="fd-toy", prompt=job["prompt"], max_tokens=job["max_tokens"], temperature=0,
                  stop=job["stop"], extra_body={"min_tokens": job["min_tokens"]})
    if job["disconnect"]:
        body = {"model": "fd-toy", "prompt": job["prompt"], "max_tokens": 400, "min_tokens": 400, "stream": True}
        async with raw.stream("POST", "/v1/completions", json=body) as stream:
            await anext(stream.aiter_lines())  # then leave while P or D still works on it
        return None
    if job["stream"]:
        chunks = [chunk async for chunk in await client.completions.create(stream=True, **common)]
        return "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    return (await client.completions.create(**common)).choices[0].text


async def drive(url: str, jobs: list[dict]) -> list[str | None]:
    """Runs `jobs` with CLIENTS concurrent clients; each request is bounded by REQUEST_BOUND_S."""
    results: list[str | None] = [None] * len(jobs)
    pending = iter(enumerate(jobs))
    async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=REQUEST_BOUND_S) as \
            client, httpx.AsyncClient(base_url=url, timeout=REQUEST_BOUND_S) as raw:
        async def one_client():
            for index, job in pending:
                results[index] = await asyncio.wait_for(run_one(client, raw, job), REQUEST_BOUND_S)

        await asyncio.gather(*(one_client() for _ in range(CLIENTS)))
    return results


def test_soak_through_router_matches_llm_and_frees_everything():
    """SERVICES §8 "Load": no hang, no error, texts equal the in-process LLM, nothing held on P or D after."""
    jobs = workload()
    deployment = deploy.pd_deployment(k=K, prefill_flags=("--max-model-len", "1024"),
                                      decode_flags=("--max-model-len", "1024"), wait=False)
    try:
        kept = [j for j in jobs if not j["disconnect"]]
        llm = LLM(model="fd-toy", speculative_config={"method": "mtp", "num_speculative_tokens": K})
        params = [SamplingParams(max_tokens=j["max_tokens"], min_tokens=j["min_tokens"], stop=j["stop"])
                  for j in kept]
        want = [o.outputs.text for o in llm.generate([j["prompt"] for j in kept], params, use_tqdm=False)]
        deployment.await_ready()
        results = asyncio.run(drive(deployment.router.url, jobs))
        got = [text for job, text in zip(jobs, results) if not job["disconnect"]]
        mismatches = [(j["prompt"], w, g) for j, w, g in zip(kept, want, got) if w != g]
        assert not mismatches, f"{len(mismatches)} of {len(kept)} differ, e.g. {mismatches[:3]}"
        deployment.wait_nothing_held()
        rows = deploy.registered(deployment.router)
        assert all(row["outstanding"] == 0 for row in rows.values()), rows
    finally:
        deployment.stop()
