# mha_project_warnings(<target>...): the warnings the project's own code is kept clean of.
function(mha_project_warnings)
    foreach (target IN LISTS ARGN)
        target_compile_options(${target} PRIVATE -Wall -Wextra
                               $<$<BOOL:${MHA_WARNINGS_AS_ERRORS}>:-Werror>)
    endforeach ()
endfunction()
