"""The one table of the state ops' signatures (OPS.md §5, docs/design.md §1): per op, its tensor arguments in OPS order
(dtype, shape form, placement, access) plus its attributes.

The Python entry (`ops.state_ops`) takes its argument names from here; the other five faces -- `plugin.h`, the op layer's
argument specs (`mtp_calls.cc`), the Paddle registrations and their in-place maps (`op_signatures.h`) and the
pybind module -- are checked against it at build time by `custom_ops/xpu_ops/tools/check_op_signatures.py`
(setup.py runs it before compiling; a test runs it too), so adding a backend cannot make them drift.
Framework-free: setup.py loads this file by path.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Arg:
    name: str
    dtype: str          # "bool" | "int32" | "int64"
    form: str           # "vector" ([N] / [N, 1]) | "flag" (one element) | "matrix" | "tensor3"
    host: bool = False  # OPS §2.2: a host tensor on every backend
    written: bool = False  # modified in place (declared in the in-place map, OPS §2.5)
    optional: bool = False


@dataclass(frozen=True, slots=True)
class OpSignature:
    name: str
    args: tuple[Arg, ...]
    attrs: tuple[tuple[str, str], ...] = ()  # (name, "int" | "bool"), before the trailing ncluster
    returns_msg: bool = False               # speculate_save_output's message output (OPS §5.7)

    @property
    def arg_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args)


def _a(name, dtype, form, *flags):
    return Arg(name, dtype, form, host="host" in flags, written="w" in flags, optional="opt" in flags)


OPS = (
    OpSignature("speculate_update", (
        _a("seq_lens_encoder", "int32", "vector", "w"), _a("seq_lens_decoder", "int32", "vector", "w"),
        _a("not_need_stop", "bool", "flag", "host", "w"), _a("draft_tokens", "int64", "matrix", "w"),
        _a("actual_draft_token_nums", "int32", "vector", "w"), _a("accept_tokens", "int64", "matrix"),
        _a("accept_num", "int32", "vector"), _a("stop_flags", "bool", "vector"),
        _a("seq_lens_this_time", "int32", "vector"), _a("is_block_step", "bool", "vector"),
        _a("mask_rollback", "int32", "vector", "w"))),
    OpSignature("speculate_set_value_by_flags_and_idx", (
        _a("pre_ids_all", "int64", "matrix", "w"), _a("accept_tokens", "int64", "matrix"),
        _a("accept_num", "int32", "vector", "w"), _a("stop_flags", "bool", "vector"),
        _a("seq_lens_this_time", "int32", "vector"), _a("seq_lens_encoder", "int32", "vector"),
        _a("seq_lens_decoder", "int32", "vector", "w"), _a("step_idx", "int64", "vector"))),
    OpSignature("speculate_set_stop_value_multi_seqs", (
        _a("accept_tokens", "int64", "matrix", "w"), _a("accept_num", "int32", "vector", "w"),
        _a("pre_ids", "int64", "matrix"), _a("step_idx", "int64", "vector"), _a("stop_flags", "bool", "vector", "w"),
        _a("seq_lens", "int32", "vector"), _a("stop_seqs", "int64", "tensor3"), _a("stop_seqs_len", "int32", "matrix"),
        _a("end_ids", "int64", "vector"), _a("min_tokens", "int64", "vector"))),
    OpSignature("speculate_schedule_cache", (
        _a("draft_tokens", "int64", "matrix"), _a("block_tables", "int32", "matrix"),
        _a("stop_flags", "bool", "vector", "w"), _a("prompt_lens", "int64", "vector"),
        _a("seq_lens_this_time", "int32", "vector", "w"), _a("seq_lens_encoder", "int32", "vector", "w"),
        _a("seq_lens_decoder", "int32", "vector", "w"), _a("step_seq_lens_decoder", "int32", "vector", "w"),
        _a("step_draft_tokens", "int64", "matrix", "w"), _a("step_seq_lens_this_time", "int32", "vector", "w"),
        _a("accept_num", "int32", "vector", "w"), _a("accept_tokens", "int64", "matrix", "w"),
        _a("is_block_step", "bool", "vector", "w"), _a("not_need_stop", "bool", "flag", "host", "w")),
        attrs=(("block_size", "int"), ("max_draft_tokens", "int"), ("prefill_one_step_stop", "bool"))),
    OpSignature("recover_decode_task", (
        _a("stop_flags", "bool", "vector", "w"), _a("seq_lens_this_time", "int32", "vector", "w"),
        _a("seq_lens_encoder", "int32", "vector", "w"), _a("seq_lens_decoder", "int32", "vector", "w"),
        _a("step_seq_lens_decoder", "int32", "vector"), _a("block_tables", "int32", "matrix"),
        _a("is_block_step", "bool", "vector", "w"), _a("draft_tokens", "int64", "matrix", "w", "opt"),
        _a("step_draft_tokens", "int64", "matrix", "opt"), _a("step_seq_lens_this_time", "int32", "vector", "opt")),
        attrs=(("block_size", "int"), ("max_draft_tokens", "int"))),
    OpSignature("speculate_clear_accept_nums", (
        _a("accept_num", "int32", "vector", "w"), _a("seq_lens_decoder", "int32", "vector"))),
    OpSignature("speculate_save_output", (
        _a("accept_tokens", "int64", "matrix"), _a("accept_num", "int32", "vector"),
        _a("not_need_stop", "bool", "flag", "host"), _a("seq_lens_decoder", "int32", "vector"),
        _a("prompt_lens", "int64", "vector"), _a("preempted_idx", "int32", "vector", "host", "w")),
        attrs=(("rank_id", "int"), ("save_each_rank", "bool"), ("skip_prefill", "bool")), returns_msg=True),
)

BY_NAME = {op.name: op for op in OPS}


def arg_names(op: str) -> tuple[str, ...]:
    """Tensor argument names of `op` in OPS order."""
    return BY_NAME[op].arg_names


def registrations(op: OpSignature) -> dict[str, tuple[Arg, ...]]:
    """Paddle op name -> its tensor inputs. recover_decode_task has two registrations so that each declares its
    complete in-place map (docs/design.md §1): without and with the optional speculative tensors."""
    if op.name == "recover_decode_task":
        return {"recover_decode_task": tuple(a for a in op.args if not a.optional),
                "recover_spec_decode_task": op.args}
    return {op.name: op.args}
