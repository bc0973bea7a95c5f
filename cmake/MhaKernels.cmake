# The forward kernels of the build, from the contract (contract/mha_contract.h) and the tuned
# schedule files (schedules/tuned/<isa>.<cpu>.json, one per instruction set and tuned CPU).
#
# At configure time contract/emit_kernels.cpp is compiled and run (${MHA_EMITTER}): it writes
# ${MHA_KERNELS_DIR}/kernels.cmake, one mha_kernel() row per kernel, and
# ${MHA_KERNELS_DIR}/<device>_kernels.cpp, the runtime's table of each device's kernels. A
# missing, malformed or mismatched tuned file stops the configure step with the emitter's
# message, which names the file.

set(MHA_KERNELS_DIR ${PROJECT_BINARY_DIR}/kernels)

# The code that decides what a CPU kernel computes and how, and the parameter space it is tuned
# in: tuned files record a hash of it, and the build warns when a tuned file was measured on
# other code. The hash is of the code with its comments and whitespace removed (docs/tuning.md):
# editing a comment or reformatting leaves the tuned files current; any other change stales them.
set(MHA_SCHEDULE_SOURCES
    ${PROJECT_SOURCE_DIR}/generators/mha_stages.h
    ${PROJECT_SOURCE_DIR}/generators/mha_attention.h
    ${PROJECT_SOURCE_DIR}/generators/mha_forward.h
    ${PROJECT_SOURCE_DIR}/generators/mha_generators.cpp
    ${PROJECT_SOURCE_DIR}/schedules/cpu_schedule.h
    ${PROJECT_SOURCE_DIR}/schedules/cpu_params.h)
include(${CMAKE_CURRENT_LIST_DIR}/MhaScheduleHash.cmake)
mha_schedule_hash(MHA_SCHEDULE_HASH ${MHA_SCHEDULE_SOURCES})

file(GLOB tuned_files CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/schedules/tuned/*.json)
set(MHA_EMITTER_SOURCES ${PROJECT_SOURCE_DIR}/contract/emit_kernels.cpp
                        ${PROJECT_SOURCE_DIR}/schedules/tuned_file.cpp)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             ${MHA_EMITTER_SOURCES} ${MHA_SCHEDULE_SOURCES} ${tuned_files}
             ${PROJECT_SOURCE_DIR}/contract/mha_contract.h
             ${PROJECT_SOURCE_DIR}/contract/mha_variants.h
             ${PROJECT_SOURCE_DIR}/contract/mha_arguments.h
             ${PROJECT_SOURCE_DIR}/schedules/tuned_file.h
             ${PROJECT_SOURCE_DIR}/cli/command_line.h)

file(MAKE_DIRECTORY ${MHA_KERNELS_DIR})
# The ASan tests run the kernels of one instruction set, compiled again with Halide's asan
# feature (each takes 2.8 times as long to compile as without): sse41's, which every x86-64
# machine has and whose one bucket serves every shape, so that every variant runs from half the
# kernels of a set tuned per bucket. What ASan checks in a kernel, its loads and stores against
# the buffers the runtime describes, does not depend on the schedule.
set(emit_options "")
if (MHA_SANITIZER_TESTS)
    list(APPEND emit_options --sanitizer-isa sse41)
endif ()
if (MHA_CPU_ISAS)
    string(REPLACE ";" "," cpu_isas "${MHA_CPU_ISAS}")
    list(APPEND emit_options --cpu-isas ${cpu_isas})
endif ()
if (MHA_KERNELS_FROM)
    list(APPEND emit_options --kernels-from ${MHA_KERNELS_FROM})
endif ()
if (MHA_GPU_DTYPES)
    string(REPLACE ";" "," gpu_dtypes "${MHA_GPU_DTYPES}")
    list(APPEND emit_options --gpu-dtypes ${gpu_dtypes})
endif ()
if (MHA_GPU_KERNELS)
    set(emit_gpu 1)
else ()
    set(emit_gpu 0)
endif ()
# The CPU architecture of the build's kernels: its compiler's.
include(${CMAKE_CURRENT_LIST_DIR}/MhaCpuArch.cmake)
mha_cpu_arch(MHA_CPU_ARCH)
if (NOT MHA_CPU_ARCH)
    message(FATAL_ERROR "no CPU kernels are made for ${CMAKE_SYSTEM_PROCESSOR} "
                        "(contract/mha_contract.h, kCpuArches: x86-64 and arm64)")
endif ()
# Compiled once, here, with the build's compiler (a cross build runs it under its
# CMAKE_CROSSCOMPILING_EMULATOR); the tests run the same executable.
set(MHA_EMITTER ${PROJECT_BINARY_DIR}/emit_kernels)
try_compile(emit_compiled
            SOURCES ${MHA_EMITTER_SOURCES}
            CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${PROJECT_SOURCE_DIR}/contract;${PROJECT_SOURCE_DIR}/schedules;${PROJECT_SOURCE_DIR}/runtime/include;${PROJECT_SOURCE_DIR}/cli"
            LINK_LIBRARIES nlohmann_json::nlohmann_json CLI11::CLI11
            CXX_STANDARD 17
            CXX_STANDARD_REQUIRED ON
            OUTPUT_VARIABLE emit_compile_output
            COPY_FILE ${MHA_EMITTER})
if (NOT emit_compiled)
    message(FATAL_ERROR "contract/emit_kernels.cpp does not compile:\n${emit_compile_output}")
endif ()
execute_process(COMMAND ${CMAKE_CROSSCOMPILING_EMULATOR} ${MHA_EMITTER} --arch ${MHA_CPU_ARCH}
                        ${emit_options}
                        --tuned-dir ${PROJECT_SOURCE_DIR}/schedules/tuned
                        --schedule-hash ${MHA_SCHEDULE_HASH} --gpu ${emit_gpu}
                        --out-dir ${MHA_KERNELS_DIR}
                RESULT_VARIABLE emit_result OUTPUT_VARIABLE emit_output ERROR_VARIABLE emit_output)
if (NOT emit_result EQUAL 0)
    message(FATAL_ERROR "${emit_output}")
endif ()
string(REGEX MATCHALL "warning: [^\n]*" emit_warnings "${emit_output}")
foreach (warning IN LISTS emit_warnings)
    message(WARNING "${warning}")
endforeach ()

# For the ASan tests and the fuzzer, a CPU kernel with Halide's asan feature: the same function,
# its loads and stores checked by AddressSanitizer.
function(mha_sanitized_kernel name generator target params)
    add_halide_library(${name}_asan FROM mha_generators
                       GENERATOR ${generator}
                       FUNCTION_NAME ${name}
                       TARGETS ${target}-asan
                       PARAMS ${params}
                       USE_RUNTIME mha_halide_runtime_asan
                       FUNCTION_INFO_HEADER function_info_header)
    set_property(GLOBAL APPEND PROPERTY MHA_cpu_asan_KERNELS ${name}_asan)
endfunction()

# A kernel as another build made it (MHA_KERNELS_FROM): its object and headers copied from `dir`
# into the target that add_halide_library makes.
function(mha_copied_kernel name dir)
    set(files ${name}.o ${name}.h ${name}.function_info.h)
    list(TRANSFORM files PREPEND ${dir}/ OUTPUT_VARIABLE sources)
    list(TRANSFORM files PREPEND ${CMAKE_CURRENT_BINARY_DIR}/)
    add_custom_command(OUTPUT ${files}
                       COMMAND ${CMAKE_COMMAND} -E copy ${sources} ${CMAKE_CURRENT_BINARY_DIR}
                       DEPENDS ${sources} VERBATIM)
    add_library(${name} STATIC ${CMAKE_CURRENT_BINARY_DIR}/${name}.o)
    set_target_properties(${name} PROPERTIES LINKER_LANGUAGE CXX)
    target_link_libraries(${name} INTERFACE mha_halide_runtime)
    target_sources(${name} INTERFACE FILE_SET HEADERS BASE_DIRS ${CMAKE_CURRENT_BINARY_DIR}
                   FILES ${CMAKE_CURRENT_BINARY_DIR}/${name}.h)
endfunction()

# mha_kernel(<name> DEVICE <device> GENERATOR <generator> TARGET <halide target>
#            PARAMS <generator params> [SANITIZED | SANITIZED_ONLY] [FROM_BUILD <dir>]): one row
# of kernels.cmake. Called in the directory that links the kernels into the libraries.
function(mha_kernel name)
    cmake_parse_arguments(PARSE_ARGV 1 ARG "SANITIZED;SANITIZED_ONLY"
                          "DEVICE;GENERATOR;TARGET;FROM_BUILD" "PARAMS")
    if (ARG_SANITIZED_ONLY)  # an instruction set the library leaves out (MHA_CPU_ISAS)
        mha_sanitized_kernel(${name} ${ARG_GENERATOR} ${ARG_TARGET} "${ARG_PARAMS}")
        return()
    endif ()
    if (ARG_FROM_BUILD)
        mha_copied_kernel(${name} ${ARG_FROM_BUILD})
    else ()
        add_halide_library(${name} FROM mha_generators
                           GENERATOR ${ARG_GENERATOR}
                           TARGETS ${ARG_TARGET}
                           PARAMS ${ARG_PARAMS}
                           USE_RUNTIME mha_halide_runtime
                           FUNCTION_INFO_HEADER function_info_header)
    endif ()
    set_property(GLOBAL APPEND PROPERTY MHA_${ARG_DEVICE}_KERNELS ${name})
    if (ARG_SANITIZED)
        mha_sanitized_kernel(${name} ${ARG_GENERATOR} ${ARG_TARGET} "${ARG_PARAMS}")
    endif ()
    # `cmake --build <build> --target <name>.stmt` (scripts/dev.sh stmt <name>): Halide's HTML
    # statement view and the assembly of this kernel, as the build compiles it.
    set(views ${PROJECT_BINARY_DIR}/kernel_views/${name})
    add_custom_target(${name}.stmt
                      COMMAND ${CMAKE_COMMAND} -E make_directory ${views}
                      COMMAND mha_generators -g ${ARG_GENERATOR} -f ${name} -o ${views}
                              -e stmt_html,assembly target=${ARG_TARGET} ${ARG_PARAMS}
                      COMMAND ${CMAKE_COMMAND} -E echo "${name}: ${views}/${name}.stmt.html"
                      COMMAND ${CMAKE_COMMAND} -E echo "${name}: ${views}/${name}.s"
                      VERBATIM)
endfunction()
