"""Number of random parity cases (OPS §8 C1) per op and backend; the single knob for CI time."""

# C++ CPU path: keeps the default CPU run of the parity tests around a minute on a 2-core machine.
CPU_PARITY_CASES = 600
# Kunlun3 kernel on the host emulator, per op and per cluster count (CI needs >= 2,000).
EMULATOR_PARITY_CASES = 2000
