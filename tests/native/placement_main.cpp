// Placement rules and the device binding of the op layer (OPS §2.2; docs/kunlun3.md "XPU tensors"), driven with
// hand-built TensorArgs so that the XPU-place logic runs on a machine without a device: same-device checks, host
// arguments, the "not built with XPU" refusal, and context() taking the binding's stream and cluster count.
// Prints one line per failed expectation; exit status 1 on any.
#include <cstdio>
#include <string>

#include "common/op_args.h"

using fd_ops::Access;
using fd_ops::ArgSpec;
using fd_ops::DType;
using fd_ops::Form;
using fd_ops::OpCheck;
using fd_ops::OpError;
using fd_ops::PlaceKind;
using fd_ops::TensorArg;
using fd_ops::Where;

namespace {

int failures = 0;
int bound_ncluster = -1;
int stream_token = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAIL: %s\n", what.c_str());
    ++failures;
  }
}

std::string place_text(const void* handle) { return *static_cast<const std::string*>(handle); }

// A stand-in for the Paddle binding: a Kunlun3 context on device 3 with a recognisable stream.
bool fake_bind(const void*, int ncluster, kl3::Context* ctx, std::string*) {
  bound_ncluster = ncluster;
  *ctx = kl3::Context::device_xpu3(ncluster == 0 ? 12 : ncluster, &stream_token, nullptr, 3);
  return true;
}

bool refusing_bind(const void*, int, kl3::Context*, std::string* error) {
  *error = "xpu:0 is not a Kunlun3 (XPU3 / P800) device";
  return false;
}

const std::string kXpu0 = "Place(xpu:0)", kXpu1 = "Place(xpu:1)", kHost = "Place(cpu)";

TensorArg arg(PlaceKind place, int device, const std::string* text, fd_ops::BindDevice bind = fake_bind) {
  TensorArg a;
  a.present = true;
  a.dtype = DType::kInt32;
  a.rank = 1;
  a.dims[0] = 4;
  a.place = place;
  a.device_id = device;
  a.handle = text;
  a.place_text = place_text;
  a.bind_device = place == PlaceKind::kXPU ? bind : nullptr;
  return a;
}

const ArgSpec kSpecs[] = {
    {"accept_num", DType::kInt32, Form::kVector, Where::kDevice, Access::kWrite},
    {"seq_lens_decoder", DType::kInt32, Form::kVector, Where::kDevice, Access::kRead},
    {"preempted_idx", DType::kInt32, Form::kVector, Where::kHost, Access::kWrite},
};

// Runs placement() then context(ncluster); returns "" or the OpError "[status] message".
std::string run(const TensorArg& a, const TensorArg& b, const TensorArg& c, int ncluster, kl3::Context* out) {
  const TensorArg* args[] = {&a, &b, &c};
  OpCheck check("demo_op", kSpecs, args, 3);
  try {
    check.placement();
    *out = check.context(ncluster);
  } catch (const OpError& e) {
    return "[" + std::to_string(e.status()) + "] " + e.message();
  }
  return "";
}

}  // namespace

int main() {
  kl3::Context ctx = kl3::Context::cpu();
  const TensorArg host_flag = arg(PlaceKind::kHost, 0, &kHost);

  // Both device arguments on xpu:0, host argument on the host: bound to the device, stream and clusters passed.
  std::string err = run(arg(PlaceKind::kXPU, 0, &kXpu0), arg(PlaceKind::kXPU, 0, &kXpu0), host_flag, 2, &ctx);
  expect(err.empty(), "same device accepted: " + err);
  expect(ctx.type() == kl3::kXPU3 && !ctx.emulated && ctx.stream == &stream_token && ctx.ncluster == 2 &&
             bound_ncluster == 2 && ctx.device_id == 3,
         "context() takes the binding's device context with ncluster 2");
  err = run(arg(PlaceKind::kXPU, 0, &kXpu0), arg(PlaceKind::kXPU, 0, &kXpu0), host_flag, 0, &ctx);
  expect(err.empty() && ctx.ncluster == 12 && bound_ncluster == 0, "ncluster 0 on a device: every cluster");

  // Host tensor among device tensors: ValueError (status 1) naming the later argument and both places.
  err = run(arg(PlaceKind::kXPU, 0, &kXpu0), arg(PlaceKind::kHost, 0, &kHost), host_flag, 2, &ctx);
  expect(err == "[1] demo_op: argument 'seq_lens_decoder': expected the same device as 'accept_num' "
                "(Place(xpu:0); got Place(cpu))", "mixed host/device refused: " + err);
  // Two devices.
  err = run(arg(PlaceKind::kXPU, 0, &kXpu0), arg(PlaceKind::kXPU, 1, &kXpu1), host_flag, 2, &ctx);
  expect(err.find("[1] demo_op: argument 'seq_lens_decoder': expected the same device") == 0 &&
             err.find("xpu:1") != std::string::npos, "two devices refused: " + err);
  // A host-only argument on the device.
  err = run(arg(PlaceKind::kXPU, 0, &kXpu0), arg(PlaceKind::kXPU, 0, &kXpu0), arg(PlaceKind::kXPU, 0, &kXpu0), 2,
            &ctx);
  expect(err == "[1] demo_op: argument 'preempted_idx': expected a host (CPU) tensor (got Place(xpu:0))",
         "device tensor for a host argument refused: " + err);
  // XPU tensors in a build without PADDLE_WITH_XPU (no binding): not implemented (status 4).
  err = run(arg(PlaceKind::kXPU, 0, &kXpu0, nullptr), arg(PlaceKind::kXPU, 0, &kXpu0, nullptr), host_flag, 2, &ctx);
  expect(err.find("[4] demo_op: argument 'accept_num': tensors on Place(xpu:0) are not supported by this build") == 0,
         "XPU tensors without a binding: " + err);
  // A device the binding refuses (not XPU3): not implemented, with the binding's reason.
  err = run(arg(PlaceKind::kXPU, 0, &kXpu0, refusing_bind), arg(PlaceKind::kXPU, 0, &kXpu0, refusing_bind),
            host_flag, 2, &ctx);
  expect(err == "[4] demo_op: argument 'accept_num': xpu:0 is not a Kunlun3 (XPU3 / P800) device",
         "binding refusal: " + err);
  // Other devices (e.g. a GPU).
  const std::string gpu = "Place(gpu:0)";
  err = run(arg(PlaceKind::kOther, 0, &gpu), arg(PlaceKind::kOther, 0, &gpu), host_flag, 2, &ctx);
  expect(err.find("[4] demo_op: argument 'accept_num': tensors on Place(gpu:0) are not supported") == 0,
         "other devices: " + err);
  // Host tensors: unchanged behaviour (CPU path for 0, emulator for n >= 1).
  err = run(arg(PlaceKind::kHost, 0, &kHost), arg(PlaceKind::kHost, 0, &kHost), host_flag, 0, &ctx);
  expect(err.empty() && ctx.type() == kl3::kCPU, "host tensors, ncluster 0: CPU path");
  err = run(arg(PlaceKind::kHost, 0, &kHost), arg(PlaceKind::kHost, 0, &kHost), host_flag, 5, &ctx);
  expect(err.empty() && ctx.type() == kl3::kXPU3 && ctx.emulated && ctx.ncluster == 5, "host tensors: emulator");

  std::printf("%s\n", failures ? "placement checks FAILED" : "placement checks passed");
  return failures ? 1 : 0;
}
