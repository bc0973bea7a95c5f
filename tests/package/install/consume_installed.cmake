# cmake -DPROJECT_BUILD=<dir> -DWORK=<dir> -DCONSUMER=<examples/consumer> -DMAKE_PROGRAM=<ninja>
#       [-DSHARED_FROM=<source dir> -DHALIDE_DIR=<dir> -DGPU_KERNELS=ON|OFF [-DCPU_ISA=<isa>]
#        [-DGPU_DTYPES=<MHA_GPU_DTYPES>]
#        [-DKERNELS_FROM=<host build whose kernels it copies (MHA_KERNELS_FROM)>]]
#       [-DTOOLCHAIN=<toolchain file> -DEMULATOR=<program|arguments> -DCXX=<compiler>]
#       -P consume_installed.cmake
# Installs the project (PROJECT_BUILD, or with SHARED_FROM a BUILD_SHARED_LIBS=ON build of that
# source tree made here), moves the installed tree elsewhere, then builds and runs
# examples/consumer against it twice: with find_package(mha) and with pkg-config alone. For a
# cross build's tree, the consumer is built with its toolchain file (and compiler) and run by
# its emulator ('|' between the emulator's words), and a build for the host is refused by name.
# With CPU_ISA, the shared build compiles that instruction set's kernels alone (MHA_CPU_ISAS):
# the consumer must run them, and, capped below them (MHA_CPU_ISA=sse41), fail with the reason.
function(run)
    execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE output
                    ERROR_VARIABLE output)
    if (NOT result EQUAL 0)
        string(REPLACE ";" " " command "${ARGN}")
        message(FATAL_ERROR "${command} failed (${result}):\n${output}")
    endif ()
    set(output "${output}" PARENT_SCOPE)
endfunction()

set(consumer_toolchain "")
if (DEFINED TOOLCHAIN)
    set(consumer_toolchain -DCMAKE_TOOLCHAIN_FILE=${TOOLCHAIN})
endif ()
string(REPLACE "|" ";" EMULATOR "${EMULATOR}")
if (NOT DEFINED CXX)
    set(CXX c++)
endif ()

file(REMOVE_RECURSE ${WORK})
if (DEFINED SHARED_FROM)
    set(PROJECT_BUILD ${WORK}/project)
    run(${CMAKE_COMMAND} -S ${SHARED_FROM} -B ${PROJECT_BUILD} -G Ninja
        -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM} -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON
        -DMHA_BUILD_TESTS=OFF -DMHA_BUILD_TOOLS=OFF -DMHA_BUILD_BENCHMARKS=OFF
        -DMHA_GPU_KERNELS=${GPU_KERNELS} -DHalide_DIR=${HALIDE_DIR} -DMHA_CPU_ISAS=${CPU_ISA}
        -DMHA_GPU_DTYPES=${GPU_DTYPES}
        -DMHA_KERNELS_FROM=${KERNELS_FROM})
    run(${CMAKE_COMMAND} --build ${PROJECT_BUILD})
endif ()
run(${CMAKE_COMMAND} --install ${PROJECT_BUILD} --prefix ${WORK}/installed)
# Relocatable: nothing in the tree may point back to where it was installed.
file(RENAME ${WORK}/installed ${WORK}/moved)
set(prefix ${WORK}/moved)
file(GLOB_RECURSE installed RELATIVE ${prefix} ${prefix}/*)
message(STATUS "installed: ${installed}")
foreach (file IN LISTS installed)
    if (file MATCHES "[Hh]alide|LLVM|python")
        message(FATAL_ERROR "the installed tree holds ${file}")
    endif ()
endforeach ()

# find_package(mha): the consumer sees only the moved tree (no Halide on any search path).
run(${CMAKE_COMMAND} -S ${CONSUMER} -B ${WORK}/consumer -G Ninja -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
    -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF ${consumer_toolchain})
run(${CMAKE_COMMAND} --build ${WORK}/consumer)
run(${EMULATOR} ${WORK}/consumer/consumer)
message(STATUS "consumer (find_package):\n${output}")
set(cmake_output "${output}")
if (DEFINED CPU_ISA)
    if (NOT output MATCHES "cpu \\(${CPU_ISA}\\)")
        message(FATAL_ERROR "a build of the ${CPU_ISA} kernels alone ran others:\n${output}")
    endif ()
    execute_process(COMMAND ${CMAKE_COMMAND} -E env MHA_CPU_ISA=sse41 ${WORK}/consumer/consumer
                    RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
    if (NOT result EQUAL 1 OR NOT output MATCHES "kernels are for ${CPU_ISA} .*none of which this CPU runs")
        message(FATAL_ERROR "capped below its kernels, the consumer did not fail with the "
                            "reason (${result}):\n${output}")
    endif ()
    message(STATUS "capped below its kernels (MHA_CPU_ISA=sse41):\n${output}")
endif ()

# pkg-config, from the moved tree's .pc files.
find_program(PKG_CONFIG pkg-config REQUIRED)
set(ENV{PKG_CONFIG_PATH} ${prefix}/lib/pkgconfig)
set(packages mha)
if (EXISTS ${prefix}/lib/pkgconfig/mha-opencl.pc)
    set(packages mha-opencl)
endif ()
run(${PKG_CONFIG} --cflags --libs ${packages})
string(STRIP "${output}" flags)
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${CXX} -std=c++17 -O1 ${CONSUMER}/main.cpp -o ${WORK}/pkgconfig_consumer ${flags}
    -Wl,-rpath,${prefix}/lib)
run(${EMULATOR} ${WORK}/pkgconfig_consumer)
message(STATUS "consumer (pkg-config ${packages}):\n${output}")
if (NOT output STREQUAL cmake_output)
    message(FATAL_ERROR "the two consumers disagree")
endif ()

run(readelf -d ${WORK}/consumer/consumer)
if (DEFINED SHARED_FROM AND NOT output MATCHES "libmha\\.so")
    message(FATAL_ERROR "a shared build's consumer does not load libmha.so:\n${output}")
elseif (NOT DEFINED SHARED_FROM AND output MATCHES "libmha")
    message(FATAL_ERROR "a static build's consumer loads a shared mha library:\n${output}")
endif ()

# A cross build's package, found by a build for the host, says whose kernels it holds.
if (DEFINED TOOLCHAIN)
    execute_process(COMMAND ${CMAKE_COMMAND} -S ${CONSUMER} -B ${WORK}/host_consumer -G Ninja
                            -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM} -DCMAKE_PREFIX_PATH=${prefix}
                    RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
    string(REGEX REPLACE "[ \n]+" " " output "${output}")  # CMake wraps the message
    if (result EQUAL 0 OR NOT output MATCHES "holds [a-z0-9-]+ kernels, but this build targets")
        message(FATAL_ERROR "a host build accepted the cross build's package (${result}):\n${output}")
    endif ()
    message(STATUS "a host build refuses it:\n${output}")
endif ()
