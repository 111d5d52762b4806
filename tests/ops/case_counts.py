"""Number of random parity cases (OPS §8 C1) per op and backend; the single knob for CI time."""

# C++ CPU path: about 1.5 ms per case with the reference, so the CPU parity run takes about 40 s (2 cores); twice
# the emulator's count, the CPU path being the one this machine serves with.
CPU_PARITY_CASES = 4000
# Kunlun3 kernel on the host emulator, per op and per cluster count (CI needs >= 2,000).
EMULATOR_PARITY_CASES = 2000
