# Tuned schedule files (schedules/tuned/<target>.json, written by mha-tune) into the generator
# parameter each shape bucket's CPU kernels are built with.

# The shape buckets, by token rows B·Sq; keep in step with kShapeBuckets in
# generators/kernel_abi.h.
set(MHA_SHAPE_BUCKETS small medium large)

# Reads a JSON value of the tuned file being parsed (`json`, `file`), or stops the configure step.
macro(_mha_json out)
    string(JSON ${out} ERROR_VARIABLE error ${ARGN})
    if (error)
        message(FATAL_ERROR "malformed tuned schedule file ${file}: ${error}")
    endif ()
endmacro()

# mha_tuned_schedules(<prefix> <file>...): sets <prefix>_<bucket> for every bucket to
# "isa@name:value,...[/isa@...]", one entry per file that tunes that bucket (empty: defaults).
# A malformed file stops the configure step, naming the file and what is wrong.
function(mha_tuned_schedules prefix)
    foreach (bucket IN LISTS MHA_SHAPE_BUCKETS)
        set(entries_${bucket} "")
    endforeach ()
    foreach (file IN LISTS ARGN)
        # A new tuning run re-configures the build.
        set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${file}")
        file(READ "${file}" json)
        _mha_json(format GET "${json}" format)
        if (NOT format STREQUAL "mha-tuned-schedule/1")
            message(FATAL_ERROR "malformed tuned schedule file ${file}: format is '${format}', "
                                "expected 'mha-tuned-schedule/1'")
        endif ()
        _mha_json(isa GET "${json}" isa)
        _mha_json(count LENGTH "${json}" buckets)
        if (count EQUAL 0)
            continue()
        endif ()
        math(EXPR last "${count} - 1")
        foreach (b RANGE ${last})
            _mha_json(name GET "${json}" buckets ${b} name)
            if (NOT name IN_LIST MHA_SHAPE_BUCKETS)
                message(FATAL_ERROR "malformed tuned schedule file ${file}: unknown bucket "
                                    "'${name}' (buckets are ${MHA_SHAPE_BUCKETS})")
            endif ()
            _mha_json(nparams LENGTH "${json}" buckets ${b} params)
            math(EXPR last_param "${nparams} - 1")
            set(assignments "")
            foreach (p RANGE ${last_param})
                _mha_json(key MEMBER "${json}" buckets ${b} params ${p})
                _mha_json(value GET "${json}" buckets ${b} params ${key})
                if (NOT value MATCHES "^[0-9]+$")
                    message(FATAL_ERROR "malformed tuned schedule file ${file}: bucket ${name} "
                                        "parameter ${key} is '${value}', not a whole number")
                endif ()
                list(APPEND assignments "${key}:${value}")
            endforeach ()
            list(JOIN assignments "," assignments)
            if (entries_${name})
                string(APPEND entries_${name} "/")
            endif ()
            string(APPEND entries_${name} "${isa}@${assignments}")
        endforeach ()
    endforeach ()
    foreach (bucket IN LISTS MHA_SHAPE_BUCKETS)
        set(${prefix}_${bucket} "${entries_${bucket}}" PARENT_SCOPE)
    endforeach ()
endfunction()
