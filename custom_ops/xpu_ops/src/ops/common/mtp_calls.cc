// Argument contracts (OPS §5.x tables) and plugin calls of the speculative-decoding ops; see mtp_calls.h.
#include "common/mtp_calls.h"

#include <string>

#include "xpu/plugin.h"

namespace fd_ops {

namespace plugin = fd_xpu::plugin;

namespace {

const DType kB = DType::kBool;
const DType kI32 = DType::kInt32;
const DType kI64 = DType::kInt64;
const Form kVec = Form::kVector;
const Form kFlag = Form::kFlag;
const Form kMat = Form::kMatrix;
const Where kDev = Where::kDevice;
const Where kHost = Where::kHost;
const Access kR = Access::kRead;
const Access kW = Access::kWrite;

const char* const kPerSlot = "one per slot (B = numel(stop_flags))";

// OPS §2.2 placement, contiguity, storage sharing and element count, after the op-specific shape relations.
void check_memory_rules(const OpCheck& c) {
  c.placement();
  c.layout();
  c.storage();
  c.element_counts();
}

}  // namespace

void speculate_update(const TensorArg& seq_lens_encoder, const TensorArg& seq_lens_decoder,
                      const TensorArg& not_need_stop, const TensorArg& draft_tokens,
                      const TensorArg& actual_draft_token_nums, const TensorArg& accept_tokens,
                      const TensorArg& accept_num, const TensorArg& stop_flags, const TensorArg& seq_lens_this_time,
                      const TensorArg& is_block_step, const TensorArg& mask_rollback, int ncluster) {
  static const ArgSpec specs[] = {
      {"seq_lens_encoder", kI32, kVec, kDev, kW},        {"seq_lens_decoder", kI32, kVec, kDev, kW},
      {"not_need_stop", kB, kFlag, kHost, kW},           {"draft_tokens", kI64, kMat, kDev, kW},
      {"actual_draft_token_nums", kI32, kVec, kDev, kW}, {"accept_tokens", kI64, kMat, kDev, kR},
      {"accept_num", kI32, kVec, kDev, kR},              {"stop_flags", kB, kVec, kDev, kR},
      {"seq_lens_this_time", kI32, kVec, kDev, kR},      {"is_block_step", kB, kVec, kDev, kR},
      {"mask_rollback", kI32, kVec, kDev, kW},
  };
  const TensorArg* args[] = {&seq_lens_encoder, &seq_lens_decoder,  &not_need_stop,      &draft_tokens,
                             &actual_draft_token_nums, &accept_tokens, &accept_num, &stop_flags,
                             &seq_lens_this_time, &is_block_step, &mask_rollback};
  OpCheck c("speculate_update", specs, args, 11);
  c.dtypes();
  c.forms();
  const int64_t B = stop_flags.numel();
  const int64_t R = seq_lens_this_time.numel();
  const int64_t T = draft_tokens.dims[1];
  c.numel_is(0, B, kPerSlot);
  c.numel_is(1, B, kPerSlot);
  c.dim_at_least(3, 1, 1, "T = shape[1]");
  c.dims_are(3, B, T);
  c.numel_is(4, B, kPerSlot);
  c.dims_are(5, B, T);
  c.numel_is(6, B, kPerSlot);
  c.at_least("stop_flags", B, 1, "B = numel(stop_flags)");
  c.between("seq_lens_this_time", R, 1, B, "R = numel(seq_lens_this_time)");
  c.numel_is(9, B, kPerSlot);
  c.numel_is(10, B, kPerSlot);
  if (B > plugin::kSpeculateUpdateMaxSlots) {
    c.fail("stop_flags", std::to_string(B) + " slots exceeds the supported maximum of " +
                             std::to_string(plugin::kSpeculateUpdateMaxSlots));
  }
  check_memory_rules(c);
  kl3::Context ctx = c.context(ncluster);
  c.status(plugin::speculate_update(
      &ctx, ptr<int32_t>(seq_lens_encoder), ptr<int32_t>(seq_lens_decoder), ptr<bool>(not_need_stop),
      ptr<int64_t>(draft_tokens), ptr<int32_t>(actual_draft_token_nums), ptr<const int64_t>(accept_tokens),
      ptr<const int32_t>(accept_num), ptr<const bool>(stop_flags), ptr<const int32_t>(seq_lens_this_time),
      ptr<const bool>(is_block_step), ptr<int32_t>(mask_rollback), static_cast<int>(B), static_cast<int>(R),
      static_cast<int>(T)));
}

void speculate_set_value_by_flags_and_idx(const TensorArg& pre_ids_all, const TensorArg& accept_tokens,
                                          const TensorArg& accept_num, const TensorArg& stop_flags,
                                          const TensorArg& seq_lens_this_time, const TensorArg& seq_lens_encoder,
                                          const TensorArg& seq_lens_decoder, const TensorArg& step_idx,
                                          int ncluster) {
  static const ArgSpec specs[] = {
      {"pre_ids_all", kI64, kMat, kDev, kW},        {"accept_tokens", kI64, kMat, kDev, kR},
      {"accept_num", kI32, kVec, kDev, kW},         {"stop_flags", kB, kVec, kDev, kR},
      {"seq_lens_this_time", kI32, kVec, kDev, kR}, {"seq_lens_encoder", kI32, kVec, kDev, kR},
      {"seq_lens_decoder", kI32, kVec, kDev, kW},   {"step_idx", kI64, kVec, kDev, kR},
  };
  const TensorArg* args[] = {&pre_ids_all,        &accept_tokens,    &accept_num,       &stop_flags,
                             &seq_lens_this_time, &seq_lens_encoder, &seq_lens_decoder, &step_idx};
  OpCheck c("speculate_set_value_by_flags_and_idx", specs, args, 8);
  c.dtypes();
  c.forms();
  const int64_t B = stop_flags.numel();
  const int64_t R = seq_lens_this_time.numel();
  const int64_t M = pre_ids_all.dims[1];
  const int64_t T = accept_tokens.dims[1];
  c.dim_at_least(0, 1, 1, "M = shape[1]");
  c.dims_are(0, B, M);
  c.dim_at_least(1, 1, 1, "T = shape[1]");
  c.dims_are(1, B, T);
  c.numel_is(2, B, kPerSlot);
  c.at_least("stop_flags", B, 1, "B = numel(stop_flags)");
  c.between("seq_lens_this_time", R, 1, B, "R = numel(seq_lens_this_time)");
  c.numel_is(5, B, kPerSlot);
  c.numel_is(6, B, kPerSlot);
  c.numel_is(7, B, kPerSlot);
  check_memory_rules(c);
  kl3::Context ctx = c.context(ncluster);
  c.status(plugin::speculate_set_value_by_flags_and_idx(
      &ctx, ptr<int64_t>(pre_ids_all), ptr<const int64_t>(accept_tokens), ptr<int32_t>(accept_num),
      ptr<const bool>(stop_flags), ptr<const int32_t>(seq_lens_this_time), ptr<const int32_t>(seq_lens_encoder),
      ptr<int32_t>(seq_lens_decoder), ptr<const int64_t>(step_idx), static_cast<int>(B), static_cast<int>(R),
      static_cast<int>(M), static_cast<int>(T)));
}

void speculate_set_stop_value_multi_seqs(const TensorArg& accept_tokens, const TensorArg& accept_num,
                                         const TensorArg& pre_ids, const TensorArg& step_idx,
                                         const TensorArg& stop_flags, const TensorArg& seq_lens,
                                         const TensorArg& stop_seqs, const TensorArg& stop_seqs_len,
                                         const TensorArg& end_ids, const TensorArg& min_tokens, int ncluster) {
  static const ArgSpec specs[] = {
      {"accept_tokens", kI64, kMat, kDev, kW},
      {"accept_num", kI32, kVec, kDev, kW},
      {"pre_ids", kI64, kMat, kDev, kR},
      {"step_idx", kI64, kVec, kDev, kR},
      {"stop_flags", kB, kVec, kDev, kW},
      {"seq_lens", kI32, kVec, kDev, kR},
      {"stop_seqs", kI64, Form::kTensor3, kDev, kR},
      {"stop_seqs_len", kI32, kMat, kDev, kR},
      {"end_ids", kI64, kVec, kDev, kR},
      {"min_tokens", kI64, kVec, kDev, kR},
  };
  const TensorArg* args[] = {&accept_tokens, &accept_num, &pre_ids,       &step_idx, &stop_flags,
                             &seq_lens,      &stop_seqs,  &stop_seqs_len, &end_ids,  &min_tokens};
  OpCheck c("speculate_set_stop_value_multi_seqs", specs, args, 10);
  c.dtypes();
  c.forms();
  const int64_t B = stop_flags.numel();
  const int64_t R = seq_lens.numel();
  const int64_t T = accept_tokens.dims[1];
  const int64_t M = pre_ids.dims[1];
  const int64_t S = stop_seqs.dims[1];
  const int64_t SL = stop_seqs.dims[2];
  const int64_t E = end_ids.numel();
  c.dim_at_least(0, 1, 1, "T = shape[1]");
  c.dims_are(0, B, T);
  c.numel_is(1, B, kPerSlot);
  c.dim_at_least(2, 1, 1, "M = shape[1]");
  c.dims_are(2, B, M);
  c.numel_is(3, B, kPerSlot);
  c.at_least("stop_flags", B, 1, "B = numel(stop_flags)");
  c.between("seq_lens", R, 1, B, "R = numel(seq_lens)");
  c.dim_at_least(6, 1, 1, "S = shape[1]");
  c.dim_at_least(6, 2, 1, "SL = shape[2]");
  if (stop_seqs.dims[0] != B) {
    c.fail("stop_seqs", "expected shape [" + std::to_string(B) + ", S, SL] (got " + stop_seqs.shape_text() + ")");
  }
  c.dims_are(7, B, S);
  c.at_least("end_ids", E, 1, "E = numel(end_ids)");
  c.numel_is(9, B, kPerSlot);
  check_memory_rules(c);
  kl3::Context ctx = c.context(ncluster);
  c.status(plugin::speculate_set_stop_value_multi_seqs(
      &ctx, ptr<int64_t>(accept_tokens), ptr<int32_t>(accept_num), ptr<const int64_t>(pre_ids),
      ptr<const int64_t>(step_idx), ptr<bool>(stop_flags), ptr<const int32_t>(seq_lens),
      ptr<const int64_t>(stop_seqs), ptr<const int32_t>(stop_seqs_len), ptr<const int64_t>(end_ids),
      ptr<const int64_t>(min_tokens), static_cast<int>(B), static_cast<int>(R), static_cast<int>(T),
      static_cast<int>(M), static_cast<int>(S), static_cast<int>(SL), static_cast<int>(E)));
}

void speculate_schedule_cache(const TensorArg& draft_tokens, const TensorArg& block_tables,
                              const TensorArg& stop_flags, const TensorArg& prompt_lens,
                              const TensorArg& seq_lens_this_time, const TensorArg& seq_lens_encoder,
                              const TensorArg& seq_lens_decoder, const TensorArg& step_seq_lens_decoder,
                              const TensorArg& step_draft_tokens, const TensorArg& step_seq_lens_this_time,
                              const TensorArg& accept_num, const TensorArg& accept_tokens,
                              const TensorArg& is_block_step, const TensorArg& not_need_stop, int block_size,
                              int max_draft_tokens, bool prefill_one_step_stop, int ncluster) {
  static const ArgSpec specs[] = {
      {"draft_tokens", kI64, kMat, kDev, kR},
      {"block_tables", kI32, kMat, kDev, kR},
      {"stop_flags", kB, kVec, kDev, kW},
      {"prompt_lens", kI64, kVec, kDev, kR},
      {"seq_lens_this_time", kI32, kVec, kDev, kW},
      {"seq_lens_encoder", kI32, kVec, kDev, kW},
      {"seq_lens_decoder", kI32, kVec, kDev, kW},
      {"step_seq_lens_decoder", kI32, kVec, kDev, kW},
      {"step_draft_tokens", kI64, kMat, kDev, kW},
      {"step_seq_lens_this_time", kI32, kVec, kDev, kW},
      {"accept_num", kI32, kVec, kDev, kW},
      {"accept_tokens", kI64, kMat, kDev, kW},
      {"is_block_step", kB, kVec, kDev, kW},
      {"not_need_stop", kB, kFlag, kHost, kW},
  };
  const TensorArg* args[] = {&draft_tokens,          &block_tables,      &stop_flags,
                             &prompt_lens,           &seq_lens_this_time, &seq_lens_encoder,
                             &seq_lens_decoder,      &step_seq_lens_decoder, &step_draft_tokens,
                             &step_seq_lens_this_time, &accept_num,      &accept_tokens,
                             &is_block_step,         &not_need_stop};
  OpCheck c("speculate_schedule_cache", specs, args, 14);
  c.dtypes();
  c.forms();
  const int64_t B = stop_flags.numel();
  const int64_t R = seq_lens_this_time.numel();
  const int64_t T = draft_tokens.dims[1];
  const int64_t NB = block_tables.dims[1];
  c.dim_at_least(0, 1, 1, "T = shape[1]");
  c.dims_are(0, B, T);
  c.dim_at_least(1, 1, 1, "NB = shape[1]");
  c.dims_are(1, B, NB);
  c.at_least("stop_flags", B, 1, "B = numel(stop_flags)");
  c.numel_is(3, B, kPerSlot);
  c.between("seq_lens_this_time", R, 1, B, "R = numel(seq_lens_this_time)");
  c.numel_is(5, B, kPerSlot);
  c.numel_is(6, B, kPerSlot);
  c.numel_is(7, B, kPerSlot);
  c.dims_are(8, B, T);
  c.numel_is(9, B, kPerSlot);
  c.numel_is(10, B, kPerSlot);
  c.dims_are(11, B, T);
  c.numel_is(12, B, kPerSlot);
  check_memory_rules(c);
  c.at_least("block_size", block_size, 1, "block_size");
  c.at_least("max_draft_tokens", max_draft_tokens, 0, "max_draft_tokens");
  kl3::Context ctx = c.context(ncluster);
  c.status(plugin::speculate_schedule_cache(
      &ctx, ptr<const int64_t>(draft_tokens), ptr<const int32_t>(block_tables), ptr<bool>(stop_flags),
      ptr<const int64_t>(prompt_lens), ptr<int32_t>(seq_lens_this_time), ptr<int32_t>(seq_lens_encoder),
      ptr<int32_t>(seq_lens_decoder), ptr<int32_t>(step_seq_lens_decoder), ptr<int64_t>(step_draft_tokens),
      ptr<int32_t>(step_seq_lens_this_time), ptr<int32_t>(accept_num), ptr<int64_t>(accept_tokens),
      ptr<bool>(is_block_step), ptr<bool>(not_need_stop), static_cast<int>(B), static_cast<int>(R),
      static_cast<int>(T), static_cast<int>(NB), block_size, max_draft_tokens, prefill_one_step_stop));
}

void recover_decode_task(const TensorArg& stop_flags, const TensorArg& seq_lens_this_time,
                         const TensorArg& seq_lens_encoder, const TensorArg& seq_lens_decoder,
                         const TensorArg& step_seq_lens_decoder, const TensorArg& block_tables,
                         const TensorArg& is_block_step, const TensorArg& draft_tokens,
                         const TensorArg& step_draft_tokens, const TensorArg& step_seq_lens_this_time,
                         int block_size, int max_draft_tokens, int ncluster) {
  static const ArgSpec specs[] = {
      {"stop_flags", kB, kVec, kDev, kW},
      {"seq_lens_this_time", kI32, kVec, kDev, kW},
      {"seq_lens_encoder", kI32, kVec, kDev, kW},
      {"seq_lens_decoder", kI32, kVec, kDev, kW},
      {"step_seq_lens_decoder", kI32, kVec, kDev, kR},
      {"block_tables", kI32, kMat, kDev, kR},
      {"is_block_step", kB, kVec, kDev, kW},
      {"draft_tokens", kI64, kMat, kDev, kW, true},
      {"step_draft_tokens", kI64, kMat, kDev, kR, true},
      {"step_seq_lens_this_time", kI32, kVec, kDev, kR, true},
  };
  const TensorArg* args[] = {&stop_flags,        &seq_lens_this_time, &seq_lens_encoder,     &seq_lens_decoder,
                             &step_seq_lens_decoder, &block_tables,   &is_block_step,        &draft_tokens,
                             &step_draft_tokens, &step_seq_lens_this_time};
  OpCheck c("recover_decode_task", specs, args, 10);
  const bool speculative = draft_tokens.present || step_draft_tokens.present || step_seq_lens_this_time.present;
  if (speculative) {
    for (int i = 7; i < 10; ++i) {
      if (!args[i]->present) {
        c.fail(specs[i].name, "the speculative tensors draft_tokens, step_draft_tokens and step_seq_lens_this_time "
                              "must be given together");
      }
    }
  }
  c.dtypes();
  c.forms();
  const int64_t B = stop_flags.numel();
  const int64_t R = seq_lens_this_time.numel();
  const int64_t NB = block_tables.dims[1];
  const int64_t T = speculative ? draft_tokens.dims[1] : 0;
  c.at_least("stop_flags", B, 1, "B = numel(stop_flags)");
  c.between("seq_lens_this_time", R, 1, B, "R = numel(seq_lens_this_time)");
  c.numel_is(2, B, kPerSlot);
  c.numel_is(3, B, kPerSlot);
  c.numel_is(4, B, kPerSlot);
  c.dim_at_least(5, 1, 1, "NB = shape[1]");
  c.dims_are(5, B, NB);
  c.numel_is(6, B, kPerSlot);
  if (speculative) {
    c.dim_at_least(7, 1, 1, "T = shape[1]");
    c.dims_are(7, B, T);
    c.dims_are(8, B, T);
    c.numel_is(9, B, kPerSlot);
  }
  check_memory_rules(c);
  c.at_least("block_size", block_size, 1, "block_size");
  c.at_least("max_draft_tokens", max_draft_tokens, 0, "max_draft_tokens");
  kl3::Context ctx = c.context(ncluster);
  c.status(plugin::recover_decode_task(
      &ctx, ptr<bool>(stop_flags), ptr<int32_t>(seq_lens_this_time), ptr<int32_t>(seq_lens_encoder),
      ptr<int32_t>(seq_lens_decoder), ptr<const int32_t>(step_seq_lens_decoder), ptr<const int32_t>(block_tables),
      ptr<bool>(is_block_step), ptr<int64_t>(draft_tokens), ptr<const int64_t>(step_draft_tokens),
      ptr<const int32_t>(step_seq_lens_this_time), static_cast<int>(B), static_cast<int>(R), static_cast<int>(NB),
      static_cast<int>(T), block_size, max_draft_tokens));
}

void speculate_clear_accept_nums(const TensorArg& accept_num, const TensorArg& seq_lens_decoder, int ncluster) {
  static const ArgSpec specs[] = {
      {"accept_num", kI32, kVec, kDev, kW},
      {"seq_lens_decoder", kI32, kVec, kDev, kR},
  };
  const TensorArg* args[] = {&accept_num, &seq_lens_decoder};
  OpCheck c("speculate_clear_accept_nums", specs, args, 2);
  c.dtypes();
  c.forms();
  const int64_t B = accept_num.numel();
  c.at_least("accept_num", B, 1, "B = numel(accept_num)");
  c.numel_is(1, B, "one per slot (B = numel(accept_num))");
  check_memory_rules(c);
  kl3::Context ctx = c.context(ncluster);
  c.status(plugin::speculate_clear_accept_nums(&ctx, ptr<int32_t>(accept_num), ptr<const int32_t>(seq_lens_decoder),
                                               static_cast<int>(B)));
}

void speculate_save_output(const TensorArg& accept_tokens, const TensorArg& accept_num,
                           const TensorArg& not_need_stop, const TensorArg& seq_lens_decoder,
                           const TensorArg& prompt_lens, const TensorArg& preempted_idx, int rank_id,
                           bool save_each_rank, bool skip_prefill, int ncluster, MsgAllocator alloc_msg, void* user) {
  static const ArgSpec specs[] = {
      {"accept_tokens", kI64, kMat, kDev, kR},    {"accept_num", kI32, kVec, kDev, kR},
      {"not_need_stop", kB, kFlag, kHost, kR},    {"seq_lens_decoder", kI32, kVec, kDev, kR},
      {"prompt_lens", kI64, kVec, kDev, kR},      {"preempted_idx", kI32, kVec, kHost, kW},
  };
  const TensorArg* args[] = {&accept_tokens, &accept_num, &not_need_stop, &seq_lens_decoder, &prompt_lens,
                             &preempted_idx};
  OpCheck c("speculate_save_output", specs, args, 6);
  c.dtypes();
  c.forms();
  const int64_t bsz = accept_tokens.dims[0];
  const int64_t T = accept_tokens.dims[1];
  const char* per_slot = "one per slot (bsz = accept_tokens.shape[0])";
  c.at_least("accept_tokens", bsz, 1, "bsz = shape[0]");
  c.dim_at_least(0, 1, 1, "T = shape[1]");
  c.numel_is(1, bsz, per_slot);
  c.numel_is(3, bsz, per_slot);
  c.numel_is(4, bsz, per_slot);
  c.numel_is(5, bsz, per_slot);
  check_memory_rules(c);
  c.at_least("rank_id", rank_id, 0, "rank_id");
  kl3::Context ctx = c.context(ncluster);
  const int64_t msg_numel = plugin::speculate_save_output_msg_numel(static_cast<int>(bsz), static_cast<int>(T),
                                                                    rank_id, save_each_rank);
  int64_t* msg = alloc_msg(msg_numel, user);
  c.status(plugin::speculate_save_output(
      &ctx, ptr<const int64_t>(accept_tokens), ptr<const int32_t>(accept_num), ptr<const bool>(not_need_stop),
      ptr<const int32_t>(seq_lens_decoder), ptr<const int64_t>(prompt_lens), ptr<int32_t>(preempted_idx), msg,
      static_cast<int>(bsz), static_cast<int>(T), rank_id, save_each_rank, skip_prefill));
}

}  // namespace fd_ops
