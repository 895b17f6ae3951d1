#!/usr/bin/env bash
# Installs what is missing, builds simdattn_bench (Release) and runs the
# headline comparison in one process: simdattn against oneDNN's unfused
# pipeline (matmul, softmax, matmul) for f32 prefill, bf16 prefill (B1 H8
# L2048 D128, with and without a causal mask) and decode (Lq 1 against a
# 16384-token KV cache), next to the FMA peak and the read bandwidth measured
# at the same thread counts. Each entry is the median of 3 repetitions, run
# in random order. About 2-3 minutes on 2 cores once built.
#
#   ./tools/bench.sh                  the headline comparison (simdattn_bench --headline)
#   ./tools/bench.sh --full           every entry (all shapes, options, paired; ~40 minutes)
#   ./tools/bench.sh --threads=1,8    other arguments go to simdattn_bench:
#                                     --threads=LIST|all, --verify, --benchmark_filter=...
#
# Prints simdattn_bench's summary, then the headline table; writes the table
# and a chart (one panel per kind, grouped by thread count; the headline
# cases, with --full too) to build/bench/results.{tsv,png}. Run it on an idle machine: no build or
# other benchmark at the same time.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/common.sh

selection=(--headline)
args=()
for arg in "$@"; do
  if [ "$arg" = --full ]; then selection=(); else args+=("$arg"); fi
done

ensure_packages "${NATIVE_PACKAGES[@]}" "${BENCH_PACKAGES[@]}" gnuplot-nox
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S . -B build/bench -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
      -DSIMDATTN_BUILD_TESTS=OFF -DSIMDATTN_BUILD_TOOLS=OFF -DSIMDATTN_BUILD_BENCH=ON
cmake --build build/bench --target simdattn_bench
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
echo "== CPU: $cpu"
tsv=build/bench/results.tsv
png=build/bench/results.png
rm -f "$tsv" "$png"
build/bench/simdattn_bench "${selection[@]}" --benchmark_repetitions=3 \
    --benchmark_enable_random_interleaving=true \
    --benchmark_report_aggregates_only=true \
    --table="$tsv" "${args[@]}"

# The panels present, in the file's order (gnuplot's index 0, 1, ...).
mapfile -t panels < <(awk -F'\t' '!/^#/ && NF { print $1 }' "$tsv" | uniq)
if [ ${#panels[@]} -eq 0 ]; then
  echo "== no headline entry ran: no table or chart"
  exit 0
fi

# One panel: bars for simdattn and oneDNN at x = row + a gap per thread
# group, each roofline a line across its group, values above the bars.
panel_plot() {
  local i=$1 kind=$2 shape=$3
  local x='($0 + 0.8 * column(-1))'
  local tic='xtic(strcol(4) . "\n" . strcol(3) . (strcol(3) eq "1" ? " thread" : " threads"))'
  local title ylabel roof bf16=""
  case "$kind" in
    f32) title="f32 prefill, $shape"; ylabel="GFLOP/s"; roof="f32 FMA peak" ;;
    bf16) title="bf16 prefill (Q, K, V, O in bf16), $shape"; ylabel="GFLOP/s"
          roof="f32 FMA peak"
          bf16=", '$tsv' index $i using ($x - 0.5):8:(1.0):(0) with vectors nohead lw 3 dt 2 lc rgb '#7b3294' title 'bf16 dot-product peak (vdpbf16ps)'" ;;
    *) title="decode, K+V read, $shape"; ylabel="GB/s"; roof="read bandwidth" ;;
  esac
  cat <<GNUPLOT
set title "$title"
set ylabel "$ylabel"
plot '$tsv' index $i using ($x - 0.2):5:(0.38):$tic with boxes lc rgb '#1b9e77' title 'simdattn', \\
     '' index $i using ($x + 0.2):6:(0.38) with boxes lc rgb '#d95f02' title 'oneDNN (matmul, softmax, matmul)', \\
     '' index $i using ($x - 0.5):7:(1.0):(0) with vectors nohead lw 3 lc rgb '#333333' title '$roof (same threads)'$bf16, \\
     '' index $i using ($x - 0.2):5:(sprintf('%.3g', \$5)) with labels offset 0,0.6 font ',8' notitle, \\
     '' index $i using ($x + 0.2):6:(sprintf('%.3g', \$6)) with labels offset 0,0.6 font ',8' notitle
GNUPLOT
}

{
  cat <<GNUPLOT
set terminal pngcairo size 1200,$((40 + 360 * ${#panels[@]})) noenhanced font ",10"
set output "$png"
set datafile separator "\t"
set datafile missing "-"
set style fill solid 0.85 border -1
set boxwidth 0.38 absolute
set grid ytics
set border 3
set xtics nomirror scale 0
set ytics nomirror
set yrange [0:*]
set offsets 0.6, 0.6, graph 0.1, 0
set key outside right top vertical Left reverse samplen 2 font ",9"
set tmargin 3
set bmargin 4
set lmargin at screen 0.07
set rmargin at screen 0.74
set multiplot layout ${#panels[@]},1 title "simdattn vs oneDNN (medians) on $cpu"
GNUPLOT
  for i in "${!panels[@]}"; do
    shape="$(awk -F'\t' -v p="${panels[$i]}" '!/^#/ && $1 == p { print $2; exit }' "$tsv" | tr _ ' ')"
    panel_plot "$i" "${panels[$i]}" "$shape"
  done
  echo "unset multiplot"
} | gnuplot

echo
echo "== headline table (prefill GFLOP/s, decode GB/s; rooflines of the same thread count)"
awk -F'\t' '
  function ratio(a, b) { return (a == "-" || b == "-" || b == 0) ? "" : sprintf("%.2fx", a / b) }
  function pct(a, b) { return (a == "-" || b == "-" || b == 0) ? "" : sprintf("%.0f%%", 100 * a / b) }
  function row(a, b, c, d, e, f, g, h, i,   line) {
    line = sprintf("%-7s %-8s %-8s %9s %9s %9s %9s %9s %9s", a, b, c, d, e, f, g, h, i)
    sub(/ +$/, "", line)
    print line
  }
  BEGIN { row("kind", "threads", "case", "simdattn", "oneDNN", "roofline", "vs oneDNN",
              "%roofline", "dot_bf16") }
  /^#/ || NF == 0 { next }
  { row($1, $3, $4, $5, $6, $7, ratio($5, $6), pct($5, $7), $8 == "-" ? "" : $8) }' "$tsv"
echo "== table: $tsv"
echo "== chart: $png"
