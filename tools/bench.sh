#!/usr/bin/env bash
# Installs what is missing, builds simdattn (Release) and runs the headline
# benchmark: the fused kernel against a plain unfused loop implementation.
# Extra arguments go to simdattn_bench (e.g. --benchmark_filter=D128).
# Run it on an idle machine: no build or other benchmark at the same time.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/common.sh

ensure_packages "${NATIVE_PACKAGES[@]}" "${BENCH_PACKAGES[@]}"
cmake -S . -B build/bench -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DSIMDATTN_BUILD_TESTS=OFF -DSIMDATTN_BUILD_TOOLS=OFF -DSIMDATTN_BUILD_BENCH=ON
cmake --build build/bench --target simdattn_bench
echo "== CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
exec build/bench/simdattn_bench --benchmark_repetitions=3 \
     --benchmark_report_aggregates_only=true "$@"
