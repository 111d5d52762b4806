"""Configuration of one serving instance: every knob is a field of a slotted dataclass validated in __post_init__.

Nothing here imports paddle: the engine reads these classes too.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields

ROLES = ("mixed", "prefill", "decode")   # FastDeploy's --splitwise-role values; mixed = prefill and decode here
# Op backends selectable with `ops.use_backend` (docs/design.md §1): the C++ CPU path, the Kunlun3 kernels on the
# host emulator, or the Kunlun3 kernels on a Kunlun device (XPU-place tensors; paddlepaddle-xpu).
OPS_BACKENDS = ("cpu", "xpu3-emulator", "xpu3")
RUNNERS = ("xpu", "gpu")
# How a PD pair moves prompt KV (docs/design.md §8): inside the ZeroMQ connector's messages, or one-sided into D's
# blocks through the Mooncake transfer engine over TCP or RDMA.
TRANSFER_PROTOCOLS = ("zmq", "mooncake-tcp", "mooncake-rdma")
from fastdeploy.precision import (DTYPE_CHOICES, KV_CACHE_DTYPE_CHOICES, parse_quantization,  # noqa: E402
                                  resolve_dtype, resolve_kv_cache_dtype)   # (no Paddle)
MAX_SPECULATIVE_TOKENS = 8
DEFAULT_MTP_TOKENS = 1   # K when {"method": "mtp"} names none (FastDeploy's default)
# B's upper bound: speculate_update stages per-slot state in 512-entry shared arrays (OPS §5.1, §6.1); the same
# number is plugin.h's kSpeculateUpdateMaxSlots (tests/ops/test_op_signature_table.py checks they agree).
MAX_NUM_SEQS = 512
EMBEDDED_MODELS = ("fd-toy", "fd-tiny")
DEFAULT_MAX_MODEL_LEN = 512   # the embedded models' (a checkpoint's is its max_position_embeddings)
from fastdeploy.kv_budget import KVBudget, gib, resolve_budget  # noqa: E402  (no Paddle)


# The KV lookahead of a slot, in positions past what it has computed (docs/design.md §5, "Lookahead"). For a slot
# with d = seq_lens_decoder and K drafts per round, speculate_schedule_cache parks the slot unless the block of
# position d + 2K + 1 exists (OPS §5.4 row Park), and a round feeds K + 1 inputs and can advance d by K + 1.

def resume_lookahead(k: int) -> int:
    """Positions d .. d + 2K + 1: what a parked slot needs to resume (recover_decode_task, OPS §5.5)."""
    return 2 * k + 2


def first_round_lookahead(k: int) -> int:
    """Positions past a prompt of L tokens its final chunk (or D's reservation) covers: L .. L + 2K + 2, the first
    round's inputs and the Park check after it, with d = L + 1 once t0 is known (PD_MTP_FLOW §5.1)."""
    return resume_lookahead(k) + 1


def decode_lookahead(k: int) -> int:
    """Positions d .. d + 3K + 3 a decoding slot is topped up to before each round: the round's K + 1 inputs and
    the Park check after the round (d + K + 1 + 2K + 2). Also the block-table width's margin past max_model_len."""
    return resume_lookahead(k) + k + 2


def _check_int(owner: str, name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}: field '{name}' must be an int >= {minimum}, got {value!r}")


def _check_choice(owner: str, name: str, value, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{owner}: field '{name}' must be one of {choices}, got {value!r}")


def estimated_weight_bytes(ckpt, dtype: str) -> int:
    """What a checkpoint's weights take loaded in `dtype`, before loading (for --gpu-memory-utilization): every
    tensor's elements at the dtype's size (an upper bound under weight-only quantization)."""
    params = sum(math.prod(info.shape) for info in ckpt.tensors.values())
    return params * (8 if dtype == "float64" else 4 if dtype == "float32" else 2)


@dataclass(slots=True)
class SpeculativeConfig:
    """`method=None` is "no speculation" (K = 0: the same step path with T = 1 and no proposer)."""

    method: str | None = None
    num_speculative_tokens: int = 0
    # the directory of the MTP weights (FastDeploy's "model"); None: the main checkpoint's own, or the embedded
    # model's built-in MTP module
    model: str | None = None
    # the MTP module's weight-only quantization (FastDeploy's key; fastdeploy/precision.py): None is the target's
    quantization: str | dict | None = None

    def __post_init__(self):
        _check_choice("SpeculativeConfig", "method", self.method, (None, "mtp"))
        low = 1 if self.method == "mtp" else 0
        _check_int("SpeculativeConfig", "num_speculative_tokens", self.num_speculative_tokens, low)
        if self.method is None and self.num_speculative_tokens != 0:
            raise ValueError("SpeculativeConfig: field 'num_speculative_tokens' must be 0 without a method, "
                             f"got {self.num_speculative_tokens}")
        if self.model is not None and (self.method != "mtp" or not isinstance(self.model, str) or not self.model):
            raise ValueError(f"SpeculativeConfig: field 'model' must be a directory path with method 'mtp', got "
                             f"{self.model!r} with method {self.method!r}")
        if self.num_speculative_tokens > MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"SpeculativeConfig: field 'num_speculative_tokens' must be <= "
                             f"{MAX_SPECULATIVE_TOKENS}, got {self.num_speculative_tokens}")
        if self.quantization is not None:
            try:
                parse_quantization(self.quantization)
            except ValueError as e:
                raise ValueError(f"SpeculativeConfig: {e}") from None

    @classmethod
    def from_user(cls, value: SpeculativeConfig | dict | None) -> SpeculativeConfig:
        """The LLM API's `speculative_config` argument (and `--speculative-config`): None, a dict of fields, or an
        instance. `{"method": "mtp"}` alone means K = DEFAULT_MTP_TOKENS."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"SpeculativeConfig: expected None, a dict or a SpeculativeConfig, got {value!r}")
        unknown = set(value) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"SpeculativeConfig: unknown field(s) {sorted(unknown)}")
        if value.get("method") == "mtp" and "num_speculative_tokens" not in value:
            value = {**value, "num_speculative_tokens": DEFAULT_MTP_TOKENS}
        return cls(**value)


@dataclass(slots=True)
class CacheConfig:
    """The KV pool. Its size, first that applies (docs/design.md §3 "KV budget"): `num_kv_blocks`
    (--num-kv-blocks / --num-gpu-blocks-override); a checkpoint's byte budget, `kv_cache_memory_bytes`
    (--kv-cache-memory-bytes), else `gpu_memory_utilization` of the host's memory less the weights, else
    kv_budget.DEFAULT_KV_CACHE_BYTES, holding at most every slot at max_model_len; an embedded model's every slot
    at max_model_len (a few MiB). FDConfig sets num_kv_blocks and `budget_source`, what the start line names."""

    block_size: int = 16
    num_kv_blocks: int | None = None
    transfer_protocol: str = "zmq"     # PD only: one of TRANSFER_PROTOCOLS (FastDeploy's cache_transfer_protocol)
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None   # FastDeploy's: (0, 1] of the host's memory, weights and KV
    # vLLM's --kv-cache-dtype: auto (the model's dtype; fastdeploy/precision.py), bfloat16 or float32
    kv_cache_dtype: str = "auto"
    budget_source: str = field(default="", init=False, compare=False)

    def __post_init__(self):
        _check_int("CacheConfig", "block_size", self.block_size, 1)
        _check_choice("CacheConfig", "transfer_protocol", self.transfer_protocol, TRANSFER_PROTOCOLS)
        _check_choice("CacheConfig", "kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPE_CHOICES)
        if self.num_kv_blocks is not None:
            _check_int("CacheConfig", "num_kv_blocks", self.num_kv_blocks, 1)
        if self.kv_cache_memory_bytes is not None:
            _check_int("CacheConfig", "kv_cache_memory_bytes", self.kv_cache_memory_bytes, 1)
        share = self.gpu_memory_utilization
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1):
            raise ValueError(f"CacheConfig: field 'gpu_memory_utilization' must be a number in (0, 1], got {share!r}")


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int = 8             # B, the number of slots
    # prompt + generated tokens of one request; also M, the pre_ids width. None: the model's (set by FDConfig)
    max_model_len: int | None = None
    max_num_batched_tokens: int = 256  # per-step token budget; longer prompts are prefilled in chunks
    max_stop_seqs: int = 4            # S
    max_stop_seq_len: int = 16        # SL
    # plan step N + 1 and apply step N's outputs while step N + 1 computes (docs/design.md §10; vLLM's
    # --async-scheduling); the outputs are the same either way
    async_scheduling: bool = False

    def __post_init__(self):
        if not isinstance(self.async_scheduling, bool):
            raise ValueError(f"SchedulerConfig: field 'async_scheduling' must be a bool, got "
                             f"{self.async_scheduling!r}")
        for name, minimum in (("max_num_seqs", 1), ("max_model_len", 2), ("max_num_batched_tokens", 1),
                              ("max_stop_seqs", 1), ("max_stop_seq_len", 1)):
            if name != "max_model_len" or self.max_model_len is not None:
                _check_int("SchedulerConfig", name, getattr(self, name), minimum)
        if self.max_num_seqs > MAX_NUM_SEQS:
            raise ValueError(f"SchedulerConfig: field 'max_num_seqs' must be <= {MAX_NUM_SEQS} (OPS §5.1), "
                             f"got {self.max_num_seqs}")


@dataclass(slots=True)
class FDConfig:
    """One instance: model, role, runner and op backend, and the three sub-configs."""

    model: str = "fd-toy"              # an embedded model's name or a checkpoint directory
    # the precision (fastdeploy/precision.py): how the weights are stored; "auto" is resolved in __post_init__
    dtype: str = "float32"
    quantization: str | dict | None = None
    role: str = "mixed"
    runner: str = "xpu"               # which device runner class; both run on the CPU in this slice
    ops_backend: str = "cpu"
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    # Reuse the KV of full prompt blocks already computed (docs/design.md §8, PD_MTP_FLOW §13); on by default, as
    # in vLLM v1. Not part of the PD compatibility hash: P and D may differ.
    enable_prefix_caching: bool = True
    # Report `usage.prompt_tokens_details.cached_tokens` (the prefix-cache hit of each request). False reports 0:
    # a client then cannot confirm another client's prompt prefix from it (docs/design.md §8, "Cache isolation")
    report_cached_tokens: bool = True
    # whether dtype was "auto" (the start line says what it became)
    dtype_was_auto: bool = field(default=False, init=False, repr=False, compare=False)
    # what names the model in kv_identity (set in __post_init__: the name, or a checkpoint's path and digest)
    model_identity: str = field(default="", init=False, repr=False, compare=False)
    # the same for speculative.model, MTP weights in their own directory ("" when they are the model's own)
    mtp_identity: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self):
        for name in ("enable_prefix_caching", "report_cached_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"FDConfig: field '{name}' must be a bool, got {getattr(self, name)!r}")
        _check_choice("FDConfig", "dtype", self.dtype, DTYPE_CHOICES)
        self.dtype_was_auto = self.dtype == "auto"
        self.dtype = resolve_dtype(self.dtype, embedded=self.model in EMBEDDED_MODELS)
        try:
            parse_quantization(self.quantization)
        except ValueError as e:
            raise ValueError(f"FDConfig: {e}") from None
        _check_choice("FDConfig", "role", self.role, ROLES)
        _check_choice("FDConfig", "runner", self.runner, RUNNERS)
        _check_choice("FDConfig", "ops_backend", self.ops_backend, OPS_BACKENDS)
        self.model_identity = self.model
        if self.speculative.model is not None:
            from fastdeploy.model_executor.models.checkpoint import read_checkpoint_config   # no Paddle
            if self.model in EMBEDDED_MODELS:
                raise ValueError(f"FDConfig: field 'speculative.model' ({self.speculative.model!r}) is for checkpoint "
                                 f"directories; {self.model} has its MTP module built in")
            self.mtp_identity = f"checkpoint:{read_checkpoint_config(self.speculative.model).identity}"
        if self.model in EMBEDDED_MODELS:
            if self.scheduler.max_model_len is None:
                self.scheduler.max_model_len = DEFAULT_MAX_MODEL_LEN
            if self.cache.num_kv_blocks is None:
                self.cache.num_kv_blocks = self.scheduler.max_num_seqs * self.blocks_per_seq
                self.cache.budget_source = "every slot at max_model_len (an embedded model)"
            else:
                self.cache.budget_source = f"--num-kv-blocks {self.cache.num_kv_blocks}"
        else:
            self._size_for_checkpoint()
        if self.role == "prefill" and self.speculative.method == "mtp" and self.num_speculative_tokens < 1:
            raise ValueError("FDConfig: field 'speculative' must have num_speculative_tokens >= 1 on a "
                             "prefill instance with MTP")

    def _size_for_checkpoint(self) -> None:
        """max_model_len and the KV blocks of a checkpoint directory (docs/design.md §3 "KV budget"): the blocks
        the budget holds, at most every slot at max_model_len; max_model_len None is the config's
        max_position_embeddings, lowered to what one request can hold in that budget; above the config's it is
        refused, as is a budget that cannot hold one request at max_model_len."""
        from fastdeploy.model_executor.models.checkpoint import read_checkpoint_config   # no Paddle
        if not os.path.isdir(self.model):
            raise ValueError(f"FDConfig: field 'model' must be one of {EMBEDDED_MODELS} or a checkpoint "
                             f"directory, got {self.model!r}")
        ckpt = read_checkpoint_config(self.model)
        self.model_identity = f"checkpoint:{ckpt.identity}"
        limit, sched, cache = ckpt.max_position_embeddings, self.scheduler, self.cache
        if sched.max_model_len is not None and sched.max_model_len > limit:
            raise ValueError(f"FDConfig: field 'max_model_len' ({sched.max_model_len}) is above the checkpoint's "
                             f"max_position_embeddings ({limit}, {ckpt.path / 'config.json'})")
        mtp_layer = self.num_speculative_tokens > 0 and (ckpt.has_mtp_weights or self.speculative.model is not None)
        block_bytes = cache.block_size * ckpt.kv_bytes_per_token(self.kv_dtype, mtp_layer)
        if cache.num_kv_blocks is not None:
            budget = KVBudget(cache.num_kv_blocks * block_bytes, f"--num-kv-blocks {cache.num_kv_blocks}")
        else:
            budget = resolve_budget(cache.kv_cache_memory_bytes, cache.gpu_memory_utilization,
                                    estimated_weight_bytes(ckpt, self.dtype))
        blocks = budget.bytes // block_bytes
        if sched.max_model_len is None:
            fits = blocks * cache.block_size - decode_lookahead(self.num_speculative_tokens)
            sched.max_model_len = min(limit, fits)
            if sched.max_model_len < 2:
                sched.max_model_len = limit   # the check below reports the budget
        if blocks < self.blocks_per_seq:
            fix = (f"--num-kv-blocks {self.blocks_per_seq}" if cache.num_kv_blocks is not None
                   else f"--kv-cache-memory-bytes {block_bytes * self.blocks_per_seq}")
            raise ValueError(f"FDConfig: the KV cache does not fit: one request at max_model_len "
                             f"{sched.max_model_len} needs {self.blocks_per_seq} blocks of {cache.block_size} tokens "
                             f"({block_bytes * self.blocks_per_seq / 2 ** 20:.1f} MiB), {budget.source} holds "
                             f"{blocks}; lower --max-model-len or give {fix} or more")
        if cache.num_kv_blocks is None:
            cache.num_kv_blocks = min(sched.max_num_seqs * self.blocks_per_seq, blocks)
            capped = " (every slot at max_model_len)" if cache.num_kv_blocks < blocks else ""
            cache.budget_source = f"{budget.source}, {gib(cache.num_kv_blocks * block_bytes)} used{capped}"
        else:
            cache.budget_source = budget.source

    @property
    def num_speculative_tokens(self) -> int:
        """K: drafts per decode round (0 without speculation)."""
        return self.speculative.num_speculative_tokens

    @property
    def kv_dtype(self) -> str:
        """The KV cache's storage dtype (fastdeploy/precision.py `resolve_kv_cache_dtype`): `--kv-cache-dtype`, whose
        auto is the model's dtype (bfloat16 also under weight-only quantization; float64 for a float64 model)."""
        return resolve_kv_cache_dtype(self.cache.kv_cache_dtype, self.dtype, self.quantization)

    @property
    def precision_identity(self) -> str:
        """The weights' precision as it keys KV: dtype, quantization, and the MTP module's own quantization."""
        mtp = self.speculative.quantization
        return (f"{self.dtype}|q={parse_quantization(self.quantization).name}"
                f"{'' if mtp is None else '|mtp_q=' + parse_quantization(mtp).name}")

    @property
    def kv_identity(self) -> bytes:
        """What besides the tokens makes a KV block (model, precision, KV dtype, K, block size), hashed into
        every prefix-cache key (also with prefix caching off: a P computes the keys of the blocks its D reused,
        PD_MTP_FLOW §13.6). A checkpoint is named by a digest of its contents (checkpoint.py `_content_digest`),
        not its path: a P and a D reading copies of one checkpoint at different paths agree, a rewritten
        checkpoint does not. MTP weights in their own directory (`speculative.model`, layer N's KV) are named by
        their digest too."""
        mtp = f"|mtp={self.mtp_identity}" if self.mtp_identity else ""
        return (f"{self.model_identity}|{self.precision_identity}|kv={self.kv_dtype}|"
                f"k={self.num_speculative_tokens}{mtp}|"
                f"block_size={self.cache.block_size}").encode()

    @property
    def blocks_per_seq(self) -> int:
        """NB, the block-table width: covers max_model_len plus the largest lookahead any step asks for."""
        return -(-(self.scheduler.max_model_len + decode_lookahead(self.num_speculative_tokens))
                 // self.cache.block_size)
