#include "cli/model_source.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <system_error>

#include "cli/default_model.h"
#include "hub/hub_cache.h"

namespace kiln::cli {

Result<ModelSource> resolve_model(const std::string& given, const Environment& env) {
  std::error_code ec;
  if (given.empty() || std::filesystem::exists(given, ec)) {
    KILN_ASSIGN(std::string dir, resolve_model_dir(given));
    return ModelSource{.dir = std::move(dir)};
  }
  const auto ref = hub::parse_repo_ref(given);
  if (!ref) return ModelSource{.dir = given};
  auto snapshot = hub::find_snapshot(env.hub.cache_root, *ref);
  if (!snapshot) return make_error("{} is not a directory, and {}", given, snapshot.error().message);
  spdlog::info("{}: commit {} from the Hugging Face cache, {}", given, snapshot->commit, snapshot->dir.string());
  return ModelSource{.dir = snapshot->dir.string(), .repo_id = ref->repo};
}

}  // namespace kiln::cli
