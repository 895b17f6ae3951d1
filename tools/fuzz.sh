#!/usr/bin/env bash
# Runs every libFuzzer target (fuzz/*_fuzz.cc, AddressSanitizer + UBSan,
# built by tools/sanitize.sh in build/asan) for SECONDS each (default 60),
# JOBS of them at a time (default: the CPU count), each on its committed
# seed corpus fuzz/corpus/<name>/ plus what earlier runs found
# (build/fuzz/<name>/, not committed). A crash, a sanitizer report, a
# failed check, a leak or a timeout fails the run; the input that caused it
# is saved as build/fuzz/<name>-crash-* (and printed), and
#   build/asan/fuzz/simdattn_fuzz_<name> <that file>
# replays it.
#
#   tools/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
JOBS=${JOBS:-$(nproc)}
targets=(npy attention c_api serving)

tools/sanitize.sh build asan > build/fuzz-build.log 2>&1 ||
  { mkdir -p build; cat build/fuzz-build.log; echo "== fuzz build FAILED"; exit 1; }

run_target() {  # name: runs it, its log in build/fuzz/<name>.log
  local name=$1
  mkdir -p "build/fuzz/$name"
  # -timeout: one input may take at most 10 s (the largest cases take
  # milliseconds); -max_len: the decoders read at most a few hundred bytes.
  ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "build/asan/fuzz/simdattn_fuzz_$name" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=4096 -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="build/fuzz/$name-" "build/fuzz/$name" "fuzz/corpus/$name" \
    > "build/fuzz/$name.log" 2>&1
}

status=0
pids=()
names=()
for name in "${targets[@]}"; do
  run_target "$name" &
  pids+=($!)
  names+=("$name")
  # At most JOBS at once: wait for the oldest.
  if [ ${#pids[@]} -ge "$JOBS" ]; then
    if ! wait "${pids[0]}"; then echo "fuzz ${names[0]}: FAILED"; status=1; fi
    pids=("${pids[@]:1}")
    names=("${names[@]:1}")
  fi
done
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then echo "fuzz ${names[$i]}: FAILED"; status=1; fi
done

for name in "${targets[@]}"; do
  log=build/fuzz/$name.log
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 || true)
  echo "fuzz $name: $runs inputs in ${seconds} s, $cov"
  if grep -q -E "ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error|FUZZ CHECK FAILED" "$log"; then
    grep -m 1 -A 30 -E "ERROR: |runtime error|FUZZ CHECK FAILED" "$log"
    ls build/fuzz/"$name"-* 2>/dev/null || true
    status=1
  fi
done
if [ $status -ne 0 ]; then echo "== fuzz FAILED"; else echo "== fuzz: every target clean"; fi
exit $status
