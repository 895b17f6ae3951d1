#!/usr/bin/env bash
# Installs what is missing, builds simdattn (Release) and runs the headline
# benchmark in one process: the fused kernel, the unfused oneDNN pipeline, a
# plain loop, and the machine's FMA peak and read bandwidth. Prints a table
# and writes it with a chart to build/bench/results.{tsv,png}.
# Extra arguments go to simdattn_bench (e.g. --benchmark_filter=D128, --verify).
# Run it on an idle machine: no build or other benchmark at the same time.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/common.sh

ensure_packages "${NATIVE_PACKAGES[@]}" "${BENCH_PACKAGES[@]}" gnuplot-nox
cmake -S . -B build/bench -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DSIMDATTN_BUILD_TESTS=OFF -DSIMDATTN_BUILD_TOOLS=OFF -DSIMDATTN_BUILD_BENCH=ON
cmake --build build/bench --target simdattn_bench
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
echo "== CPU: $cpu"
# The repetitions of all entries run in random order, so that each median
# (and the roofline it is divided by) spans the whole run rather than one
# stretch of it: on a shared machine the speed drifts over minutes.
build/bench/simdattn_bench --benchmark_repetitions=3 \
    --benchmark_enable_random_interleaving=true \
    --benchmark_report_aggregates_only=true \
    --table=build/bench/results.tsv "$@"

gnuplot <<GNUPLOT
set terminal pngcairo size 1400,700 noenhanced font ",10"
set output "build/bench/results.png"
set title "simdattn vs oneDNN (f32, medians of 3) on $cpu"
set ylabel "GFLOP/s"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set xtics rotate by -30 left
set bmargin 12
set key top left
set grid ytics
set datafile separator "\t"
plot "build/bench/results.tsv" skip 1 using 2:xtic(1) title "simdattn", \
     "" skip 1 using 3 title "oneDNN (matmul, softmax, matmul)", \
     "" skip 1 using 0:5 with points pt 7 ps 1.5 title "FMA roofline (same threads)"
GNUPLOT
echo "== table: build/bench/results.tsv, chart: build/bench/results.png"
