// What kiln takes from the environment, read once by main and passed to the commands: where the
// Hugging Face cache is, which Hub to talk to and with which token.
#pragma once

#include <string>

#include "hub/hub_client.h"

namespace kiln::cli {

struct Environment {
  // The cache root, as huggingface_hub finds it: HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else
  // $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub. The
  // endpoint: HF_ENDPOINT (default https://huggingface.co). The token: HF_TOKEN, else
  // HUGGING_FACE_HUB_TOKEN, else the file HF_TOKEN_PATH or $HF_HOME/token. HF_HUB_OFFLINE=1 keeps
  // kiln pull to the cache.
  hub::HubSettings hub;
};

Environment read_environment();

}  // namespace kiln::cli
