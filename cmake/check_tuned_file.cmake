# cmake -DMHA_TUNED_FILE=<file> -P check_tuned_file.cmake: parses one tuned schedule file as the
# build does, printing the parameters of each bucket (or the build's error).
include(${CMAKE_CURRENT_LIST_DIR}/TunedSchedules.cmake)
mha_tuned_schedules(schedule ${MHA_TUNED_FILE})
foreach (bucket IN LISTS MHA_SHAPE_BUCKETS)
    message(STATUS "${bucket}: ${schedule_${bucket}}")
endforeach ()
