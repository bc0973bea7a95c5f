# mha_schedule_hash(<out var> <source>...): the stamp of tuned files, a hash of what the sources
# compute: their text with // comments and whitespace removed, so that a comment or a reformat
# leaves it as it was (docs/tuning.md). 16 hexadecimal digits.
function(mha_schedule_hash out)
    set(code "")
    foreach (source IN LISTS ARGN)
        file(READ ${source} text)
        string(REGEX REPLACE "//[^\n]*" "" text "${text}")
        string(REGEX REPLACE "[ \t\r\n]+" "" text "${text}")
        string(APPEND code "${text}")
    endforeach ()
    string(SHA256 hash "${code}")
    string(SUBSTRING ${hash} 0 16 hash)
    set(${out} ${hash} PARENT_SCOPE)
endfunction()
