#!/usr/bin/env bash
# Installs what is missing, builds simdattn for x86-64 and aarch64, and runs
# every test: natively on each x86 target this CPU has (C++, C and the
# Python package's pytest suite; the MPI example on 2 ranks), under
# qemu-user for NEON, SVE (512, 256 bit) and SVE2 (128, 256, 512 bit),
# against the installed package, under ASan+UBSan and TSan
# (tools/sanitize.sh), and each libFuzzer target for 20 s (tools/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/common.sh

JOBS=${JOBS:-$(nproc)}
ensure_packages "${NATIVE_PACKAGES[@]}" "${MPI_PACKAGES[@]}" "${BENCH_PACKAGES[@]}" \
                "${PYTHON_PACKAGES[@]}" "${SANITIZER_PACKAGES[@]}"
ensure_arm64_arch
ensure_packages g++-aarch64-linux-gnu qemu-user libhwy-dev:arm64 libgtest-dev:arm64

# The x86 targets this CPU can run, from its own flags (not from Highway), so
# a target the library fails to detect or run is a test failure. (Linux
# spells VBMI "avx512vbmi" but VBMI2 "avx512_vbmi2".)
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
expect=""
has avx512f avx512vl avx512dq avx512bw amx_tile amx_bf16 && expect+=" AVX3_AMX"
has avx512f avx512vl avx512dq avx512bw avx512_bf16 && expect+=" AVX3_BF16"
has avx512f avx512vl avx512dq avx512bw avx512_vnni avx512vbmi avx512_vbmi2 \
    vaes vpclmulqdq avx512_bitalg avx512_vpopcntdq && expect+=" AVX3_DL"
has avx512f avx512vl avx512dq avx512bw && expect+=" AVX3"
has avx2 bmi1 bmi2 fma f16c && expect+=" AVX2"
has sse4_1 sse4_2 pclmulqdq aes && expect+=" SSE4"
has ssse3 && expect+=" SSSE3"
expect+=" SCALAR"
echo "== x86 targets this CPU must run:$expect"

echo "== configure x86-64 and aarch64"
cmake -S . -B build/x86 -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DSIMDATTN_EXPECT_TARGETS="${expect# }" -DSIMDATTN_BUILD_BENCH=ON \
      -DSIMDATTN_BUILD_PYTHON=ON -DPython3_EXECUTABLE="$PYTHON"
cmake -S . -B build/arm64 -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
      -DSIMDATTN_BUILD_TOOLS=OFF -DSIMDATTN_BUILD_BENCH=OFF

# Side by side: each build waits minutes on one translation unit (the
# kernels, compiled once per target), so one alone leaves a core idle. The
# sanitizer trees (tools/sanitize.sh: clang, AVX2 and SCALAR only) join them.
echo "== x86-64, aarch64 and sanitizer builds (logs: build/arm64-build.log, build/sanitize-build.log)"
cmake --build build/arm64 -j "$JOBS" > build/arm64-build.log 2>&1 &
arm_build=$!
tools/sanitize.sh build > build/sanitize-build.log 2>&1 &
sanitize_build=$!
x86_failed=0
cmake --build build/x86 -j "$JOBS" || x86_failed=1
arm_failed=0
wait "$arm_build" || arm_failed=1
sanitize_failed=0
wait "$sanitize_build" || sanitize_failed=1
if [ $arm_failed -ne 0 ]; then cat build/arm64-build.log; fi
if [ $sanitize_failed -ne 0 ]; then tail -n 80 build/sanitize-build.log; fi
if [ $x86_failed -ne 0 ] || [ $arm_failed -ne 0 ] || [ $sanitize_failed -ne 0 ]; then
  echo "== build FAILED"; exit 1
fi
tail -n 1 build/arm64-build.log

status=0
echo "== x86-64 tests"
ctest --test-dir build/x86 --output-on-failure -j "$JOBS" || status=1
grep -h "targets run" build/x86/Testing/Temporary/LastTest.log || status=1

# Where the CPU has AMX, the suite above ran AVX3_AMX on the tiles; the
# emulator that stands in for them elsewhere runs here too.
if [[ $expect == *AVX3_AMX* ]]; then
  echo "== x86-64 tests: AVX3_AMX on the tile emulator"
  SIMDATTN_TEST_AMX_EMULATION=1 SIMDATTN_TEST_TARGETS=AVX3_AMX \
    build/x86/tests/simdattn_tests --gtest_brief=1 || status=1
fi

# Context parallelism: 2 ranks on this machine, shared memory only (btl
# self,vader, no network); vader's single-copy (CMA) needs ptrace rights
# that containers often lack, so it copies through the shared segment.
echo "== x86-64: examples/context_parallel.cc under mpirun -n 2"
mpi_flags=(--oversubscribe --mca btl self,vader)
if [ "$(id -u)" -eq 0 ]; then mpi_flags+=(--allow-run-as-root); fi
if [ -x build/x86/simdattn_context_parallel ]; then
  OMPI_MCA_btl_vader_single_copy_mechanism=none \
    mpirun -n 2 "${mpi_flags[@]}" build/x86/simdattn_context_parallel || status=1
else
  echo "build/x86/simdattn_context_parallel was not built (CMake found no MPI)"
  status=1
fi

echo "== aarch64 tests (qemu-user)"
ctest --test-dir build/arm64 --output-on-failure -j "$JOBS" || status=1
grep -h "targets run" build/arm64/Testing/Temporary/LastTest.log || status=1

echo "== sanitizers (tools/sanitize.sh test)"
tools/sanitize.sh test || status=1

echo "== fuzz (tools/fuzz.sh 20): every target 20 s"
tools/fuzz.sh 20 || status=1

echo "== installed package: find_package(simdattn) and pkg-config, C++ and C"
rm -rf build/prefix build/consumer build/consumer-c
cmake --install build/x86 --prefix "$PWD/build/prefix" > /dev/null
mkdir -p build/consumer build/consumer-c
package_passed=0
package_failed=0
package_check() {  # name, command...
  local name=$1; shift
  if "$@" > build/package-check.log 2>&1; then
    package_passed=$((package_passed + 1))
  else
    echo "package: $name FAILED"; cat build/package-check.log
    package_failed=$((package_failed + 1))
  fi
}
package_check "C++ consumer (CMake)" bash -c "
  cmake -S tests/package -B build/consumer -G Ninja -DCMAKE_PREFIX_PATH=$PWD/build/prefix &&
  cmake --build build/consumer && build/consumer/consumer"
package_check "C++ consumer (pkg-config)" bash -c "
  g++ -std=c++17 tests/package/consumer.cc -o build/consumer/consumer_pc \
      \$(PKG_CONFIG_PATH=$PWD/build/prefix/lib/pkgconfig pkg-config --cflags --libs --static simdattn) &&
  build/consumer/consumer_pc"
package_check "C example (CMake, a C-only project)" bash -c "
  cmake -S tests/package/c -B build/consumer-c -G Ninja -DCMAKE_PREFIX_PATH=$PWD/build/prefix &&
  cmake --build build/consumer-c && build/consumer-c/decode_c"
package_check "C example (pkg-config, gcc -std=c99 -pedantic -Werror)" bash -c "
  gcc -std=c99 -pedantic -Wall -Wextra -Werror examples/decode.c -o build/consumer-c/decode_pc \
      \$(PKG_CONFIG_PATH=$PWD/build/prefix/lib/pkgconfig pkg-config --cflags --libs --static simdattn) &&
  build/consumer-c/decode_pc"
package_check "Python package (cmake --install), its pytest suite" bash -c "
  site=\$(dirname \$(dirname \$(find $PWD/build/prefix -path '*/simdattn/__init__.py'))) &&
  cd build && PYTHONPATH=\$site SIMDATTN_EXPECT_TARGETS='${expect# }' \
      $PYTHON -m pytest -q -p no:cacheprovider ../python/tests"
echo "package: $package_passed passed, $package_failed failed"
[ $package_failed -eq 0 ] || status=1

if [ $status -ne 0 ]; then echo "== FAILED"; else echo "== all tests passed"; fi
exit $status
