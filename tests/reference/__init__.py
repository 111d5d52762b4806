"""NumPy reference of the speculative-decoding state ops, written from spec/OPS.md (test-only).

Every reference function mutates the NumPy arrays it is given in place, exactly like the op mutates its tensors,
and performs the op's metadata validation first (OPS §2.3), raising `ValueError` that names the op and the
argument. The references are deliberately written as plain per-slot loops that follow the decision tables row by
row: they are the readable oracle, not a fast implementation.
"""

from .speculate_update import speculate_update
from .speculate_set_value_by_flags_and_idx import speculate_set_value_by_flags_and_idx
from .speculate_set_stop_value_multi_seqs import speculate_set_stop_value_multi_seqs
from .speculate_schedule_cache import speculate_schedule_cache
from .recover_decode_task import recover_decode_task
from .speculate_clear_accept_nums import speculate_clear_accept_nums
from .speculate_save_output import speculate_save_output
from .step_message import decode_step_message, MSG_ID, PREEMPTED_TOKEN_ID, RECOVERY_STOP, UNALLOCATED_BLOCK

__all__ = [
    "speculate_update",
    "speculate_set_value_by_flags_and_idx",
    "speculate_set_stop_value_multi_seqs",
    "speculate_schedule_cache",
    "recover_decode_task",
    "speculate_clear_accept_nums",
    "speculate_save_output",
    "decode_step_message",
    "MSG_ID",
    "PREEMPTED_TOKEN_ID",
    "RECOVERY_STOP",
    "UNALLOCATED_BLOCK",
]
