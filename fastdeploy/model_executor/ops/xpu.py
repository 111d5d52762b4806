"""The import path FastDeploy's XPU model runners and op tests use: `fastdeploy.model_executor.ops.xpu`.

It exposes the seven speculative-decoding state ops under FastDeploy's names with the OPS.md §5 signatures (the
entry points of `state_ops`, so every backend and check applies), so code written against FastDeploy imports them
unchanged: `from fastdeploy.model_executor.ops.xpu import speculate_update`. Tensors live on the host or on a Kunlun
XPU (docs/design.md §1, "Placement and XPU tensors"); new code in this project imports `state_ops` directly.
"""

from fastdeploy.model_executor.ops.state_ops import (
    recover_decode_task,
    speculate_clear_accept_nums,
    speculate_save_output,
    speculate_schedule_cache,
    speculate_set_stop_value_multi_seqs,
    speculate_set_value_by_flags_and_idx,
    speculate_update,
)

__all__ = [
    "recover_decode_task",
    "speculate_clear_accept_nums",
    "speculate_save_output",
    "speculate_schedule_cache",
    "speculate_set_stop_value_multi_seqs",
    "speculate_set_value_by_flags_and_idx",
    "speculate_update",
]
