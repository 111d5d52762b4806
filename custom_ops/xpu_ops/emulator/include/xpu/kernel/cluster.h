// Emulator stand-in for the XTDK header `xpu/kernel/cluster.h` that every Kunlun3 kernel includes: in emulation
// builds the whole dialect comes from kl3_emu.h (XPU3_KERNEL_MODEL §12.1).
#pragma once

#include "kl3_emu.h"
