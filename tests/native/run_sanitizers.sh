#!/usr/bin/env bash
# Builds the native test drivers with AddressSanitizer+UBSan and with ThreadSanitizer, runs them, and requires zero
# sanitizer reports (OPS §8 C4, XPU3_KERNEL_MODEL §12.1):
#   kl3_native_tests_{asan,tsan}   every emulated kernel (1, 2, 12 clusters) vs every CPU path, guard bands
#   kl3_toy_kernels_{asan,tsan}    broken toy kernels: the emulator must flag each one, without a sanitizer report
# Prints a summary; exits nonzero on any sanitizer report, parity failure or unflagged toy.
# Environment: KL3_SANITIZER_BUILD_DIR (default <repo>/native-build-sanitizers), KL3_ASAN_CASES (default 500),
# KL3_TSAN_CASES (default 100): CI time (the build is most of the run; the parity suite runs many more cases).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${KL3_SANITIZER_BUILD_DIR:-$ROOT/native-build-sanitizers}"
ASAN_CASES="${KL3_ASAN_CASES:-500}"
TSAN_CASES="${KL3_TSAN_CASES:-100}"
LOGS="$BUILD/logs"

# Toys the emulator itself must flag (launch failure or wrong result), under every instrumentation.
TOYS="missing_barrier exited_cores_barrier branch_barrier out_of_bounds_dma async_read_before_fence
      async_pending_at_exit shared_read_before_write shared_over_budget local_over_budget slow_core_barrier"

export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:exitcode=66:detect_stack_use_after_return=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=66"
export TSAN_OPTIONS="halt_on_error=0:exitcode=66:second_deadlock_stack=1"

failures=0
summary=()

note() {
  summary+=("$1")
  echo "$1"
}

# A sanitizer report in a log file, whatever the exit code.
has_report() {
  grep -qE "ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|WARNING: ThreadSanitizer|ERROR: ThreadSanitizer" "$1"
}

echo "== configure + build ($BUILD, -j2)"
mkdir -p "$LOGS"
if ! cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$LOGS/configure.log" 2>&1; then
  cat "$LOGS/configure.log"
  echo "SANITIZERS: FAILED (configure)"
  exit 1
fi
if ! cmake --build "$BUILD" -j2 --target kl3_native_tests_asan kl3_toy_kernels_asan kl3_native_tests_tsan \
    kl3_toy_kernels_tsan >"$LOGS/build.log" 2>&1; then
  tail -n 40 "$LOGS/build.log"
  echo "SANITIZERS: FAILED (build)"
  exit 1
fi

for san in asan tsan; do
  cases="$ASAN_CASES"
  [ "$san" = tsan ] && cases="$TSAN_CASES"
  log="$LOGS/parity_$san.log"
  "$BUILD/kl3_native_tests_$san" --cases "$cases" >"$log" 2>&1
  rc=$?
  if has_report "$log"; then
    note "FAIL  $san parity: sanitizer report (see $log)"
    failures=$((failures + 1))
  elif [ $rc -ne 0 ]; then
    note "FAIL  $san parity: exit $rc ($(grep -m1 FAIL "$log"))"
    failures=$((failures + 1))
  else
    note "ok    $san parity: $cases cases per op, CPU path == kernel at 1/2/12 clusters, clean"
  fi

  for toy in $TOYS; do
    # Under TSan the missing barrier is a genuine data race that ThreadSanitizer reports by design;
    # test_emulator_detectors.py checks that report. Here every run must stay free of reports.
    [ "$san" = tsan ] && [ "$toy" = missing_barrier ] && continue
    log="$LOGS/toy_${san}_$toy.log"
    "$BUILD/kl3_toy_kernels_$san" "$toy" >"$log" 2>&1
    rc=$?
    if has_report "$log"; then
      note "FAIL  $san toy $toy: sanitizer report (see $log)"
      failures=$((failures + 1))
    elif [ $rc -eq 1 ] && grep -q '^FLAGGED' "$log"; then
      note "ok    $san toy $toy: flagged by the emulator"
    else
      note "FAIL  $san toy $toy: not flagged (exit $rc)"
      failures=$((failures + 1))
    fi
  done
done

echo
echo "== summary"
printf '%s\n' "${summary[@]}"
if [ $failures -ne 0 ]; then
  echo "SANITIZERS: FAILED ($failures problems)"
  exit 1
fi
echo "SANITIZERS: OK (zero reports)"
