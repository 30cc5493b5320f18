#include "convnn/version.h"

namespace convnn {

// Compiled into the library, so this is the library's version even when a program was compiled
// against other headers.
const char* version() { return CONVNN_VERSION_STRING; }

}  // namespace convnn
