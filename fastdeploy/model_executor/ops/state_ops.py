"""Python entry points of the speculative-decoding state ops over Paddle tensors (OPS.md §5), for every backend.

Tensors are passed positionally in OPS order (`[B]` and `[B, 1]` per-slot vectors are both accepted), then the
op's attributes (positionally or by keyword). Every op returns None except `speculate_save_output`, which returns
its message tensor. Invalid arguments raise ValueError whose message starts with the op name and names the
argument; other failures raise RuntimeError. The backend is the one `backend.use_backend` selected.
"""

import re

import numpy as np
import paddle

from fastdeploy.model_executor.ops import _loader, op_table
from fastdeploy.model_executor.ops.backend import current_backend, current_ncluster, use_backend

__all__ = [
    "current_backend",
    "fd_dispatch_floor",
    "fd_dispatch_floor_as",
    "recover_decode_task",
    "speculate_clear_accept_nums",
    "speculate_save_output",
    "speculate_schedule_cache",
    "speculate_set_stop_value_multi_seqs",
    "speculate_set_value_by_flags_and_idx",
    "speculate_update",
    "use_backend",
]

_OPS = _loader.python_module("_paddle_ops")   # the registered ops' kernels by name (ops/mtp/python_calls.cc)

# ---------------------------------------------------------------------------------------------------------------
# Argument checks done in Python (Paddle converts attributes before C++ sees them) and error translation

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _int_attr(op, name, value):
    """Slow path of the int attribute check: accepts Python and NumPy integers (not bool) in int32 range."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{op}: argument '{name}': expected an int (got {type(value).__name__})")
    value = int(value)
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise ValueError(f"{op}: argument '{name}': {value} is outside the int32 range")
    return value


def _bool_attr(op, name, value):
    """Slow path of the bool attribute check: accepts bool and numpy.bool_."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{op}: argument '{name}': expected a bool (got {type(value).__name__})")
    return bool(value)


# "[kl3-status N] <op>: argument '<arg>': <what>" -- the binding's text (docs/design.md §1), raised by the module as
# RuntimeError; Paddle's exception appends the source location on a following line.
_STATUS_RE = re.compile(r"\[kl3-status (\d+)\] ([^\n]*)")
_ERRORS = (RuntimeError, ValueError, TypeError)
_is_contiguous = paddle.Tensor.is_contiguous


def _reject_layout(op, names, tensors):
    """Raises ValueError for the first argument that is None, not a paddle.Tensor, or not contiguous.

    Checked here, before the call, because Paddle hands a custom op a contiguous *copy* of a strided input: an
    in-place result written into it would be lost silently."""
    for name, tensor in zip(names, tensors):
        if tensor is None:
            raise ValueError(f"{op}: argument '{name}': expected a tensor (got None)")
        if not isinstance(tensor, paddle.Tensor):
            raise ValueError(f"{op}: argument '{name}': expected a paddle.Tensor (got {type(tensor).__name__})")
        if not tensor.is_contiguous():
            raise ValueError(f"{op}: argument '{name}': expected a contiguous (row-major) tensor")


def _run(op, names, tensors, attrs=(), registered=None):
    """Calls the kernel of the registered op `registered` (default `op`) with the tensors, the attributes and the
    backend's ncluster; maps a failure to ValueError (status 1: bad argument) or RuntimeError, message starting at
    `op`."""
    try:
        contiguous = all(map(_is_contiguous, tensors))
    except TypeError:  # an argument that is not a Tensor
        contiguous = False
    if not contiguous:
        _reject_layout(op, names, tensors)
    try:
        return getattr(_OPS, registered or op)(*tensors, *attrs, current_ncluster())
    except _ERRORS as exc:
        match = _STATUS_RE.search(str(exc))
        if match is None:
            raise
        error = ValueError if match.group(1) == "1" else RuntimeError
        raise error(match.group(2).rstrip()) from None


# Tensor argument names in OPS order, from the one signature table (op_table.py).
_UPDATE_ARGS = op_table.arg_names("speculate_update")
_SET_VALUE_ARGS = op_table.arg_names("speculate_set_value_by_flags_and_idx")
_SET_STOP_ARGS = op_table.arg_names("speculate_set_stop_value_multi_seqs")
_SCHEDULE_ARGS = op_table.arg_names("speculate_schedule_cache")
_RECOVER_ARGS = op_table.arg_names("recover_decode_task")
_CLEAR_ARGS = op_table.arg_names("speculate_clear_accept_nums")
_SAVE_ARGS = op_table.arg_names("speculate_save_output")

# ---------------------------------------------------------------------------------------------------------------
# Ops (OPS.md §5.1-§5.7)


def speculate_update(seq_lens_encoder, seq_lens_decoder, not_need_stop, draft_tokens, actual_draft_token_nums,
                     accept_tokens, accept_num, stop_flags, seq_lens_this_time, is_block_step, mask_rollback):
    """OPS §5.1. In place: seq_lens_encoder, seq_lens_decoder, not_need_stop (host [1]), draft_tokens (column 0),
    actual_draft_token_nums, mask_rollback."""
    _run("speculate_update", _UPDATE_ARGS,
         (seq_lens_encoder, seq_lens_decoder, not_need_stop, draft_tokens, actual_draft_token_nums, accept_tokens,
          accept_num, stop_flags, seq_lens_this_time, is_block_step, mask_rollback))


def speculate_set_value_by_flags_and_idx(pre_ids_all, accept_tokens, accept_num, stop_flags, seq_lens_this_time,
                                         seq_lens_encoder, seq_lens_decoder, step_idx):
    """OPS §5.2. In place: pre_ids_all, accept_num, seq_lens_decoder."""
    _run("speculate_set_value_by_flags_and_idx", _SET_VALUE_ARGS,
         (pre_ids_all, accept_tokens, accept_num, stop_flags, seq_lens_this_time, seq_lens_encoder,
          seq_lens_decoder, step_idx))


def speculate_set_stop_value_multi_seqs(accept_tokens, accept_num, pre_ids, step_idx, stop_flags, seq_lens,
                                        stop_seqs, stop_seqs_len, end_ids, min_tokens):
    """OPS §5.3. In place: accept_tokens, accept_num, stop_flags."""
    _run("speculate_set_stop_value_multi_seqs", _SET_STOP_ARGS,
         (accept_tokens, accept_num, pre_ids, step_idx, stop_flags, seq_lens, stop_seqs, stop_seqs_len, end_ids,
          min_tokens))


def speculate_schedule_cache(draft_tokens, block_tables, stop_flags, prompt_lens, seq_lens_this_time,
                             seq_lens_encoder, seq_lens_decoder, step_seq_lens_decoder, step_draft_tokens,
                             step_seq_lens_this_time, accept_num, accept_tokens, is_block_step, not_need_stop,
                             block_size, max_draft_tokens, prefill_one_step_stop):
    """OPS §5.4. In place: every tensor except draft_tokens, block_tables and prompt_lens."""
    op = "speculate_schedule_cache"
    if type(block_size) is not int or not _INT32_MIN <= block_size <= _INT32_MAX:
        block_size = _int_attr(op, "block_size", block_size)
    if type(max_draft_tokens) is not int or not _INT32_MIN <= max_draft_tokens <= _INT32_MAX:
        max_draft_tokens = _int_attr(op, "max_draft_tokens", max_draft_tokens)
    if type(prefill_one_step_stop) is not bool:
        prefill_one_step_stop = _bool_attr(op, "prefill_one_step_stop", prefill_one_step_stop)
    _run(op, _SCHEDULE_ARGS,
         (draft_tokens, block_tables, stop_flags, prompt_lens, seq_lens_this_time, seq_lens_encoder,
          seq_lens_decoder, step_seq_lens_decoder, step_draft_tokens, step_seq_lens_this_time, accept_num,
          accept_tokens, is_block_step, not_need_stop),
         (block_size, max_draft_tokens, prefill_one_step_stop))


def recover_decode_task(stop_flags, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder, step_seq_lens_decoder,
                        block_tables, is_block_step, draft_tokens=None, step_draft_tokens=None,
                        step_seq_lens_this_time=None, block_size=None, max_draft_tokens=None):
    """OPS §5.5. Speculative when draft_tokens, step_draft_tokens and step_seq_lens_this_time are given (all
    three), non-speculative when all are None. In place: stop_flags, seq_lens_this_time, seq_lens_encoder,
    seq_lens_decoder, is_block_step, and draft_tokens in the speculative variant."""
    op = "recover_decode_task"
    if block_size is None or max_draft_tokens is None:
        missing = "block_size" if block_size is None else "max_draft_tokens"
        raise TypeError(f"{op}() missing required argument '{missing}'")
    if type(block_size) is not int or not _INT32_MIN <= block_size <= _INT32_MAX:
        block_size = _int_attr(op, "block_size", block_size)
    if type(max_draft_tokens) is not int or not _INT32_MIN <= max_draft_tokens <= _INT32_MAX:
        max_draft_tokens = _int_attr(op, "max_draft_tokens", max_draft_tokens)
    tensors = (stop_flags, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder, step_seq_lens_decoder,
               block_tables, is_block_step)
    if draft_tokens is not None and step_draft_tokens is not None and step_seq_lens_this_time is not None:
        # A separate registration declares draft_tokens as an in-place output (docs/design.md §1).
        _run(op, _RECOVER_ARGS, tensors + (draft_tokens, step_draft_tokens, step_seq_lens_this_time),
             (block_size, max_draft_tokens), registered="recover_spec_decode_task")
    elif draft_tokens is None and step_draft_tokens is None and step_seq_lens_this_time is None:
        _run(op, _RECOVER_ARGS, tensors, (block_size, max_draft_tokens))
    else:
        given = (draft_tokens is not None, step_draft_tokens is not None, step_seq_lens_this_time is not None)
        missing = _RECOVER_ARGS[7 + given.index(False)]
        raise ValueError(f"{op}: argument '{missing}': the speculative tensors draft_tokens, step_draft_tokens and "
                         "step_seq_lens_this_time must be given together")


def speculate_clear_accept_nums(accept_num, seq_lens_decoder):
    """OPS §5.6. In place: accept_num."""
    _run("speculate_clear_accept_nums", _CLEAR_ARGS, (accept_num, seq_lens_decoder))


def speculate_save_output(accept_tokens, accept_num, not_need_stop, seq_lens_decoder, prompt_lens, preempted_idx,
                          rank_id, save_each_rank, skip_prefill):
    """OPS §5.7. Returns the step message, a 1-D int64 CPU tensor `[2 + bsz + bsz * T]` (`[0]` when this rank
    sends nothing). In place: preempted_idx (host; cleared after reporting)."""
    op = "speculate_save_output"
    if type(rank_id) is not int or not _INT32_MIN <= rank_id <= _INT32_MAX:
        rank_id = _int_attr(op, "rank_id", rank_id)
    if type(save_each_rank) is not bool:
        save_each_rank = _bool_attr(op, "save_each_rank", save_each_rank)
    if type(skip_prefill) is not bool:
        skip_prefill = _bool_attr(op, "skip_prefill", skip_prefill)
    outputs = _run(op, _SAVE_ARGS, (accept_tokens, accept_num, not_need_stop, seq_lens_decoder, prompt_lens,
                                    preempted_idx), (rank_id, save_each_rank, skip_prefill))
    return outputs[0]


def fd_dispatch_floor(x):
    """A registered custom op that does nothing to its one int32 tensor, called through the same entry as the
    ops above: the dispatch floor of the latency benchmark."""
    _run("fd_dispatch_floor", ("x",), (x,))


_OP_ARGS = {
    "speculate_update": _UPDATE_ARGS,
    "speculate_set_value_by_flags_and_idx": _SET_VALUE_ARGS,
    "speculate_set_stop_value_multi_seqs": _SET_STOP_ARGS,
    "speculate_schedule_cache": _SCHEDULE_ARGS,
    "recover_decode_task": _RECOVER_ARGS,
    "speculate_clear_accept_nums": _CLEAR_ARGS,
    "speculate_save_output": _SAVE_ARGS,
}


def fd_dispatch_floor_as(op, *args):
    """Calls the do-nothing registration `fd_dispatch_floor_<op>`, which has op `op`'s tensors, in-place map and
    attributes, with `args` as `op` would take them (positionally), through the same entry as the ops: the
    same-signature dispatch floor of the latency benchmark. Attributes are passed on unchecked."""
    names = _OP_ARGS[op]
    tensors, attrs = args[:len(names)], args[len(names):]
    registered = op
    if op == "recover_decode_task":
        if tensors[7] is None:
            tensors = tensors[:7]
        else:
            registered = "recover_spec_decode_task"
    return _run(op, names, tensors, attrs, registered="fd_dispatch_floor_" + registered)
