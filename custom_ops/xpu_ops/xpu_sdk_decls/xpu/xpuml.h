// Included by Paddle's enforce_xpu.h (XPU management library); the project uses none of its names.
// Compile-check declarations only (../DECLARATIONS.md).
#pragma once
