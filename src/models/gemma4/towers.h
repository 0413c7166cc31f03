// The parts of Gemma 4's released checkpoints beside the language model (vision and audio towers
// and their embedders into the text model), as tensor listings for synthetic checkpoints.
#pragma once

#include <vector>

#include "core/status.h"
#include "io/config.h"
#include "models/model.h"

namespace kiln {

// Every tensor transformers' save_pretrained writes for the towers and embedders a gemma4 or
// gemma4_unified config describes, named as the wrapper saves them ("model.vision_tower.",
// "model.embed_vision.", "model.audio_tower.", "model.embed_audio."); empty for a config without
// vision_config and audio_config. An error names a sub-config key whose value cannot be a size.
Result<std::vector<CheckpointTensor>> gemma4_part_tensors(const ModelConfigFile& file);

}  // namespace kiln
