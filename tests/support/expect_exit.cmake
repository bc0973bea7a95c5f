# cmake "-DCOMMAND=<program>;<arguments>" -DEXIT=<code> "-DOUTPUT=<regex>" -P expect_exit.cmake:
# passes when the command exits with exactly that code and its output (stdout and stderr)
# matches the regex. Spaces in the regex match any run of whitespace (messages may wrap).
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REPLACE " " "[ \t\r\n]+" pattern "${OUTPUT}")
if (NOT result STREQUAL "${EXIT}")
    message(FATAL_ERROR "exit code ${result}, expected ${EXIT}:\n${out}${err}")
endif ()
if (NOT "${out}${err}" MATCHES "${pattern}")
    message(FATAL_ERROR "output does not match '${OUTPUT}':\n${out}${err}")
endif ()
message(STATUS "exit ${result}: ${out}${err}")
