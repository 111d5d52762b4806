// Paddle ops of the latency benchmark's dispatch floors; every kernel here does nothing.
//
// fd_dispatch_floor: one int32 tensor in place plus the trailing `ncluster` attribute -- the cost of calling any
// custom op the way the state ops are called.
// fd_dispatch_floor_<op>: the same inputs, outputs, in-place map and attributes as the registered op <op> -- the
// cost Paddle's dispatch alone charges for that op's signature, so that op / floor measures the project's own
// layers (Python entry, op layer checks, plugin).
#include <vector>

#include "paddle/extension.h"

namespace {

using T = paddle::Tensor;

void FdDispatchFloor(T&, int) {}

void FloorUpdate(T&, T&, T&, T&, T&, const T&, const T&, const T&, const T&, const T&, T&, int) {}

void FloorSetValue(T&, const T&, T&, const T&, const T&, const T&, T&, const T&, int) {}

void FloorSetStop(T&, T&, const T&, const T&, T&, const T&, const T&, const T&, const T&, const T&, int) {}

void FloorSchedule(const T&, const T&, T&, const T&, T&, T&, T&, T&, T&, T&, T&, T&, T&, T&, int, int, bool, int) {}

void FloorRecover(T&, T&, T&, T&, const T&, const T&, T&, int, int, int) {}

void FloorRecoverSpec(T&, T&, T&, T&, const T&, const T&, T&, T&, const T&, const T&, int, int, int) {}

void FloorClear(T&, const T&, int) {}

// The real op returns a new message tensor; an empty one keeps the output without the op's allocation.
std::vector<T> FloorSave(const T&, const T&, const T&, const T&, const T&, T&, int, bool, bool, int) {
  return {paddle::empty({0}, paddle::DataType::INT64, paddle::CPUPlace())};
}

}  // namespace

PD_BUILD_OP(fd_dispatch_floor)
    .Inputs({"x"})
    .Outputs({"x_out"})
    .Attrs({"ncluster: int"})
    .SetInplaceMap({{"x", "x_out"}})
    .SetKernelFn(PD_KERNEL(FdDispatchFloor));

PD_BUILD_OP(fd_dispatch_floor_speculate_update)
    .Inputs({"seq_lens_encoder", "seq_lens_decoder", "not_need_stop", "draft_tokens", "actual_draft_token_nums",
             "accept_tokens", "accept_num", "stop_flags", "seq_lens_this_time", "is_block_step", "mask_rollback"})
    .Outputs({"seq_lens_encoder_out", "seq_lens_decoder_out", "not_need_stop_out", "draft_tokens_out",
              "actual_draft_token_nums_out", "mask_rollback_out"})
    .Attrs({"ncluster: int"})
    .SetInplaceMap({{"seq_lens_encoder", "seq_lens_encoder_out"},
                    {"seq_lens_decoder", "seq_lens_decoder_out"},
                    {"not_need_stop", "not_need_stop_out"},
                    {"draft_tokens", "draft_tokens_out"},
                    {"actual_draft_token_nums", "actual_draft_token_nums_out"},
                    {"mask_rollback", "mask_rollback_out"}})
    .SetKernelFn(PD_KERNEL(FloorUpdate));

PD_BUILD_OP(fd_dispatch_floor_speculate_set_value_by_flags_and_idx)
    .Inputs({"pre_ids_all", "accept_tokens", "accept_num", "stop_flags", "seq_lens_this_time", "seq_lens_encoder",
             "seq_lens_decoder", "step_idx"})
    .Outputs({"pre_ids_all_out", "accept_num_out", "seq_lens_decoder_out"})
    .Attrs({"ncluster: int"})
    .SetInplaceMap({{"pre_ids_all", "pre_ids_all_out"},
                    {"accept_num", "accept_num_out"},
                    {"seq_lens_decoder", "seq_lens_decoder_out"}})
    .SetKernelFn(PD_KERNEL(FloorSetValue));

PD_BUILD_OP(fd_dispatch_floor_speculate_set_stop_value_multi_seqs)
    .Inputs({"accept_tokens", "accept_num", "pre_ids", "step_idx", "stop_flags", "seq_lens", "stop_seqs",
             "stop_seqs_len", "end_ids", "min_tokens"})
    .Outputs({"accept_tokens_out", "accept_num_out", "stop_flags_out"})
    .Attrs({"ncluster: int"})
    .SetInplaceMap({{"accept_tokens", "accept_tokens_out"},
                    {"accept_num", "accept_num_out"},
                    {"stop_flags", "stop_flags_out"}})
    .SetKernelFn(PD_KERNEL(FloorSetStop));

PD_BUILD_OP(fd_dispatch_floor_speculate_schedule_cache)
    .Inputs({"draft_tokens", "block_tables", "stop_flags", "prompt_lens", "seq_lens_this_time", "seq_lens_encoder",
             "seq_lens_decoder", "step_seq_lens_decoder", "step_draft_tokens", "step_seq_lens_this_time",
             "accept_num", "accept_tokens", "is_block_step", "not_need_stop"})
    .Outputs({"stop_flags_out", "seq_lens_this_time_out", "seq_lens_encoder_out", "seq_lens_decoder_out",
              "step_seq_lens_decoder_out", "step_draft_tokens_out", "step_seq_lens_this_time_out", "accept_num_out",
              "accept_tokens_out", "is_block_step_out", "not_need_stop_out"})
    .Attrs({"block_size: int", "max_draft_tokens: int", "prefill_one_step_stop: bool", "ncluster: int"})
    .SetInplaceMap({{"stop_flags", "stop_flags_out"},
                    {"seq_lens_this_time", "seq_lens_this_time_out"},
                    {"seq_lens_encoder", "seq_lens_encoder_out"},
                    {"seq_lens_decoder", "seq_lens_decoder_out"},
                    {"step_seq_lens_decoder", "step_seq_lens_decoder_out"},
                    {"step_draft_tokens", "step_draft_tokens_out"},
                    {"step_seq_lens_this_time", "step_seq_lens_this_time_out"},
                    {"accept_num", "accept_num_out"},
                    {"accept_tokens", "accept_tokens_out"},
                    {"is_block_step", "is_block_step_out"},
                    {"not_need_stop", "not_need_stop_out"}})
    .SetKernelFn(PD_KERNEL(FloorSchedule));

PD_BUILD_OP(fd_dispatch_floor_recover_decode_task)
    .Inputs({"stop_flags", "seq_lens_this_time", "seq_lens_encoder", "seq_lens_decoder", "step_seq_lens_decoder",
             "block_tables", "is_block_step"})
    .Outputs({"stop_flags_out", "seq_lens_this_time_out", "seq_lens_encoder_out", "seq_lens_decoder_out",
              "is_block_step_out"})
    .Attrs({"block_size: int", "max_draft_tokens: int", "ncluster: int"})
    .SetInplaceMap({{"stop_flags", "stop_flags_out"},
                    {"seq_lens_this_time", "seq_lens_this_time_out"},
                    {"seq_lens_encoder", "seq_lens_encoder_out"},
                    {"seq_lens_decoder", "seq_lens_decoder_out"},
                    {"is_block_step", "is_block_step_out"}})
    .SetKernelFn(PD_KERNEL(FloorRecover));

PD_BUILD_OP(fd_dispatch_floor_recover_spec_decode_task)
    .Inputs({"stop_flags", "seq_lens_this_time", "seq_lens_encoder", "seq_lens_decoder", "step_seq_lens_decoder",
             "block_tables", "is_block_step", "draft_tokens", "step_draft_tokens", "step_seq_lens_this_time"})
    .Outputs({"stop_flags_out", "seq_lens_this_time_out", "seq_lens_encoder_out", "seq_lens_decoder_out",
              "is_block_step_out", "draft_tokens_out"})
    .Attrs({"block_size: int", "max_draft_tokens: int", "ncluster: int"})
    .SetInplaceMap({{"stop_flags", "stop_flags_out"},
                    {"seq_lens_this_time", "seq_lens_this_time_out"},
                    {"seq_lens_encoder", "seq_lens_encoder_out"},
                    {"seq_lens_decoder", "seq_lens_decoder_out"},
                    {"is_block_step", "is_block_step_out"},
                    {"draft_tokens", "draft_tokens_out"}})
    .SetKernelFn(PD_KERNEL(FloorRecoverSpec));

PD_BUILD_OP(fd_dispatch_floor_speculate_clear_accept_nums)
    .Inputs({"accept_num", "seq_lens_decoder"})
    .Outputs({"accept_num_out"})
    .Attrs({"ncluster: int"})
    .SetInplaceMap({{"accept_num", "accept_num_out"}})
    .SetKernelFn(PD_KERNEL(FloorClear));

PD_BUILD_OP(fd_dispatch_floor_speculate_save_output)
    .Inputs({"accept_tokens", "accept_num", "not_need_stop", "seq_lens_decoder", "prompt_lens", "preempted_idx"})
    .Outputs({"msg", "preempted_idx_out"})
    .Attrs({"rank_id: int", "save_each_rank: bool", "skip_prefill: bool", "ncluster: int"})
    .SetInplaceMap({{"preempted_idx", "preempted_idx_out"}})
    .SetKernelFn(PD_KERNEL(FloorSave));

