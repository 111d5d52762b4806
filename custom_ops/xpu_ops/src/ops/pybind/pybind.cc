// fastdeploy.model_executor.ops._kl3_pybind: the speculative-decoding ops over writable C-contiguous NumPy arrays,
// without Paddle. Same argument order, checks and messages as the Paddle ops; a trailing keyword `ncluster`
// (0: CPU path, n >= 1: Kunlun3 kernel on the host emulator with n clusters). Status 1 raises ValueError, any
// other status RuntimeError. It lets tests place arrays inside canary guard bands (OPS §8 C3) and lets the
// benchmark time the plugin without the framework.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "common/mtp_calls.h"
#include "kl3_probes.h"
#ifdef KL3_VENDOR_BUILD
#include "xpu/runtime.h"
#endif

namespace py = pybind11;

namespace {

using fd_ops::DType;
using fd_ops::OpError;
using fd_ops::TensorArg;

const char* numpy_dtype_name(char kind, py::ssize_t itemsize) {
  if (kind == 'b' && itemsize == 1) return "bool";
  if (kind == 'i') {
    switch (itemsize) {
      case 1: return "int8";
      case 2: return "int16";
      case 4: return "int32";
      case 8: return "int64";
    }
  }
  if (kind == 'u') {
    switch (itemsize) {
      case 1: return "uint8";
      case 2: return "uint16";
      case 4: return "uint32";
      case 8: return "uint64";
    }
  }
  if (kind == 'f') {
    switch (itemsize) {
      case 2: return "float16";
      case 4: return "float32";
      case 8: return "float64";
    }
  }
  return "an unsupported dtype";
}

std::string host_place_text(const void*) { return "host memory"; }

// Converts one argument; None is accepted only for optional arguments.
TensorArg numpy_arg(const py::handle& obj, const char* op, const char* name, bool optional = false) {
  TensorArg a;
  if (obj.is_none() && optional) {
    return a;
  }
  if (!py::isinstance<py::array>(obj)) {
    throw OpError(kl3::INVALID_PARAM, std::string(op) + ": argument '" + name + "': expected a NumPy array (got " +
                                          std::string(py::str(py::type::of(obj).attr("__name__"))) + ")");
  }
  py::array arr = py::reinterpret_borrow<py::array>(obj);
  a.present = true;
  const char kind = arr.dtype().kind();
  const py::ssize_t itemsize = arr.itemsize();
  if (kind == 'b' && itemsize == 1) {
    a.dtype = DType::kBool;
  } else if (kind == 'i' && itemsize == 4) {
    a.dtype = DType::kInt32;
  } else if (kind == 'i' && itemsize == 8) {
    a.dtype = DType::kInt64;
  }
  a.dtype_name = numpy_dtype_name(kind, itemsize);
  // Ranks above 8 never match an op's form; keeping the first 8 dims is enough for the message.
  a.rank = static_cast<int>(arr.ndim() < 8 ? arr.ndim() : 8);
  for (int i = 0; i < a.rank; ++i) {
    a.dims[i] = arr.shape(i);
  }
  a.data = const_cast<void*>(arr.data());
  a.nbytes = arr.nbytes();
  a.place = fd_ops::PlaceKind::kHost;
  a.contiguous = (arr.flags() & py::array::c_style) != 0;
  a.writable = arr.writeable();
  a.handle = nullptr;
  a.place_text = host_place_text;
  return a;
}

// Runs one op call and raises its OpError as ValueError (status 1) or RuntimeError (other statuses).
template <typename F>
void run(F&& call) {
  try {
    call();
  } catch (const OpError& e) {
    if (e.status() == kl3::INVALID_PARAM) {
      throw py::value_error(e.message());
    }
    throw std::runtime_error(e.message());
  }
}

int64_t* alloc_numpy_msg(int64_t numel, void* user) {
  auto* msg = static_cast<py::array_t<int64_t>*>(user);
  *msg = py::array_t<int64_t>(static_cast<py::ssize_t>(numel));
  return msg->mutable_data();
}

}  // namespace

PYBIND11_MODULE(_kl3_pybind, m) {
  m.doc() = "Speculative-decoding state ops (OPS.md §5) over NumPy arrays; ncluster=0 CPU path, n >= 1 Kunlun3 "
            "kernel on the host emulator.";

  m.def(
      "speculate_update",
      [](py::object seq_lens_encoder, py::object seq_lens_decoder, py::object not_need_stop, py::object draft_tokens,
         py::object actual_draft_token_nums, py::object accept_tokens, py::object accept_num, py::object stop_flags,
         py::object seq_lens_this_time, py::object is_block_step, py::object mask_rollback, int ncluster) {
        run([&] {
          const char* op = "speculate_update";
          fd_ops::speculate_update(
              numpy_arg(seq_lens_encoder, op, "seq_lens_encoder"), numpy_arg(seq_lens_decoder, op, "seq_lens_decoder"),
              numpy_arg(not_need_stop, op, "not_need_stop"), numpy_arg(draft_tokens, op, "draft_tokens"),
              numpy_arg(actual_draft_token_nums, op, "actual_draft_token_nums"),
              numpy_arg(accept_tokens, op, "accept_tokens"), numpy_arg(accept_num, op, "accept_num"),
              numpy_arg(stop_flags, op, "stop_flags"), numpy_arg(seq_lens_this_time, op, "seq_lens_this_time"),
              numpy_arg(is_block_step, op, "is_block_step"), numpy_arg(mask_rollback, op, "mask_rollback"),
              ncluster);
        });
      },
      py::arg("seq_lens_encoder"), py::arg("seq_lens_decoder"), py::arg("not_need_stop"), py::arg("draft_tokens"),
      py::arg("actual_draft_token_nums"), py::arg("accept_tokens"), py::arg("accept_num"), py::arg("stop_flags"),
      py::arg("seq_lens_this_time"), py::arg("is_block_step"), py::arg("mask_rollback"), py::kw_only(),
      py::arg("ncluster") = 0);

  m.def(
      "speculate_set_value_by_flags_and_idx",
      [](py::object pre_ids_all, py::object accept_tokens, py::object accept_num, py::object stop_flags,
         py::object seq_lens_this_time, py::object seq_lens_encoder, py::object seq_lens_decoder, py::object step_idx,
         int ncluster) {
        run([&] {
          const char* op = "speculate_set_value_by_flags_and_idx";
          fd_ops::speculate_set_value_by_flags_and_idx(
              numpy_arg(pre_ids_all, op, "pre_ids_all"), numpy_arg(accept_tokens, op, "accept_tokens"),
              numpy_arg(accept_num, op, "accept_num"), numpy_arg(stop_flags, op, "stop_flags"),
              numpy_arg(seq_lens_this_time, op, "seq_lens_this_time"),
              numpy_arg(seq_lens_encoder, op, "seq_lens_encoder"), numpy_arg(seq_lens_decoder, op, "seq_lens_decoder"),
              numpy_arg(step_idx, op, "step_idx"), ncluster);
        });
      },
      py::arg("pre_ids_all"), py::arg("accept_tokens"), py::arg("accept_num"), py::arg("stop_flags"),
      py::arg("seq_lens_this_time"), py::arg("seq_lens_encoder"), py::arg("seq_lens_decoder"), py::arg("step_idx"),
      py::kw_only(), py::arg("ncluster") = 0);

  m.def(
      "speculate_set_stop_value_multi_seqs",
      [](py::object accept_tokens, py::object accept_num, py::object pre_ids, py::object step_idx,
         py::object stop_flags, py::object seq_lens, py::object stop_seqs, py::object stop_seqs_len, py::object end_ids,
         py::object min_tokens, int ncluster) {
        run([&] {
          const char* op = "speculate_set_stop_value_multi_seqs";
          fd_ops::speculate_set_stop_value_multi_seqs(
              numpy_arg(accept_tokens, op, "accept_tokens"), numpy_arg(accept_num, op, "accept_num"),
              numpy_arg(pre_ids, op, "pre_ids"), numpy_arg(step_idx, op, "step_idx"),
              numpy_arg(stop_flags, op, "stop_flags"), numpy_arg(seq_lens, op, "seq_lens"),
              numpy_arg(stop_seqs, op, "stop_seqs"), numpy_arg(stop_seqs_len, op, "stop_seqs_len"),
              numpy_arg(end_ids, op, "end_ids"), numpy_arg(min_tokens, op, "min_tokens"), ncluster);
        });
      },
      py::arg("accept_tokens"), py::arg("accept_num"), py::arg("pre_ids"), py::arg("step_idx"), py::arg("stop_flags"),
      py::arg("seq_lens"), py::arg("stop_seqs"), py::arg("stop_seqs_len"), py::arg("end_ids"), py::arg("min_tokens"),
      py::kw_only(), py::arg("ncluster") = 0);

  m.def(
      "speculate_schedule_cache",
      [](py::object draft_tokens, py::object block_tables, py::object stop_flags, py::object prompt_lens,
         py::object seq_lens_this_time, py::object seq_lens_encoder, py::object seq_lens_decoder,
         py::object step_seq_lens_decoder, py::object step_draft_tokens, py::object step_seq_lens_this_time,
         py::object accept_num, py::object accept_tokens, py::object is_block_step, py::object not_need_stop,
         int block_size, int max_draft_tokens, bool prefill_one_step_stop, int ncluster) {
        run([&] {
          const char* op = "speculate_schedule_cache";
          fd_ops::speculate_schedule_cache(
              numpy_arg(draft_tokens, op, "draft_tokens"), numpy_arg(block_tables, op, "block_tables"),
              numpy_arg(stop_flags, op, "stop_flags"), numpy_arg(prompt_lens, op, "prompt_lens"),
              numpy_arg(seq_lens_this_time, op, "seq_lens_this_time"),
              numpy_arg(seq_lens_encoder, op, "seq_lens_encoder"), numpy_arg(seq_lens_decoder, op, "seq_lens_decoder"),
              numpy_arg(step_seq_lens_decoder, op, "step_seq_lens_decoder"),
              numpy_arg(step_draft_tokens, op, "step_draft_tokens"),
              numpy_arg(step_seq_lens_this_time, op, "step_seq_lens_this_time"),
              numpy_arg(accept_num, op, "accept_num"), numpy_arg(accept_tokens, op, "accept_tokens"),
              numpy_arg(is_block_step, op, "is_block_step"), numpy_arg(not_need_stop, op, "not_need_stop"),
              block_size, max_draft_tokens, prefill_one_step_stop, ncluster);
        });
      },
      py::arg("draft_tokens"), py::arg("block_tables"), py::arg("stop_flags"), py::arg("prompt_lens"),
      py::arg("seq_lens_this_time"), py::arg("seq_lens_encoder"), py::arg("seq_lens_decoder"),
      py::arg("step_seq_lens_decoder"), py::arg("step_draft_tokens"), py::arg("step_seq_lens_this_time"),
      py::arg("accept_num"), py::arg("accept_tokens"), py::arg("is_block_step"), py::arg("not_need_stop"),
      py::arg("block_size"), py::arg("max_draft_tokens"), py::arg("prefill_one_step_stop"), py::kw_only(),
      py::arg("ncluster") = 0);

  m.def(
      "recover_decode_task",
      [](py::object stop_flags, py::object seq_lens_this_time, py::object seq_lens_encoder, py::object seq_lens_decoder,
         py::object step_seq_lens_decoder, py::object block_tables, py::object is_block_step, py::object draft_tokens,
         py::object step_draft_tokens, py::object step_seq_lens_this_time, int block_size, int max_draft_tokens,
         int ncluster) {
        run([&] {
          const char* op = "recover_decode_task";
          fd_ops::recover_decode_task(
              numpy_arg(stop_flags, op, "stop_flags"), numpy_arg(seq_lens_this_time, op, "seq_lens_this_time"),
              numpy_arg(seq_lens_encoder, op, "seq_lens_encoder"), numpy_arg(seq_lens_decoder, op, "seq_lens_decoder"),
              numpy_arg(step_seq_lens_decoder, op, "step_seq_lens_decoder"),
              numpy_arg(block_tables, op, "block_tables"), numpy_arg(is_block_step, op, "is_block_step"),
              numpy_arg(draft_tokens, op, "draft_tokens", true),
              numpy_arg(step_draft_tokens, op, "step_draft_tokens", true),
              numpy_arg(step_seq_lens_this_time, op, "step_seq_lens_this_time", true), block_size,
              max_draft_tokens, ncluster);
        });
      },
      py::arg("stop_flags"), py::arg("seq_lens_this_time"), py::arg("seq_lens_encoder"), py::arg("seq_lens_decoder"),
      py::arg("step_seq_lens_decoder"), py::arg("block_tables"), py::arg("is_block_step"),
      py::arg("draft_tokens").none(true), py::arg("step_draft_tokens").none(true),
      py::arg("step_seq_lens_this_time").none(true), py::arg("block_size"), py::arg("max_draft_tokens"),
      py::kw_only(), py::arg("ncluster") = 0);

  m.def(
      "speculate_clear_accept_nums",
      [](py::object accept_num, py::object seq_lens_decoder, int ncluster) {
        run([&] {
          const char* op = "speculate_clear_accept_nums";
          fd_ops::speculate_clear_accept_nums(numpy_arg(accept_num, op, "accept_num"),
                                              numpy_arg(seq_lens_decoder, op, "seq_lens_decoder"), ncluster);
        });
      },
      py::arg("accept_num"), py::arg("seq_lens_decoder"), py::kw_only(), py::arg("ncluster") = 0);

  m.def(
      "speculate_save_output",
      [](py::object accept_tokens, py::object accept_num, py::object not_need_stop, py::object seq_lens_decoder,
         py::object prompt_lens, py::object preempted_idx, int rank_id, bool save_each_rank, bool skip_prefill,
         int ncluster) {
        py::array_t<int64_t> msg;
        run([&] {
          const char* op = "speculate_save_output";
          fd_ops::speculate_save_output(
              numpy_arg(accept_tokens, op, "accept_tokens"), numpy_arg(accept_num, op, "accept_num"),
              numpy_arg(not_need_stop, op, "not_need_stop"), numpy_arg(seq_lens_decoder, op, "seq_lens_decoder"),
              numpy_arg(prompt_lens, op, "prompt_lens"), numpy_arg(preempted_idx, op, "preempted_idx"), rank_id,
              save_each_rank, skip_prefill, ncluster, alloc_numpy_msg, &msg);
        });
        return msg;
      },
      py::arg("accept_tokens"), py::arg("accept_num"), py::arg("not_need_stop"), py::arg("seq_lens_decoder"),
      py::arg("prompt_lens"), py::arg("preempted_idx"), py::arg("rank_id"), py::arg("save_each_rank"),
      py::arg("skip_prefill"), py::kw_only(), py::arg("ncluster") = 0);

  // Hardware probes H1-H5 (XPU3_KERNEL_MODEL §14): on the host emulator here, on the current Kunlun device in a
  // vendor build (default stream). Returns one dict per probe.
  m.def(
      "run_probes",
      [](const std::vector<std::string>& ids) {
#ifdef KL3_VENDOR_BUILD
        kl3::Context ctx = kl3::Context::device_xpu3(1, nullptr, nullptr, 0);
#else
        kl3::Context ctx = kl3::Context::emulated_xpu3(1);
#endif
        py::list out;
        for (const fd_xpu::probe::ProbeResult& r : fd_xpu::probe::run_probes(&ctx, ids)) {
          py::dict d;
          d["id"] = r.id;
          d["question"] = r.question;
          d["observation"] = r.observation;
          d["emulator_assumes"] = r.emulator_assumes;
          d["status"] = r.status;
          d["matches_emulator"] = r.matches_emulator;
          out.append(d);
        }
        return out;
      },
      py::arg("ids") = std::vector<std::string>());
  // Clusters of each visible Kunlun device (XRE XPUATTR_NUM_CLUSTER); empty without the vendor runtime.
  m.def("device_clusters", []() {
    std::vector<int> clusters;
#ifdef KL3_VENDOR_BUILD
    int count = 0;
    if (xpu_device_count(&count) == 0) {
      for (int dev = 0; dev < count; ++dev) {
        uint64_t value = 0;
        clusters.push_back(xpu_device_get_attr(&value, XPUATTR_NUM_CLUSTER, dev) == 0 ? static_cast<int>(value) : -1);
      }
    }
#endif
    return clusters;
  });
#ifdef KL3_VENDOR_BUILD
  m.attr("VENDOR_BUILD") = true;
#else
  m.attr("VENDOR_BUILD") = false;
#endif
}
