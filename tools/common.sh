# Shared by tools/test.sh and tools/bench.sh: package installation (Debian 12).

# Runs a command as root (directly, or through sudo).
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Installs the given Debian packages that are not installed yet.
ensure_packages() {
  local missing=()
  for pkg in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$pkg")
    fi
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing: ${missing[*]}"
    as_root apt-get update -q
    # --no-install-recommends: qemu-user recommends qemu-user-binfmt, which
    # conflicts with qemu-user-static.
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
}

# Enables arm64 packages next to the native ones (Debian multiarch).
ensure_arm64_arch() {
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    as_root dpkg --add-architecture arm64
    as_root apt-get update -q
  fi
}

NATIVE_PACKAGES=(g++ cmake ninja-build pkg-config libhwy-dev libgtest-dev
                 libbenchmark-dev libcli11-dev)
# MPI for examples/context_parallel.cc (built where CMake finds MPI).
MPI_PACKAGES=(libopenmpi-dev openmpi-bin)
BENCH_PACKAGES=(libdnnl-dev)  # bench.sh adds gnuplot-nox for its chart
# Sanitizer and fuzz builds (tools/sanitize.sh, tools/fuzz.sh): clang with
# its sanitizer and libFuzzer runtimes (libclang-rt; clang only recommends
# it), and llvm-symbolizer (package llvm) for readable reports.
SANITIZER_PACKAGES=(clang libclang-rt-14-dev llvm)
# The Python package and its tests (Debian's Python, not another one on PATH).
PYTHON_PACKAGES=(python3-dev pybind11-dev python3-numpy python3-pytest python3-torch)
PYTHON=/usr/bin/python3
# tools/npz.cc (`simdattn mha --weights W.npz`, deflated members).
NATIVE_PACKAGES+=(zlib1g-dev)
