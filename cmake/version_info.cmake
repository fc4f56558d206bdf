# Writes OUTPUT, the definition of dlrun::kVersion (common/version.h): VERSION and the git commit
# of SOURCE_DIR. Run by every build; file(CONFIGURE) leaves OUTPUT untouched when its text is the
# same, so an unchanged commit rebuilds nothing.
execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse --short=12 HEAD
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE
                RESULT_VARIABLE failed ERROR_QUIET)
if(failed)
  set(commit unknown)
else()
  execute_process(COMMAND git -C "${SOURCE_DIR}" status --porcelain --untracked-files=no
                  OUTPUT_VARIABLE changes ERROR_QUIET)
  if(changes)
    string(APPEND commit -dirty)
  endif()
endif()
file(CONFIGURE OUTPUT "${OUTPUT}" CONTENT [[
#include "common/version.h"

namespace dlrun {
const char* const kVersion = "@VERSION@ (git @commit@)";
}
]] @ONLY)
