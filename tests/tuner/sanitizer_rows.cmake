# cmake "-DCOMMAND=<emit_kernels>;<arguments>" -DOUT_DIR=<its --out-dir> -DISA=<--sanitizer-isa>
#       -DLIBRARY_ISA=<the one --cpu-isas set> -P sanitizer_rows.cmake
# The sanitizer tests' instruction set, left out of the library: its kernels are rows compiled
# with asan alone (SANITIZED_ONLY) and are in the ASan table only; the library's table holds
# the selected set alone.
file(REMOVE_RECURSE ${OUT_DIR})
file(MAKE_DIRECTORY ${OUT_DIR})
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
if (NOT result EQUAL 0)
    message(FATAL_ERROR "the emitter failed (${result}):\n${out}")
endif ()
# A row is two lines: its name, then its parameters and marks.
file(STRINGS ${OUT_DIR}/kernels.cmake rows REGEX "^mha_kernel\\(mha_[a-z_]+_cpu_${ISA}_")
file(STRINGS ${OUT_DIR}/kernels.cmake sanitized_only REGEX " SANITIZED_ONLY\\)$")
list(LENGTH rows row_count)
list(LENGTH sanitized_only sanitized_only_count)
file(READ ${OUT_DIR}/cpu_kernels.cpp library_table)
file(READ ${OUT_DIR}/cpu_sanitizer_kernels.cpp sanitizer_table)
file(READ ${OUT_DIR}/kernels.cmake all_rows)
# With one instruction set in the library, the sanitizer's are the only rows marked.
if (row_count EQUAL 0 OR NOT row_count EQUAL sanitized_only_count
    OR all_rows MATCHES " SANITIZED\\)")
    message(FATAL_ERROR "${sanitized_only_count} rows are SANITIZED_ONLY, for ${row_count} "
                        "${ISA} rows:\n${all_rows}")
endif ()
if (library_table MATCHES "_cpu_${ISA}_" OR NOT library_table MATCHES "_cpu_${LIBRARY_ISA}_")
    message(FATAL_ERROR "the library's table is not ${LIBRARY_ISA}'s alone:\n${library_table}")
endif ()
if (NOT sanitizer_table MATCHES "_cpu_${ISA}_" OR sanitizer_table MATCHES "_cpu_${LIBRARY_ISA}_")
    message(FATAL_ERROR "the ASan table is not ${ISA}'s alone:\n${sanitizer_table}")
endif ()
message(STATUS "${row_count} ${ISA} rows, all SANITIZED_ONLY; the library's table: ${LIBRARY_ISA}")
