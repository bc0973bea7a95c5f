# cmake -DREADME=<a document> -DFILES=<file;...> -P shows_verbatim.cmake: the document holds each
# file's whole text verbatim.
file(READ ${README} readme)
foreach (path IN LISTS FILES)
    file(READ ${path} text)
    string(FIND "${readme}" "${text}" at)
    if (at EQUAL -1)
        message(FATAL_ERROR "${README} does not show ${path} verbatim")
    endif ()
endforeach ()
message(STATUS "${README} shows ${FILES}")
