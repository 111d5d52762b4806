"""The offline API: `LLM(model=...).generate(prompts, params)` on one in-process instance, or with
`splitwise=True` on a prefill and a decode instance joined by the P→D connector (PD_MTP_FLOW §1)."""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from numbers import Integral
from pathlib import Path

from tqdm import tqdm

from fastdeploy.config import EMBEDDED_MODELS, CacheConfig, FDConfig, SchedulerConfig, SpeculativeConfig
from fastdeploy.entrypoints.chat_template import ChatTemplateError, chat_prompt_ids, chat_template_for
from fastdeploy.engine.engine import StepTrace
from fastdeploy.engine.resource_manager import ResourceStats
from fastdeploy.engine.watchdog import Watchdog
from fastdeploy.kv_budget import parse_bytes
from fastdeploy.entrypoints.openai.generation_defaults import sampling_defaults
from fastdeploy.entrypoints.pd_budget import in_process_share
from fastdeploy.entrypoints.pd_builder import build_engine, build_local_pd
from fastdeploy.model_executor.models import get_model
from fastdeploy.output.detokenizer import IncrementalDetokenizer, ends_with_a_stop_seq
from fastdeploy.schema.request import FINISH_ABORT, CompletionOutput, Request, RequestMetrics, RequestOutput
from fastdeploy.schema.sampling_params import SamplingParams
from fastdeploy.splitwise import HandoffDeadlines
from fastdeploy.tokenizer.loader import no_such_model

Prompt = str | Sequence[int]


class LLM:
    """One single-role instance, or with `splitwise=True` a PD pair in this process (docs/design.md §6): same
    results and metrics, plus `RequestOutput.pd_timings`; `trace_hook` then sees D's steps. `max_idle_steps`
    bounds the steps in a row in which no token is emitted and no request finishes before generate() gives up with
    RuntimeError naming the stuck requests (a liveness guard; it never fires in a correct engine; steps in which a
    PD pair only waits on the connector count against the hand-off deadlines instead). A checkpoint's KV cache is
    sized from `num_kv_blocks`, else `kv_cache_memory_bytes` (an int or "1G"), else `gpu_memory_utilization` of
    the host's memory less the weights, else 4 GiB (docs/serving.md "Memory"); with `splitwise` that budget is
    shared by P and D, as `fastdeploy serve --pd` shares the host's (default 4 GiB for both together).
    `generation_config` ("auto": the checkpoint's generation_config.json, "vllm": none, or a folder) gives the
    sampling defaults of the calls that pass no SamplingParams (vLLM's LLM; `get_default_sampling_params`).
    `async_scheduling` plans each step while the previous one computes (docs/design.md §10): the same outputs;
    the trace hook then runs while the next step computes and must not read the runner's state."""

    def __init__(self, model: str = "fd-tiny", speculative_config: SpeculativeConfig | dict | None = None,
                 max_num_seqs: int = 8, block_size: int = 16, num_kv_blocks: int | None = None,
                 dtype: str = "float32", ops_backend: str = "cpu", max_model_len: int | None = None,
                 max_num_batched_tokens: int = 256, runner: str = "xpu", max_stop_seqs: int = 4,
                 max_stop_seq_len: int = 16, model_options: dict | None = None,
                 trace_hook: Callable[[StepTrace], None] | None = None, max_idle_steps: int = 1000,
                 splitwise: bool = False, pd_deadlines: HandoffDeadlines | None = None,
                 enable_prefix_caching: bool = True, quantization: str | dict | None = None,
                 kv_cache_memory_bytes: int | str | None = None, gpu_memory_utilization: float | None = None,
                 kv_cache_dtype: str = "auto", generation_config: str = "auto", async_scheduling: bool = False):
        if model not in EMBEDDED_MODELS and not Path(model).is_dir():   # a hub id gets how to get the directory
            raise ValueError(f"LLM: argument 'model' {model}: {no_such_model(model)}")
        try:
            self._sampling_defaults = sampling_defaults(model, generation_config)
        except ValueError as error:
            raise ValueError(f"LLM: argument 'generation_config': {error}") from None
        speculative = SpeculativeConfig.from_user(speculative_config)
        if kv_cache_memory_bytes is not None:
            kv_cache_memory_bytes = parse_bytes(kv_cache_memory_bytes, "LLM: argument 'kv_cache_memory_bytes'")
        shared = None
        if splitwise and num_kv_blocks is None and model not in EMBEDDED_MODELS:
            # P and D hold one model object here; their KV caches share one budget (entrypoints/pd_budget.py)
            shared = in_process_share(model, dtype, kv_cache_memory_bytes, gpu_memory_utilization)
            kv_cache_memory_bytes, gpu_memory_utilization = shared.bytes, None
        self.config = FDConfig(
            model=model, dtype=dtype, quantization=quantization, runner=runner, ops_backend=ops_backend, speculative=speculative,
            enable_prefix_caching=enable_prefix_caching,
            cache=CacheConfig(block_size=block_size, num_kv_blocks=num_kv_blocks,
                              kv_cache_memory_bytes=kv_cache_memory_bytes,
                              gpu_memory_utilization=gpu_memory_utilization, kv_cache_dtype=kv_cache_dtype),
            scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                                      max_num_batched_tokens=max_num_batched_tokens, max_stop_seqs=max_stop_seqs,
                                      max_stop_seq_len=max_stop_seq_len, async_scheduling=async_scheduling))
        if shared is not None:   # the start line names the whole budget, not the share as if it were a flag
            used = self.config.cache.budget_source.partition(", ")[2]   # "N MiB used ..."
            self.config.cache.budget_source = f"{shared.source}, {used}" if used else shared.source
        self.model = get_model(model, dtype=self.config.dtype, speculative=speculative,
                               quantization=quantization, **(model_options or {}))
        self.tokenizer = self.model.tokenizer
        # With splitwise, `engine` is the in-process router over P and D (it adds requests and steps both).
        if splitwise:
            self.engine = build_local_pd(self.config, self.model, deadlines=pd_deadlines,
                                         decode_trace_hook=trace_hook)
            self._engines = self.engine.engines
        else:
            self.engine = build_engine(self.config, self.model, trace_hook=trace_hook)
            self._engines = (self.engine,)
        self.max_idle_steps = max_idle_steps
        self._ids = itertools.count()
        self._progress = tqdm(disable=True)   # generate() replaces it with the bar of its run

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run every prompt to completion; outputs are in prompt order. A prompt is a string or a list of token ids.
        A request the engine refuses (an empty prompt, one too long, ...) comes back finished with finish_reason
        "abort" and the reason in `error`; the others run normally. The text ends before the stop string that
        ended a request unless `params.include_stop_str_in_output`; no `params`: get_default_sampling_params().
        `use_tqdm` shows a progress bar over the prompts when stderr is a terminal. Wrong argument types raise
        ValueError naming the argument."""
        prompts = _prompt_list(prompts)
        if params is None or isinstance(params, SamplingParams):
            params = [params or self.get_default_sampling_params()] * len(prompts)
        elif not isinstance(params, Sequence) or not all(isinstance(p, SamplingParams) for p in params):
            raise ValueError(f"LLM.generate: argument 'params' must be a SamplingParams or a list of them, "
                             f"got {type(params).__name__}")
        if len(params) != len(prompts):
            raise ValueError(f"LLM.generate: argument 'params' has {len(params)} entries for "
                             f"{len(prompts)} prompts")
        results: list[Request | RequestOutput] = [self._submit(p, sp) for p, sp in zip(prompts, params)]
        stops = _StopWatch(self.tokenizer, [r for r in results if isinstance(r, Request)])
        # disable=None: no bar when stderr is not a terminal (a log file would get a line per update)
        with tqdm(total=len(prompts), desc="generate", unit="req", disable=None if use_tqdm else True) \
                as self._progress:
            self._progress.update(sum(isinstance(r, RequestOutput) for r in results))
            self._run_until_done(stops)
        return [r if isinstance(r, RequestOutput) else self._output(r, stops.emitted.get(r.request_id))
                for r in results]

    def chat(self, messages: Sequence[dict] | Sequence[Sequence[dict]],
             params: SamplingParams | Sequence[SamplingParams] | None = None, use_tqdm: bool = True,
             chat_template: str | None = None, add_generation_prompt: bool = True) -> list[RequestOutput]:
        """vLLM's LLM.chat: one conversation (a list of {"role", "content"} messages) or a list of them, each
        rendered with the model's chat template (or the Jinja file `chat_template`) into the token ids the API
        server's chat completions use (docs/serving.md "Chat template"), then generated as generate() does."""
        return self.generate(self.chat_prompts(messages, chat_template, add_generation_prompt), params, use_tqdm)

    def chat_prompts(self, messages: Sequence[dict] | Sequence[Sequence[dict]], chat_template: str | None = None,
                     add_generation_prompt: bool = True) -> list[list[int]]:
        """The token ids chat() generates from: one list per conversation."""
        template = chat_template_for(self.tokenizer, chat_template)
        if template is None:
            raise ValueError(f"LLM.chat: {self.model.name} ships no chat template; give chat_template=FILE")
        if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
            raise ValueError("LLM.chat: argument 'messages' must be a list of messages or a list of conversations")
        conversations = [messages] if isinstance(messages[0], dict) else list(messages)
        prompts = []
        for i, conversation in enumerate(conversations):
            try:
                text = template.render(list(conversation), add_generation_prompt=add_generation_prompt)
            except (ChatTemplateError, TypeError, ValueError) as error:
                raise ValueError(f"LLM.chat: conversation {i}: {error}") from None
            prompts.append(chat_prompt_ids(self.tokenizer, text))
        return prompts

    def stream(self, prompt: Prompt, params: SamplingParams | None = None,
               cancelled: Callable[[], bool] = lambda: False) -> TextStream:
        """One prompt's text in pieces as the engine emits its tokens: iterate the returned TextStream; its
        `output` is then the RequestOutput generate() would return (the pieces concatenate to its text).
        `cancelled()` is asked before every step: once True the request is aborted (finish_reason "abort")."""
        return TextStream(self, self._submit(prompt, params or self.get_default_sampling_params()), cancelled)

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM's: SamplingParams() with the checkpoint's generation_config.json sampling values (argument
        `generation_config`; entrypoints/openai/generation_defaults.py), what a call without params uses."""
        return SamplingParams(**self._sampling_defaults)

    def get_tokenizer(self):
        """The model's tokenizer (vLLM's LLM.get_tokenizer): encode, decode, special ids, chat template."""
        return self.tokenizer

    def resource_stats(self) -> ResourceStats | dict[str, ResourceStats]:
        """The instance's slots and blocks; with splitwise, {"prefill": ..., "decode": ...}."""
        if len(self._engines) > 1:
            return {engine.role: engine.stats() for engine in self._engines}
        return self.engine.stats()

    def reset_prefix_cache(self) -> int:
        """Drop every cached KV block no request references (vLLM's reset_prefix_cache); returns how many, over
        both instances with splitwise."""
        return sum(engine.reset_prefix_cache() for engine in self._engines)

    def _submit(self, prompt: Prompt, params: SamplingParams) -> Request | RequestOutput:
        request_id = str(next(self._ids))
        text = prompt if isinstance(prompt, str) else None
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        stop_seqs = tuple(tuple(self.tokenizer.encode(s, add_special_tokens=False)) for s in params.stop)
        try:
            if text is not None and not text.strip():
                raise ValueError(f"request {request_id}: 'prompt' must not be empty or whitespace only")
            return self.engine.add_request(request_id, token_ids, params, stop_seqs, prompt=text)
        except ValueError as error:
            return RequestOutput(request_id=request_id, prompt=text, prompt_token_ids=token_ids,
                                 outputs=CompletionOutput([], "", FINISH_ABORT,
                                                          [] if params.logprobs is not None else None),
                                 metrics=RequestMetrics(),
                                 finished=True, error=str(error))

    def _run_until_done(self, stops: _StopWatch | None = None) -> None:
        """Step until every request finished; a livelock or hang fails with RuntimeError naming the stuck requests
        (engine/watchdog.py). Real time passes, so waits on the other instance end at their deadlines."""
        watchdog = Watchdog(self._engines, self.max_idle_steps, owner="LLM", allow_connector_waits=True)
        while self.engine.has_unfinished():
            self._progress.update(len(self.engine.step()))
            for request_id in stops.check() if stops is not None else ():
                self.engine.abort(request_id, "stop string reached")
            watchdog.after_step()

    def _output(self, request: Request, emitted: int | None = None) -> RequestOutput:
        """`emitted`: the tokens up to the one that completed a stop string (the engine may have gone on)."""
        tokens = list(request.output_token_ids)[:emitted]
        logprobs = list(request.output_logprobs)[:emitted]
        if emitted is not None:   # ended by its stop string, whether the engine or this front end ended it
            request.finish_reason, request.error = "stop", None
        detokenizer = IncrementalDetokenizer(self.tokenizer, request.params.stop,
                                             request.params.include_stop_str_in_output, request.prompt_token_ids,
                                             request.params.min_tokens)
        text = detokenizer.push(tokens) + detokenizer.finish(request.finish_reason)
        # a stop string the engine's token-id match missed (other token boundaries) still ends the text: "stop"
        finish_reason = "stop" if detokenizer.stopped and request.finish_reason == "length" else request.finish_reason
        return RequestOutput(request_id=request.request_id, prompt=request.prompt,
                             prompt_token_ids=list(request.prompt_token_ids),
                             outputs=CompletionOutput(tokens, text, finish_reason,
                                                                      logprobs if request.params.logprobs is not None else None),
                             metrics=request.metrics, finished=True, error=request.error,
                             pd_timings=request.pd_timings, num_cached_tokens=request.num_cached_tokens)


class TextStream:
    """LLM.stream's result: iterating it runs the engine until its request is done and yields the request's text
    as it grows (the detokenizer the HTTP server streams with); `output` is the finished RequestOutput."""

    def __init__(self, llm: LLM, request: Request | RequestOutput, cancelled: Callable[[], bool]):
        self._llm, self._request, self._cancelled = llm, request, cancelled
        self.output: RequestOutput | None = request if isinstance(request, RequestOutput) else None

    def __iter__(self) -> Iterator[str]:
        if self.output is not None:   # refused at submission: nothing to run
            return
        llm, request, params = self._llm, self._request, self._request.params
        # as _StopWatch does for generate(): the text ends at a stop string whatever the token boundaries
        detokenizer = IncrementalDetokenizer(llm.tokenizer, params.stop, params.include_stop_str_in_output,
                                             request.prompt_token_ids, params.min_tokens)
        watchdog = Watchdog(llm._engines, llm.max_idle_steps, owner="LLM", allow_connector_waits=True)
        sent, seen, emitted, aborted = "", 0, None, False
        while llm.engine.has_unfinished():
            if not aborted and request.finish_reason is None and self._cancelled():
                aborted = llm.engine.abort(request.request_id, "cancelled")
            llm.engine.step()
            if emitted is None:
                new = list(request.output_token_ids)[seen:]
                piece, taken = detokenizer.push_until_stop(new)
                seen += len(new)
                if detokenizer.stopped:
                    emitted = seen - len(new) + taken
                    if not ends_with_a_stop_seq(request.output_token_ids[:emitted], request.stop_seqs):
                        llm.engine.abort(request.request_id, "stop string reached")
                if piece:
                    sent += piece
                    yield piece
            watchdog.after_step()
        self.output = llm._output(request, emitted)
        rest = self.output.outputs.text[len(sent):]   # what the detokenizer held back until the end
        if rest:
            yield rest


class _StopWatch:
    """Finds each request's stop strings in its text as the tokens come (the detokenizer the HTTP server uses,
    whatever the token boundaries), so that generate() ends the request at the token that completed one."""

    def __init__(self, tokenizer, requests: list[Request]):
        self._watched = {r.request_id: (r, IncrementalDetokenizer(tokenizer, r.params.stop, False,
                                                                  r.prompt_token_ids, r.params.min_tokens))
                         for r in requests if r.params.stop}
        self._seen: dict[str, int] = dict.fromkeys(self._watched, 0)
        self.emitted: dict[str, int] = {}   # request id -> its tokens up to the one that completed a stop string

    def check(self) -> list[str]:
        """The requests whose text reached a stop string since the last check that the engine will not end by
        itself."""
        stopped = []
        for request_id, (request, detokenizer) in list(self._watched.items()):
            new = list(request.output_token_ids)[self._seen[request_id]:]
            _, taken = detokenizer.push_until_stop(new)
            self._seen[request_id] += len(new)
            if detokenizer.stopped:
                emitted = self.emitted[request_id] = self._seen[request_id] - len(new) + taken
                del self._watched[request_id]
                if not ends_with_a_stop_seq(request.output_token_ids[:emitted], request.stop_seqs):
                    stopped.append(request_id)   # else the engine's id match ends it, as on the HTTP server
            elif request.finish_reason is not None:
                del self._watched[request_id]
        return stopped


def _prompt_list(prompts) -> list[Prompt]:
    """One prompt (a string or a list of token ids) or a list of prompts -> a list of prompts."""
    if isinstance(prompts, str) or _is_token_ids(prompts):
        return [prompts]
    if isinstance(prompts, (bytes, dict)) or not isinstance(prompts, Iterable):
        raise ValueError(f"LLM.generate: argument 'prompts' must be a string, a list of token ids or a list of "
                         f"those, got {type(prompts).__name__}")
    prompts = list(prompts)
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str) and not _is_token_ids(prompt):
            raise ValueError(f"LLM.generate: argument 'prompts[{i}]' must be a string or a non-empty list of "
                             f"token ids, got {type(prompt).__name__}")
    return prompts


def _is_token_ids(value) -> bool:
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, Iterable) or not len(value):
        return False
    return all(isinstance(t, Integral) and not isinstance(t, bool) for t in value)
