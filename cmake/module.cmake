# dlrun_module(NAME MAP SOURCES...): a module opened at run time by its full path (dlrun-train's
# AVX2 math, dlrun.checkpoint's copy): NAME.so beside the programs in bin/, with only the
# symbols MAP (a version script in the calling folder) exports: hidden visibility, so its copies
# of the standard library's templates bind only each other, and every symbol defined (-z defs).
function(dlrun_module name map)
  add_library(${name} MODULE ${ARGN})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_options(${name} PRIVATE -O3)
  target_link_options(${name} PRIVATE -Wl,--version-script=${CMAKE_CURRENT_SOURCE_DIR}/${map}
                      -Wl,-z,defs)
  set_target_properties(${name} PROPERTIES
                        PREFIX "" CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
                        LINK_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${map}
                        LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
endfunction()
