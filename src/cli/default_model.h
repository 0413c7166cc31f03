// The model kiln runs when none is named: the small trained model that ships in the source tree.
#pragma once

#include <string>

#include "core/status.h"

namespace kiln::cli {

// Where the bundled model lives under the source tree.
inline constexpr const char* kBundledModel = "models/kiln-kjv-31m";

// `given` when not empty; otherwise the bundled model, looked for beside the binary (build/kiln
// finds ../models) and then in the source tree the binary was built from.
Result<std::string> resolve_model_dir(const std::string& given);

}  // namespace kiln::cli
