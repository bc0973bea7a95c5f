# mha_cpu_arch(<variable>): the contract's name (kCpuArches: x86-64, arm64) of the architecture
# CMake compiles for (a cross build's toolchain file sets CMAKE_SYSTEM_PROCESSOR), or "" for one
# that has no CPU kernels. The build and the installed package (mhaConfig.cmake) both read it.
function(mha_cpu_arch variable)
    if (CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64)$")
        set(${variable} x86-64 PARENT_SCOPE)
    elseif (CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64)$")
        set(${variable} arm64 PARENT_SCOPE)
    else ()
        set(${variable} "" PARENT_SCOPE)
    endif ()
endfunction()
