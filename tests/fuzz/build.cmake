# cmake -DSOURCE=<tests/fuzz> -DBUILD=<dir> -DINPUTS=<inputs.cmake> -DCXX=<clang++>
#       -DMAKE_PROGRAM=<ninja> -DCORPUS=<dir> -P build.cmake
# Configures (once) and builds the fuzzer (tests/fuzz/CMakeLists.txt), and empties CORPUS, the
# directory a run adds its new inputs to (the committed seed corpus stays as it is).
function(run)
    execute_process(COMMAND ${ARGN} RESULT_VARIABLE result)
    if (NOT result EQUAL 0)
        string(REPLACE ";" " " command "${ARGN}")
        message(FATAL_ERROR "${command} failed (${result})")
    endif ()
endfunction()

if (NOT EXISTS ${BUILD}/build.ninja)
    run(${CMAKE_COMMAND} -S ${SOURCE} -B ${BUILD} -G Ninja -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}
        -DCMAKE_CXX_COMPILER=${CXX} -DMHA_FUZZ_INPUTS=${INPUTS})
endif ()
run(${CMAKE_COMMAND} --build ${BUILD})
file(REMOVE_RECURSE ${CORPUS})
file(MAKE_DIRECTORY ${CORPUS})
