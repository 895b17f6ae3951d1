# Cross build for aarch64 with Debian's multiarch packages; tests run under
# qemu-user (QEMU_CPU is set per test, never here: -cpu would override it).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Debian multiarch: find_package looks in /usr/lib/aarch64-linux-gnu/cmake.
# Re-rooting with CMAKE_FIND_ROOT_PATH instead makes hwy unfindable.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
# No -L /usr/aarch64-linux-gnu: that loader mixed with the multiarch libraries
# in /lib/aarch64-linux-gnu deadlocks at the first thread creation (qemu 7.2).
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
