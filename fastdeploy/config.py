"""Configuration of one serving instance: every knob is a field of a slotted dataclass validated in __post_init__.

Nothing here imports paddle: the engine reads these classes too.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

ROLES = ("mixed", "prefill", "decode")   # FastDeploy's --splitwise-role values; mixed = prefill and decode here
# Op backends selectable with `ops.use_backend` (docs/design.md §1): the C++ CPU path, the Kunlun3 kernels on the
# host emulator, or the Kunlun3 kernels on a Kunlun device (XPU-place tensors; paddlepaddle-xpu).
OPS_BACKENDS = ("cpu", "xpu3-emulator", "xpu3")
RUNNERS = ("xpu", "gpu")
# How a PD pair moves prompt KV (docs/design.md §8): inside the ZeroMQ connector's messages, or one-sided into D's
# blocks through the Mooncake transfer engine over TCP or RDMA.
TRANSFER_PROTOCOLS = ("zmq", "mooncake-tcp", "mooncake-rdma")
DTYPES = ("float32", "float64")
MAX_SPECULATIVE_TOKENS = 8
DEFAULT_MTP_TOKENS = 1   # K when {"method": "mtp"} names none (FastDeploy's default)
# B's upper bound: speculate_update stages per-slot state in 512-entry shared arrays (OPS §5.1, §6.1); the same
# number is plugin.h's kSpeculateUpdateMaxSlots (tests/ops/test_op_signature_table.py checks they agree).
MAX_NUM_SEQS = 512


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


@dataclass(slots=True)
class SpeculativeConfig:
    """`method=None` is "no speculation" (K = 0: the same step path with T = 1 and no proposer)."""

    method: str | None = None
    num_speculative_tokens: int = 0
    # the directory of the MTP weights (FastDeploy's "model"); None: the main checkpoint's own, or the embedded
    # model's built-in MTP module
    model: str | None = None

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
    block_size: int = 16
    num_kv_blocks: int | None = None   # None: enough for every slot at max_model_len (set by FDConfig)
    transfer_protocol: str = "zmq"     # PD only: one of TRANSFER_PROTOCOLS (FastDeploy's cache_transfer_protocol)

    def __post_init__(self):
        _check_int("CacheConfig", "block_size", self.block_size, 1)
        _check_choice("CacheConfig", "transfer_protocol", self.transfer_protocol, TRANSFER_PROTOCOLS)
        if self.num_kv_blocks is not None:
            _check_int("CacheConfig", "num_kv_blocks", self.num_kv_blocks, 1)


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int = 8             # B, the number of slots
    max_model_len: int = 512          # prompt + generated tokens of one request; also M, the pre_ids width
    max_num_batched_tokens: int = 256  # per-step token budget; longer prompts are prefilled in chunks
    max_stop_seqs: int = 4            # S
    max_stop_seq_len: int = 16        # SL

    def __post_init__(self):
        for name, minimum in (("max_num_seqs", 1), ("max_model_len", 2), ("max_num_batched_tokens", 1),
                              ("max_stop_seqs", 1), ("max_stop_seq_len", 1)):
            _check_int("SchedulerConfig", name, getattr(self, name), minimum)
        if self.max_num_seqs > MAX_NUM_SEQS:
            raise ValueError(f"SchedulerConfig: field 'max_num_seqs' must be <= {MAX_NUM_SEQS} (OPS §5.1), "
                             f"got {self.max_num_seqs}")


@dataclass(slots=True)
class FDConfig:
    """One instance: model, role, runner and op backend, and the three sub-configs."""

    model: str = "fd-toy"
    dtype: str = "float32"
    role: str = "mixed"
    runner: str = "xpu"               # which device runner class; both run on the CPU in this slice
    ops_backend: str = "cpu"
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    # Reuse the KV of full prompt blocks already computed (docs/design.md §8, PD_MTP_FLOW §13); on by default, as
    # in vLLM v1. Not part of the PD compatibility hash: P and D may differ.
    enable_prefix_caching: bool = True

    def __post_init__(self):
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"FDConfig: field 'enable_prefix_caching' must be a bool, got "
                             f"{self.enable_prefix_caching!r}")
        _check_choice("FDConfig", "dtype", self.dtype, DTYPES)
        _check_choice("FDConfig", "role", self.role, ROLES)
        _check_choice("FDConfig", "runner", self.runner, RUNNERS)
        _check_choice("FDConfig", "ops_backend", self.ops_backend, OPS_BACKENDS)
        if self.cache.num_kv_blocks is None:
            self.cache.num_kv_blocks = self.scheduler.max_num_seqs * self.blocks_per_seq
        if self.role == "prefill" and self.speculative.method == "mtp" and self.num_speculative_tokens < 1:
            raise ValueError("FDConfig: field 'speculative' must have num_speculative_tokens >= 1 on a "
                             "prefill instance with MTP")

    @property
    def num_speculative_tokens(self) -> int:
        """K: drafts per decode round (0 without speculation)."""
        return self.speculative.num_speculative_tokens

    @property
    def kv_identity(self) -> bytes:
        """What besides the tokens makes a KV block (model, dtype, K, block size), hashed into every prefix-cache
        key (also with prefix caching off: a P computes the keys of the blocks its D reused, PD_MTP_FLOW §13.6)."""
        mtp = "" if self.speculative.model is None else f"|mtp={self.speculative.model}"   # layer N's KV
        return (f"{self.model}|{self.dtype}|k={self.num_speculative_tokens}{mtp}|"
                f"block_size={self.cache.block_size}").encode()

    @property
    def blocks_per_seq(self) -> int:
        """NB, the block-table width: covers max_model_len plus the largest lookahead any step asks for."""
        return -(-(self.scheduler.max_model_len + decode_lookahead(self.num_speculative_tokens))
                 // self.cache.block_size)
