#!/usr/bin/env bash
# Builds and runs the test suite under sanitizers: AddressSanitizer with
# UBSan (build/asan, which also holds the libFuzzer targets of
# tools/fuzz.sh) and ThreadSanitizer (build/tsan). Both are clang, -O1 -g,
# x86-64 with the kernels compiled for AVX2 and SCALAR only
# (SIMDATTN_REDUCED_TARGETS: the instrumented kernel TU for all eight x86
# targets takes too long for CI), and run the quick shape set
# (SIMDATTN_TEST_QUICK=1) on AVX2 and SCALAR. No suppressions: a report
# anywhere fails the run.
#
#   tools/sanitize.sh            configure, build and test both
#   tools/sanitize.sh build      configure and build both (tools/test.sh
#                                runs this next to the other builds)
#   tools/sanitize.sh build asan only build/asan (tools/fuzz.sh)
#   tools/sanitize.sh test       run both suites (after a build)
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/common.sh

JOBS=${JOBS:-$(nproc)}
what=${1:-all}
trees=${2:-asan tsan}

# The test binary simdattn_alloc_test is left out: it replaces malloc,
# which the sanitizers intercept themselves.
configure_and_build() {  # dir, sanitizers, extra cmake args...
  local dir=$1 sanitizers=$2
  shift 2
  local launcher=()
  if command -v ccache > /dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}" \
        -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" \
        -DSIMDATTN_SANITIZE="$sanitizers" -DSIMDATTN_REDUCED_TARGETS=ON \
        -DSIMDATTN_BUILD_MPI_EXAMPLE=OFF "$@" > "$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; return 1; }
  cmake --build "$dir" -j "$JOBS" --target simdattn_tests \
        $( [ "$sanitizers" = thread ] || echo simdattn_fuzz_npy simdattn_fuzz_attention \
           simdattn_fuzz_c_api simdattn_fuzz_serving )
}

run_suite() {  # name, binary, environment...
  local name=$1 binary=$2
  shift 2
  echo "== $name: simdattn_tests (quick shapes, AVX2 and SCALAR)"
  local start=$SECONDS
  if env SIMDATTN_TEST_QUICK=1 SIMDATTN_TEST_TARGETS="AVX2 SCALAR" "$@" \
       "$binary" --gtest_brief=1 > "$binary.log" 2>&1; then
    tail -n 3 "$binary.log"
    echo "$name: passed in $((SECONDS - start)) s"
  else
    tail -n 60 "$binary.log"
    echo "$name: FAILED (full log: $binary.log)"
    return 1
  fi
}

if [ "$what" = all ] || [ "$what" = build ]; then
  ensure_packages "${NATIVE_PACKAGES[@]}" "${SANITIZER_PACKAGES[@]}"
  mkdir -p build
  if [[ $trees == *asan* ]]; then
    configure_and_build build/asan address,undefined -DSIMDATTN_BUILD_FUZZ=ON
  fi
  if [[ $trees == *tsan* ]]; then
    configure_and_build build/tsan thread -DSIMDATTN_BUILD_TOOLS=OFF
  fi
fi
if [ "$what" = all ] || [ "$what" = test ]; then
  status=0
  run_suite "ASan+UBSan" build/asan/tests/simdattn_tests \
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 || status=1
  run_suite "TSan" build/tsan/tests/simdattn_tests \
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 || status=1
  exit $status
fi
