"""Engine-side fixtures without a model: a scheduler with admitted requests and hand-built step messages."""
from __future__ import annotations

import numpy as np

from fastdeploy.config import CacheConfig, FDConfig, SchedulerConfig, SpeculativeConfig
from fastdeploy.engine.connector.base import MixedConnector
from fastdeploy.engine.resource_manager import ResourceManager
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.output.token_processor import TokenProcessor
from fastdeploy.schema.request import Request, RequestStatus
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.schema.step_io import RunnerOutput

EOS = 257


def make_config(k: int = 1, slots: int = 4, blocks: int = 64, block_size: int = 4, budget: int = 64) -> FDConfig:
    spec = SpeculativeConfig("mtp", k) if k else SpeculativeConfig()
    return FDConfig(model="fd-toy", speculative=spec, cache=CacheConfig(block_size, blocks),
                    scheduler=SchedulerConfig(max_num_seqs=slots, max_model_len=64, max_num_batched_tokens=budget))


def make_engine_parts(config: FDConfig) -> tuple[Scheduler, ResourceManager]:
    """A mixed instance's scheduler and resource manager, as LLMEngine wires them."""
    resources = ResourceManager(config.scheduler.max_num_seqs, config.cache.num_kv_blocks,
                                config.cache.block_size, config.blocks_per_seq, config.kv_identity,
                                config.num_speculative_tokens > 0, prefix_caching=config.enable_prefix_caching)
    connector = MixedConnector()
    scheduler = Scheduler(config, resources, connector)
    connector.bind(scheduler, resources, "test")
    return scheduler, resources


def add_request(scheduler: Scheduler, rid: str, prompt_len: int = 5, **params) -> Request:
    request = Request(request_id=rid, prompt_token_ids=[256] + [97] * (prompt_len - 1),
                      params=SamplingParams(**params), eos_token_ids=(EOS,), stop_seqs=(), arrival=int(rid))
    scheduler.add_request(request, RequestStatus.WAITING)
    return request


class StepOutputs:
    """Applies hand-built runner outputs as LLMEngine does: the token processor reads them, the scheduler decides.
    `apply` returns the requests the output finished."""

    def __init__(self, scheduler: Scheduler, resources: ResourceManager):
        self.scheduler = scheduler
        self.processor = TokenProcessor(resources.owner)

    def apply(self, output: RunnerOutput) -> list[Request]:
        return self.scheduler.update_from_output(self.processor.process(output), output.parked_slots)

    @property
    def anomalies(self) -> list[str]:
        return self.processor.anomalies + self.scheduler.anomalies


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
