// The Kunlun3 kernel dialect on a host CPU (XPU3_KERNEL_MODEL §12.1). Force-included before each `.xpu`
// translation unit compiled with -DKL3_EMULATION; the kernel sources themselves stay C++11 and unchanged.
//
// Every primitive defined here is listed, with its assumed semantics and evidence tag, in
// ../kl3_emu_intrinsics.md (§12.3); tools/check_intrinsics.py fails on any identifier a kernel uses that is
// neither C++ nor registered there.
#pragma once

#ifndef KL3_EMULATION
#error "kl3_emu.h is the host emulation of the Kunlun3 dialect; compile kernels with -DKL3_EMULATION"
#endif

#include <cstdint>

#include "kl3_emu_runtime.h"

// Qualifiers (XPU3_KERNEL_MODEL §4.2). Address spaces are one flat host address space here, so they expand to nothing;
// the runtime tells the spaces apart by address (GM registry, SM arena, core stack). `__shared__` is deliberately
// NOT defined: shared objects must be declared with KL3_SHARED so that every core sees the same object.
#define __global__
#define __device__
#define __local__
#define __global_ptr__
#define _global_ptr_
#define __shared_ptr__
#define _shared_ptr_
#define __simd__ alignas(64)

// Identity (XPU3_KERNEL_MODEL §1.3) [D GUIDE], from the calling core's thread-local state.
inline int core_id() { return kl3emu::identity().core_id; }
inline int cluster_id() { return kl3emu::identity().cluster_id; }
inline int core_num() { return kl3emu::identity().core_num; }
inline int cluster_num() { return kl3emu::identity().cluster_num; }

// DMA (XPU3_KERNEL_MODEL §5) [D GUIDE]: (source, destination, size in bytes). Blocking forms have completed on return.
inline void GM2LM(const void* src, void* dst, int n) { kl3emu::dma("GM2LM", kl3emu::kGM, src, kl3emu::kLM, dst, n, false); }
inline void LM2GM(const void* src, void* dst, int n) { kl3emu::dma("LM2GM", kl3emu::kLM, src, kl3emu::kGM, dst, n, false); }
inline void GM2SM(const void* src, void* dst, int n) { kl3emu::dma("GM2SM", kl3emu::kGM, src, kl3emu::kSM, dst, n, false); }
inline void SM2GM(const void* src, void* dst, int n) { kl3emu::dma("SM2GM", kl3emu::kSM, src, kl3emu::kGM, dst, n, false); }
inline void SM2LM(const void* src, void* dst, int n) { kl3emu::dma("SM2LM", kl3emu::kSM, src, kl3emu::kLM, dst, n, false); }
inline void LM2SM(const void* src, void* dst, int n) { kl3emu::dma("LM2SM", kl3emu::kLM, src, kl3emu::kSM, dst, n, false); }
// _ASYNC forms only issue the copy; the destination is valid after the fence of its space (XPU3_KERNEL_MODEL §6).
inline void GM2LM_ASYNC(const void* src, void* dst, int n) { kl3emu::dma("GM2LM_ASYNC", kl3emu::kGM, src, kl3emu::kLM, dst, n, true); }
inline void LM2GM_ASYNC(const void* src, void* dst, int n) { kl3emu::dma("LM2GM_ASYNC", kl3emu::kLM, src, kl3emu::kGM, dst, n, true); }
inline void GM2SM_ASYNC(const void* src, void* dst, int n) { kl3emu::dma("GM2SM_ASYNC", kl3emu::kGM, src, kl3emu::kSM, dst, n, true); }
inline void SM2GM_ASYNC(const void* src, void* dst, int n) { kl3emu::dma("SM2GM_ASYNC", kl3emu::kSM, src, kl3emu::kGM, dst, n, true); }

// Fences (XPU3_KERNEL_MODEL §6) [I, M]: complete this core's outstanding copies into the named space(s); mfence() into
// all.
inline void mfence() { kl3emu::fence(kl3emu::kGM | kl3emu::kLM | kl3emu::kSM); }
inline void mfence_lm() { kl3emu::fence(kl3emu::kLM); }
inline void mfence_sm() { kl3emu::fence(kl3emu::kSM); }
inline void mfence_lm_sm() { kl3emu::fence(kl3emu::kLM | kl3emu::kSM); }

// Cluster barrier (XPU3_KERNEL_MODEL §3) [H]. A macro so that the call site reaches the uniformity check and deadlock
// report.
#define sync_all() ::kl3emu::barrier(__FILE__, __LINE__)
#define sync_cluster() ::kl3emu::barrier(__FILE__, __LINE__)

// Shared object (XPU3_KERNEL_MODEL §12.1): `type name[count]` shared by the cores of a cluster, poisoned at cluster
// start, counted against the 32 KiB SM budget. `name` is a reference to an array, so sizeof(name) means what it means
// on the chip.
#define KL3_SHARED(type, name, count)                                                       \
  static const char kl3_sm_key_##name = 0;                                                  \
  type(&name)[count] = *static_cast<type(*)[count]>(                                        \
      ::kl3emu::sm_object(&kl3_sm_key_##name, #name, sizeof(type) * static_cast<std::size_t>(count)))

// Local array (XPU3_KERNEL_MODEL §12.1): an ordinary stack array, counted against the 4 KiB per-core LM budget while in
// scope.
#define KL3_LOCAL(type, name, count) \
  type name[count];                  \
  ::kl3emu::LmReservation kl3_lm_reservation_##name(sizeof(name), #name)

// min/max as functions, not macros (XPU3_KERNEL_MODEL §12.1).
template <typename T>
inline T min(T a, T b) { return b < a ? b : a; }
template <typename T>
inline T max(T a, T b) { return a < b ? b : a; }
