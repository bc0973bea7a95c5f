# arm64 Linux from an x86-64 Debian machine: the cross compiler of g++-aarch64-linux-gnu, and
# programs (the configure step's kernel emitter, ctest's tests) run by qemu-user-static's
# emulator with the cross compiler's libraries. scripts/dev.sh cross arm64 configures with it.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static -L /usr/aarch64-linux-gnu)
