# cmake -DSOURCE=<a schedule source> -DWORK=<dir> -P schedule_hash.cmake: the tuned files' stamp
# (cmake/MhaScheduleHash.cmake) stays the same when comments and whitespace change, and changes
# with the code.
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/MhaScheduleHash.cmake)
file(READ ${SOURCE} original)
file(MAKE_DIRECTORY ${WORK})
# The same code commented and laid out otherwise.
string(REPLACE "\n" "  // a comment added to every line\n\n" commented "${original}")
file(WRITE ${WORK}/commented.h "/// a header comment\n${commented}")
# The same comments, one number of the code changed.
string(REGEX REPLACE "([^0-9/])([0-9]+)([^0-9])" "\\1\\21\\3" changed "${original}")
file(WRITE ${WORK}/changed.h "${changed}")
mha_schedule_hash(as_is ${SOURCE})
mha_schedule_hash(with_comments ${WORK}/commented.h)
mha_schedule_hash(with_a_change ${WORK}/changed.h)
if (NOT as_is STREQUAL with_comments)
    message(FATAL_ERROR "comments and whitespace changed the stamp: ${as_is}, ${with_comments}")
endif ()
if (as_is STREQUAL with_a_change)
    message(FATAL_ERROR "a changed number left the stamp as it was: ${as_is}")
endif ()
message(STATUS "stamp ${as_is}: the same commented, ${with_a_change} changed")
