#include "cli/default_model.h"

#include <filesystem>
#include <system_error>
#include <vector>

namespace kiln::cli {

namespace fs = std::filesystem;

Result<std::string> resolve_model_dir(const std::string& given) {
  if (!given.empty()) return given;
  std::vector<fs::path> candidates;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(exe.parent_path().parent_path() / kBundledModel);
#ifdef KILN_SOURCE_DIR
  candidates.push_back(fs::path(KILN_SOURCE_DIR) / kBundledModel);
#endif
  for (const fs::path& dir : candidates)
    if (fs::exists(dir / "config.json", ec)) return dir.lexically_normal().string();
  return make_error("no model named, and the bundled model ({}) was not found beside the binary or in {}",
                    kBundledModel, candidates.empty() ? std::string("the source tree") : candidates.back().string());
}

}  // namespace kiln::cli
