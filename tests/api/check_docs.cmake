# cmake -DROOT=<source dir> -DWORK=<dir> -DPYTHON=<python3> -DMHA=<mha> "-DPROGRAMS=<a;b;...>"
#       -P check_docs.cmake: what the programs say they have (mha --list-kernels, each --help),
# then check_docs.py on the README, docs/ and bench/RESULTS.md against it.
file(MAKE_DIRECTORY ${WORK})
execute_process(COMMAND ${MHA} --list-kernels OUTPUT_FILE ${WORK}/kernels.txt
                COMMAND_ERROR_IS_FATAL ANY)
set(helps "")
foreach (program IN LISTS PROGRAMS)
    get_filename_component(name ${program} NAME)
    execute_process(COMMAND ${program} --help OUTPUT_FILE ${WORK}/${name}.help.txt
                    COMMAND_ERROR_IS_FATAL ANY)
    list(APPEND helps ${WORK}/${name}.help.txt)
endforeach ()
execute_process(COMMAND ${PYTHON} ${CMAKE_CURRENT_LIST_DIR}/check_docs.py --root ${ROOT}
                        --kernels ${WORK}/kernels.txt --help-text ${helps}
                RESULT_VARIABLE result)
if (NOT result EQUAL 0)
    message(FATAL_ERROR "the docs quote what does not exist (above)")
endif ()
