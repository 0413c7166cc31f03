// The Hugging Face cache, laid out exactly as huggingface_hub lays it out, so that Python tools and
// kiln share the same files:
//
//   CACHE/models--{org}--{name}/refs/{branch or tag}     the commit hash (no newline)
//   CACHE/models--{org}--{name}/snapshots/{commit}/PATH  a relative symlink to ../../blobs/{etag}
//   CACHE/models--{org}--{name}/blobs/{etag}             the file (etag: sha256 for LFS files,
//                                                        the git blob sha1 for others)
//   CACHE/models--{org}--{name}/blobs/{etag}.incomplete  a download in progress
//
// This file only reads the cache (resolving an id, listing what is there); downloading lives in
// hub_client.h. The cache root itself comes from the caller (the CLI reads the environment).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kiln::hub {

// A repository id with an optional revision: "Qwen/Qwen3.5-4B", "google/gemma-4-e2b-it@main",
// "org/name@0123...cdef" (a full commit hash), "org/name@v1.0" (a tag).
struct RepoRef {
  std::string repo;      // "org/name"
  std::string revision;  // as given; empty means "main"

  const std::string& revision_or_main() const;
  std::string describe() const;  // "org/name" or "org/name@rev"
};

// Parses ORG/NAME[@REVISION] with the Hub's rules for names (letters, digits, '-', '_', '.'; no
// "--" or ".."; at most 96 characters). Returns nothing when `text` is not of that form.
std::optional<RepoRef> parse_repo_ref(std::string_view text);

// True for a full 40-character lowercase hex commit hash.
bool is_commit_hash(std::string_view text);

// "models--org--name"
std::string repo_folder_name(const std::string& repo);

// A resolved snapshot: the directory that holds the files of one commit.
struct Snapshot {
  std::filesystem::path dir;  // CACHE/models--org--name/snapshots/{commit}
  std::string commit;
};

// Finds the snapshot of `ref` in the cache at `cache_root`: a branch or tag through refs/, or a
// full commit hash directly. The error names the path looked in and suggests `kiln pull`.
Result<Snapshot> find_snapshot(const std::filesystem::path& cache_root, const RepoRef& ref);

// One snapshot of a cached repository, with the refs that point at it.
struct CachedRevision {
  std::string commit;
  std::vector<std::string> refs;  // branches and tags naming this commit, sorted
  std::filesystem::path dir;
  std::filesystem::file_time_type modified;
};

struct CachedRepo {
  std::string repo;  // "org/name"
  std::filesystem::path dir;
  std::vector<CachedRevision> revisions;  // sorted: the one "main" names first, then newest first
  uint64_t blob_bytes = 0;                // complete blobs, what the repository takes on disk
  uint64_t incomplete_bytes = 0;          // downloads in progress
};

// Every model repository in the cache, sorted by id. A missing cache is an empty list.
Result<std::vector<CachedRepo>> scan_cache(const std::filesystem::path& cache_root);

}  // namespace kiln::hub
