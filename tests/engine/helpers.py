"""Engine-side fixtures without a model: a scheduler with admitted requests and hand-built step messages."""
from __future__ import annotations

import numpy as np

from fastdeploy.config import CacheConfig, FDConfig, SchedulerConfig, SpeculativeConfig
from fastdeploy.engine.request import Request
from fastdeploy.engine.resource_manager import ResourceManager
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.engine.step_io import RunnerOutput

EOS = 257


def make_config(k: int = 1, slots: int = 4, blocks: int = 64, block_size: int = 4, budget: int = 64) -> FDConfig:
    spec = SpeculativeConfig("mtp", k) if k else SpeculativeConfig()
    return FDConfig(model="fd-toy", speculative=spec, cache=CacheConfig(block_size, blocks),
                    scheduler=SchedulerConfig(max_num_seqs=slots, max_model_len=64, max_num_batched_tokens=budget))


def make_engine_parts(config: FDConfig) -> tuple[Scheduler, ResourceManager]:
    resources = ResourceManager(config.scheduler.max_num_seqs, config.cache.num_kv_blocks,
                                config.cache.block_size, config.blocks_per_seq)
    return Scheduler(config, resources), resources


def add_request(scheduler: Scheduler, rid: str, prompt_len: int = 5, **params) -> Request:
    request = Request(request_id=rid, prompt_token_ids=[256] + [97] * (prompt_len - 1),
                      params=SamplingParams(**params), eos_token_ids=(EOS,), stop_seqs=(), arrival=int(rid))
    scheduler.add_request(request)
    return request


def message(entries: list[list[int]], width: int, not_need_stop: bool = True) -> np.ndarray:
    """An OPS §5.7 step message: one entry per slot, [] for count 0, [-9] / [-3] sentinels, else tokens."""
    bsz = len(entries)
    msg = np.zeros(2 + bsz + bsz * width, np.int64)
    msg[0], msg[1] = (1 if not_need_stop else -1), bsz
    for j, entry in enumerate(entries):
        if entry in ([-9], [-3]):
            msg[2 + j] = entry[0]
        else:
            msg[2 + j] = len(entry)
            msg[2 + bsz + j * width: 2 + bsz + j * width + len(entry)] = entry
    return msg


def runner_output(entries: list[list[int]], width: int, draft_counts: list[int] | None = None) -> RunnerOutput:
    counts = np.asarray(draft_counts if draft_counts is not None else [-1] * len(entries), np.int32)
    return RunnerOutput(message=message(entries, width), draft_counts=counts, parked_slots=())
