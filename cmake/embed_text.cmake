# Writes a C++ source defining `std::string_view NAME()` that returns INPUT's text, so a file
# (the metrics pages) ships inside the binary. Run with -DINPUT= -DOUTPUT= -DNAMESPACE= -DNAME=.
# A line `/* embed: FILE */` in INPUT is replaced by FILE's text (FILE beside INPUT), so two
# pages share their CSS and script without loading anything but themselves.
file(READ ${INPUT} text)
get_filename_component(directory ${INPUT} DIRECTORY)
# The marker with the spaces before it: the piece brings its own indentation.
string(REGEX MATCHALL " */\\* embed: [A-Za-z0-9_.-]+ \\*/" markers "${text}")
foreach(marker IN LISTS markers)
  string(REGEX REPLACE " */\\* embed: ([A-Za-z0-9_.-]+) \\*/" "\\1" piece_name "${marker}")
  if(NOT EXISTS ${directory}/${piece_name})
    message(FATAL_ERROR "${INPUT} embeds ${piece_name}, which is not beside it")
  endif()
  file(READ ${directory}/${piece_name} piece)
  string(REGEX REPLACE "\n$" "" piece "${piece}")  # the marker's own line ends it
  string(REPLACE "${marker}" "${piece}" text "${text}")
endforeach()
set(delimiter "dlrun_embed")
string(FIND "${text}" ")${delimiter}\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw string delimiter )${delimiter}\"")
endif()
set(source "// Generated from ${INPUT} by cmake/embed_text.cmake; do not edit.\n#include <string_view>\n\nnamespace ${NAMESPACE} {\n\nstd::string_view ${NAME}() {\n  static constexpr std::string_view text = R\"${delimiter}(${text})${delimiter}\";\n  return text;\n}\n\n}  // namespace ${NAMESPACE}\n")
if(EXISTS ${OUTPUT})
  file(READ ${OUTPUT} old)
endif()
if(NOT "${old}" STREQUAL "${source}")
  file(WRITE ${OUTPUT} "${source}")
endif()
