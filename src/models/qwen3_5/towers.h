// The parts of Qwen 3.5's released checkpoints beside the language model (the vision tower and the
// multi-token-prediction head), as tensor listings for synthetic checkpoints.
#pragma once

#include <vector>

#include "core/status.h"
#include "io/config.h"
#include "models/model.h"

namespace kiln {

// Every tensor of the parts a qwen3_5 or qwen3_5_moe config describes: the vision tower as
// transformers' save_pretrained of the wrapper writes it ("model.visual.") when vision_config is an
// object, and the MTP head as the released checkpoints name it ("mtp.") when the text config has
// mtp_num_hidden_layers > 0. An error names a sub-config key whose value cannot be a size.
Result<std::vector<CheckpointTensor>> qwen3_5_part_tensors(const ModelConfigFile& file);

}  // namespace kiln
