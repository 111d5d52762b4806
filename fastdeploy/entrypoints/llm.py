"""The offline API: `LLM(model=...).generate(prompts, params)` on one in-process instance, or with
`splitwise=True` on a prefill and a decode instance joined by the P→D connector (PD_MTP_FLOW §1)."""
from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from fastdeploy.config import CacheConfig, FDConfig, SchedulerConfig, SpeculativeConfig
from fastdeploy.engine.engine import LLMEngine, StepTrace
from fastdeploy.engine.pd import PDEngine
from fastdeploy.engine.request import CompletionOutput, Request, RequestMetrics, RequestOutput
from fastdeploy.engine.resource_manager import ResourceStats
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.watchdog import Watchdog
from fastdeploy.entrypoints.pd_builder import build_pd_engine
from fastdeploy.model_executor.models import get_model
from fastdeploy.output.token_processor import TokenProcessor
from fastdeploy.splitwise import HandoffDeadlines
from fastdeploy.worker import make_runner

Prompt = str | Sequence[int]


class LLM:
    """One single-role instance, or with `splitwise=True` a PD pair in this process (docs/design.md §6): same
    results and metrics, plus `RequestOutput.pd_timings`; `trace_hook` then sees D's steps. `max_idle_steps`
    bounds the steps in a row in which no token is emitted and no request finishes before generate() gives up with
    RuntimeError naming the stuck requests (a liveness guard; it never fires in a correct engine; steps in which a
    PD pair only waits on the connector count against the hand-off deadlines instead)."""

    def __init__(self, model: str = "fd-tiny", speculative_config: SpeculativeConfig | dict | None = None,
                 max_num_seqs: int = 8, block_size: int = 16, num_kv_blocks: int | None = None,
                 dtype: str = "float32", ops_backend: str = "cpu", max_model_len: int = 512,
                 max_num_batched_tokens: int = 256, runner: str = "xpu", max_stop_seqs: int = 4,
                 max_stop_seq_len: int = 16, model_options: dict | None = None,
                 trace_hook: Callable[[StepTrace], None] | None = None, max_idle_steps: int = 1000,
                 splitwise: bool = False, pd_deadlines: HandoffDeadlines | None = None):
        speculative = SpeculativeConfig.from_user(speculative_config)
        self.config = FDConfig(
            model=model, dtype=dtype, runner=runner, ops_backend=ops_backend, speculative=speculative,
            cache=CacheConfig(block_size=block_size, num_kv_blocks=num_kv_blocks),
            scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                                      max_num_batched_tokens=max_num_batched_tokens, max_stop_seqs=max_stop_seqs,
                                      max_stop_seq_len=max_stop_seq_len))
        self.model = get_model(model, dtype=dtype, **(model_options or {}))
        self.tokenizer = self.model.tokenizer
        if splitwise:
            self.engine = build_pd_engine(self.config, self.model, deadlines=pd_deadlines,
                                          decode_trace_hook=trace_hook)
        else:
            self.engine = LLMEngine(self.config, make_runner(self.config, self.model), self.model.eos_token_ids,
                                    self.model.vocab_size, TokenProcessor, trace_hook=trace_hook)
        self.max_idle_steps = max_idle_steps
        self._ids = itertools.count()

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs are in prompt order. A request the engine rejects comes back
        finished with finish_reason "error" and the reason in `error`; the others run normally."""
        prompts = [prompts] if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)) \
            else list(prompts)
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"LLM.generate: argument 'params' has {len(params)} entries for "
                             f"{len(prompts)} prompts")
        results: list[Request | RequestOutput] = [self._submit(p, sp) for p, sp in zip(prompts, params)]
        self._run_until_done()
        return [r if isinstance(r, RequestOutput) else self._output(r) for r in results]

    def resource_stats(self) -> ResourceStats | dict[str, ResourceStats]:
        """The instance's slots and blocks; with splitwise, {"prefill": ..., "decode": ...}."""
        if isinstance(self.engine, PDEngine):
            return {"prefill": self.engine.prefill.resources.stats(), "decode": self.engine.decode.resources.stats()}
        return self.engine.resources.stats()

    def _submit(self, prompt: Prompt, params: SamplingParams) -> Request | RequestOutput:
        request_id = str(next(self._ids))
        text = prompt if isinstance(prompt, str) else None
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        stop_seqs = tuple(tuple(self.tokenizer.encode(s, add_bos=False)) for s in params.stop)
        try:
            return self.engine.add_request(request_id, token_ids, params, stop_seqs, prompt=text)
        except ValueError as error:
            return RequestOutput(request_id=request_id, prompt=text, prompt_token_ids=token_ids,
                                 outputs=CompletionOutput([], "", "error"), metrics=RequestMetrics(),
                                 finished=True, error=str(error))

    def _run_until_done(self) -> None:
        """Step until every request finished; a livelock or hang fails with RuntimeError naming the stuck requests
        (engine/watchdog.py). Real time passes, so waits on the other instance end at their deadlines."""
        watchdog = Watchdog(self.engine, self.max_idle_steps, owner="LLM", allow_connector_waits=True)
        while self.engine.has_unfinished():
            self.engine.step()
            watchdog.after_step()

    def _output(self, request: Request) -> RequestOutput:
        tokens = list(request.output_token_ids)
        text = self.tokenizer.decode([t for t in tokens if t not in request.eos_token_ids])
        return RequestOutput(request_id=request.request_id, prompt=request.prompt,
                             prompt_token_ids=list(request.prompt_token_ids),
                             outputs=CompletionOutput(tokens, text, request.finish_reason),
                             metrics=request.metrics, finished=True, error=request.error,
                             pd_timings=request.pd_timings)
