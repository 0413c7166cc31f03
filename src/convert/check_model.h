// Checks a model directory as load_model does (config.json, the name, shape and dtype of every
// tensor the model uses, the quantization block), with the same errors, without reading its
// weights: the family's loader runs on the meta backend. It sits above the models and the backends
// because it names one of each: models never name a backend.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "models/model.h"

namespace kiln {

Status check_model(const std::string& model_dir);
// The same check, and what the checkpoint holds that kiln sets aside (towers, MTP heads).
Result<std::vector<SetAsideFinding>> inspect_model(const std::string& model_dir);

}  // namespace kiln
