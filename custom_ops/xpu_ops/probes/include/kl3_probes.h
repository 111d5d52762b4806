// Host runner of the Kunlun3 hardware probes (XPU3_KERNEL_MODEL §14): launches each probe kernel on the
// context's device (the chip in a vendor build, the host emulator otherwise) and reports what it observed next
// to what the emulator assumes. C++11 (compiled as a wrapper by the vendor toolchain).
#pragma once

#include <string>
#include <vector>

#include "kl3/context.h"

namespace fd_xpu {
namespace probe {

struct ProbeResult {
  std::string id;                // "H1" .. "H5"
  std::string question;          // what the probe settles
  std::string observation;       // what this run observed
  std::string emulator_assumes;  // the emulator's assumption for the same question
  // "observed" (the probe ran), "error" (the probe could not run), "not applicable" (e.g. H3 without SIMD).
  std::string status;
  // On the emulator: true when the observation is the emulator's assumed outcome (the expected one in CI).
  bool matches_emulator;
};

// Runs the probes named in `ids` ("H1".."H5"; empty = all, H5 last) on `ctx` (an emulated or device kXPU3
// context).
std::vector<ProbeResult> run_probes(kl3::Context* ctx, const std::vector<std::string>& ids);

}  // namespace probe
}  // namespace fd_xpu
