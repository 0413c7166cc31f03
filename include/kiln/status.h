// Errors as values: kiln never exits or aborts on bad input. A Result<T> holds either a value or
// an Error whose message is one line naming what is wrong; Status is Result<void>. The public API
// (kiln/engine.h) returns them; the definitions are the library's own (src/core/status.h).
#pragma once

#include "core/status.h"
