"""Concurrent clients against one mixed instance (SERVICES §8 "Load", for one instance): 32 clients x 3 requests
with random prompt and output lengths, stop strings, streamed and not, some clients disconnecting mid-stream; every
completed request equals the in-process LLM, none errors, and afterwards every slot and block is free."""
from __future__ import annotations

import asyncio
import random

import httpx
from openai import AsyncOpenAI

from fastdeploy import LLM, SamplingParams
from tests.services import launcher

CLIENTS, REQUESTS_EACH, SEED = 32, 3, 20261201
WORDS = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "seven", "orbit", "quiet"]


def _workload() -> list[dict]:
    rng = random.Random(SEED)
    jobs = []
    for i in range(CLIENTS * REQUESTS_EACH):
        jobs.append({"prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))),
                     "max_tokens": rng.randint(1, 24), "stop": rng.choice([None, None, ["e"], ["a", "o "]]),
                     "stream": rng.random() < 0.5, "disconnect": rng.random() < 0.1})
    return jobs


async def _run(client: AsyncOpenAI, url: str, job: dict) -> str | None:
    common = dict(model="fd-toy", prompt=job["prompt"], max_tokens=job["max_tokens"], temperature=0,
                  stop=job["stop"])
    if job["disconnect"]:
        body = {**common, "max_tokens": 1000, "min_tokens": 1000, "stream": True}   # long: still running when left
        async with httpx.AsyncClient(timeout=60) as raw, raw.stream("POST", url + "/v1/completions",
                                                                    json=body) as stream:
            await anext(stream.aiter_lines())
        return None
    if job["stream"]:
        chunks = [c async for c in await client.completions.create(stream=True, **common)]
        return "".join(c.choices[0].text for c in chunks if c.choices)
    return (await client.completions.create(**common)).choices[0].text


def test_32_concurrent_clients_match_llm_and_leave_nothing_held():
    """No request errors; texts equal the in-process LLM; /metrics shows every slot and block free at the end."""
    jobs = _workload()
    with launcher.serving("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}',
                          "--max-model-len", "1100", wait_ready=False) as server:
        llm = LLM(model="fd-toy", speculative_config={"method": "mtp", "num_speculative_tokens": 1})
        kept = [j for j in jobs if not j["disconnect"]]
        want = [o.outputs.text for o in llm.generate(
            [j["prompt"] for j in kept], [SamplingParams(max_tokens=j["max_tokens"], stop=j["stop"]) for j in kept],
            use_tqdm=False)]
        launcher.await_ready(server)

        async def clients():
            client = AsyncOpenAI(base_url=server.openai_base_url, api_key="unused", max_retries=0, timeout=120)
            queue = iter(jobs)

            async def one_client():
                return [await _run(client, server.url, job) for job in [next(queue) for _ in range(REQUESTS_EACH)]]

            results = await asyncio.gather(*(one_client() for _ in range(CLIENTS)))
            await client.close()
            return [text for per_client in results for text in per_client]

        got = asyncio.run(clients())
        assert [g for g, j in zip(got, jobs) if not j["disconnect"]] == want
        server.wait_until(launcher.nothing_held, "every slot and block free after the load")
        m = server.metrics()
        assert m["fastdeploy:request_aborted_total"] == sum(j["disconnect"] for j in jobs)
        assert sum(v for k, v in m.items() if k.startswith("fastdeploy:request_success_total{")) == len(kept)
