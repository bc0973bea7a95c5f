# mha_project_warnings(<target>...): the warnings the project's own code is kept clean of.
function(mha_project_warnings)
    foreach (target IN LISTS ARGN)
        target_compile_options(${target} PRIVATE -Wall -Wextra
                               $<$<BOOL:${MHA_WARNINGS_AS_ERRORS}>:-Werror>)
    endforeach ()
endfunction()

# mha_quick_compile(<target>...): code whose own speed does not matter (command lines, tests,
# generators, tuner I/O; the kernels it runs are compiled elsewhere) is optimized less, which
# roughly halves the time CLI11, nlohmann-json and GoogleTest take to compile. Comes after
# CMAKE_CXX_FLAGS_<CONFIG> on the command line, so it wins over Release's -O3.
function(mha_quick_compile)
    foreach (target IN LISTS ARGN)
        target_compile_options(${target} PRIVATE -O1)
    endforeach ()
endfunction()
