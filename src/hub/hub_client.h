// Downloading a revision of a model repository from the Hugging Face Hub into the cache, as
// huggingface_hub's snapshot_download does it, so that Python tools find the same files:
//
//   GET  {endpoint}/api/models/{repo}/revision/{rev}     the commit (sha) and file list (siblings)
//   HEAD {endpoint}/{repo}/resolve/{commit}/{path}       ETag / X-Linked-Etag, X-Linked-Size, and
//                                                        a Location when the file lives elsewhere
//   GET  that location (Range: bytes=N- to resume)       into blobs/{etag}.incomplete
//
// Each finished blob is checked (the sha256 of an LFS file is its etag; other files are checked
// by size and git blob sha1) before it is renamed into place and linked from the snapshot.
// Files already in the cache are not downloaded again.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "hub/hub_cache.h"

namespace kiln::hub {

// Where to download from and into; filled by the caller (the CLI reads the environment).
struct HubSettings {
  std::filesystem::path cache_root;                 // HF_HUB_CACHE
  std::string endpoint = "https://huggingface.co";  // HF_ENDPOINT, no trailing '/'
  std::string token;                                // sent as "Authorization: Bearer TOKEN" when not empty
  std::string token_source;                         // where the token came from, for messages ("HF_TOKEN")
  std::string user_agent = "kiln";
  bool offline = false;  // HF_HUB_OFFLINE: never reach the endpoint, use what the cache holds
};

// What a pull reports as it goes, for a progress display.
struct PullEvent {
  enum class Kind {
    listed,    // the revision's commit and files are known (`total` files selected)
    cached,    // a file is already complete in the cache
    started,   // a download starts (`done`: bytes resumed from an earlier attempt)
    progress,  // bytes arrived
    finished,  // a file is complete and checked
  };
  Kind kind;
  std::string path;  // the file inside the repository (empty for `listed`)
  uint64_t done = 0;
  uint64_t total = 0;
  double seconds = 0;  // since this file's download started
};
using PullObserver = std::function<void(const PullEvent&)>;

struct PullRequest {
  RepoRef ref;
  std::vector<std::string> include;  // fnmatch globs; empty: every file
};

struct PullResult {
  Snapshot snapshot;
  int files = 0;         // selected
  int downloaded = 0;    // of those, fetched now
  uint64_t bytes = 0;    // fetched now
  bool offline = false;  // the Hub could not be reached: the cached snapshot was used as it is
};

// Downloads the selected files of one revision into the cache. When the Hub cannot be reached
// and the revision is cached, the cached snapshot is returned (offline = true); otherwise the
// error says both.
Result<PullResult> pull(const HubSettings& settings, const PullRequest& request, const PullObserver& observer = {});

// True when `path` matches one of the globs (fnmatch rules: '*' also matches '/'); a glob ending
// in '/' matches everything under that folder. An empty list matches everything.
bool matches_any(const std::string& path, const std::vector<std::string>& globs);

}  // namespace kiln::hub
