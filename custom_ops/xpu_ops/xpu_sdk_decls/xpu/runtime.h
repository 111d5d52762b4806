// Minimal declarations of the XRE runtime names that the project's vendor branch and Paddle's XPU headers use,
// for the compile-only check of the XPU branch (docs/kunlun3.md, "Compile check"). NOT the vendor header: it is
// never linked or run. Each name's source and evidence level is in ../DECLARATIONS.md.
#pragma once

#include <stdint.h>
#include <stdlib.h>

extern "C" {

typedef void* XPUStream;
typedef void* XPUEvent;

// Return codes: XPU_SUCCESS is 0 (XPU3_KERNEL_MODEL §1.2); XRE error codes start at 700.
enum XPUError_t { XPU_SUCCESS = 0 };

// Copy directions and memory kinds: names as documented; the numeric values here are placeholders.
enum XPUMemcpyKind { XPU_HOST_TO_DEVICE = 0, XPU_DEVICE_TO_HOST = 1, XPU_DEVICE_TO_DEVICE = 2 };
enum XPUMemoryKind { XPU_MEM_MAIN = 0, XPU_MEM_L3 = 1 };

// Device attributes that xpu_device_get_attr reports (values as documented).
enum XPUDeviceAttr { XPUATTR_MODEL = 4, XPUATTR_NUM_CLUSTER = 7 };

int xpu_device_get_attr(uint64_t* v, XPUDeviceAttr attr, int devid);
int xpu_get_runtime_version(uint32_t* major, uint32_t* minor);
int xpu_get_driver_version(uint32_t* major, uint32_t* minor);
int xpu_set_device(int devid);
int xpu_current_device(int* devid);
int xpu_device_count(int* dev_count);
int xpu_malloc(void** pdevptr, uint64_t sz, XPUMemoryKind kind = XPU_MEM_MAIN);
int xpu_free(void* devptr);
int xpu_memcpy(void* dst, const void* src, uint64_t sz, XPUMemcpyKind kind);
int xpu_wait(XPUStream stream = NULL);

}  // extern "C"
