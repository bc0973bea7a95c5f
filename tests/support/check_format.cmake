# cmake -DSOURCE_DIR=<project> -P check_format.cmake: every C++ file of the project follows
# .clang-format.
find_program(CLANG_FORMAT NAMES clang-format clang-format-14 REQUIRED)
set(sources "")
foreach (dir IN ITEMS bench cli contract examples generators python reference runtime schedules tests
                    tuner)
    file(GLOB_RECURSE found ${SOURCE_DIR}/${dir}/*.cpp ${SOURCE_DIR}/${dir}/*.h)
    list(APPEND sources ${found})
endforeach ()
execute_process(COMMAND ${CLANG_FORMAT} --dry-run -Werror ${sources}
                RESULT_VARIABLE result ERROR_VARIABLE problems)
if (NOT result EQUAL 0)
    message(FATAL_ERROR "not formatted as .clang-format says (run clang-format -i on them):\n"
                        "${problems}")
endif ()
list(LENGTH sources count)
message(STATUS "${count} files follow .clang-format")
