#include "hub/hub_cache.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <system_error>

namespace kiln::hub {

namespace fs = std::filesystem;

namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
}

bool is_word_char(char c) {
  return is_name_char(c) && c != '-' && c != '.';
}

// One half of an id, as huggingface_hub's validate_repo_id accepts it.
bool valid_name_part(std::string_view part) {
  if (part.empty() || !is_word_char(part.front()) || !is_word_char(part.back())) return false;
  return std::all_of(part.begin(), part.end(), is_name_char);
}

// A branch, tag or commit: the characters git allows in the names people use, and nothing that
// could step out of refs/ once it is a path.
bool valid_revision(std::string_view rev) {
  if (rev.empty() || rev.front() == '/' || rev.back() == '/' || rev.find("..") != std::string_view::npos ||
      rev.find("//") != std::string_view::npos)
    return false;
  return std::all_of(rev.begin(), rev.end(), [](char c) { return is_name_char(c) || c == '/' || c == '+'; });
}

std::string read_ref(const fs::path& path) {
  std::ifstream in(path);
  std::string commit;
  std::getline(in, commit);
  while (!commit.empty() && (commit.back() == '\r' || commit.back() == ' ')) commit.pop_back();
  return commit;
}

// Every ref under refs/ (branches with '/' in their names included), by name.
std::map<std::string, std::string> read_refs(const fs::path& repo_dir) {
  std::map<std::string, std::string> refs;
  std::error_code ec;
  const fs::path root = repo_dir / "refs";
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_regular_file(ec)) refs[it->path().lexically_relative(root).string()] = read_ref(it->path());
  }
  return refs;
}

}  // namespace

const std::string& RepoRef::revision_or_main() const {
  static const std::string main = "main";
  return revision.empty() ? main : revision;
}

std::string RepoRef::describe() const {
  return revision.empty() ? repo : repo + "@" + revision;
}

std::optional<RepoRef> parse_repo_ref(std::string_view text) {
  RepoRef ref;
  const size_t at = text.find('@');
  std::string_view id = text.substr(0, at);
  if (at != std::string_view::npos) {
    ref.revision = std::string(text.substr(at + 1));
    if (!valid_revision(ref.revision)) return std::nullopt;
  }
  const size_t slash = id.find('/');
  if (slash == std::string_view::npos || id.size() > 96) return std::nullopt;
  if (!valid_name_part(id.substr(0, slash)) || !valid_name_part(id.substr(slash + 1))) return std::nullopt;
  if (id.find("--") != std::string_view::npos || id.find("..") != std::string_view::npos) return std::nullopt;
  if (id.size() >= 4 && id.substr(id.size() - 4) == ".git") return std::nullopt;
  ref.repo = std::string(id);
  return ref;
}

bool is_commit_hash(std::string_view text) {
  return text.size() == 40 &&
         std::all_of(text.begin(), text.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string repo_folder_name(const std::string& repo) {
  std::string name = "models--";
  for (char c : repo) name += c == '/' ? std::string("--") : std::string(1, c);
  return name;
}

Result<Snapshot> find_snapshot(const fs::path& cache_root, const RepoRef& ref) {
  const fs::path repo_dir = cache_root / repo_folder_name(ref.repo);
  std::error_code ec;
  if (!fs::is_directory(repo_dir / "snapshots", ec))
    return make_error("{} is not in the Hugging Face cache ({}); run: kiln pull {}", ref.repo, repo_dir.string(),
                      ref.describe());
  const std::string& revision = ref.revision_or_main();
  std::string commit = revision;
  const fs::path ref_path = repo_dir / "refs" / revision;
  if (fs::is_regular_file(ref_path, ec)) {
    commit = read_ref(ref_path);
    if (!is_commit_hash(commit))
      return make_error("{} does not hold a commit hash (it holds '{}')", ref_path.string(), commit);
  } else if (!is_commit_hash(revision)) {
    return make_error("revision '{}' of {} is not in the Hugging Face cache (no {}); run: kiln pull {}@{}", revision,
                      ref.repo, ref_path.string(), ref.repo, revision);
  }
  const fs::path dir = repo_dir / "snapshots" / commit;
  if (!fs::is_directory(dir, ec))
    return make_error("commit {} of {} is not in the Hugging Face cache (no {}); run: kiln pull {}@{}", commit,
                      ref.repo, dir.string(), ref.repo, revision);
  return Snapshot{.dir = dir, .commit = commit};
}

Result<std::vector<CachedRepo>> scan_cache(const fs::path& cache_root) {
  std::vector<CachedRepo> repos;
  std::error_code ec;
  if (!fs::exists(cache_root, ec)) return repos;
  if (!fs::is_directory(cache_root, ec)) return make_error("{} is not a directory", cache_root.string());
  fs::directory_iterator entries(cache_root, ec);
  if (ec) return make_error("cannot read {}: {}", cache_root.string(), ec.message());
  for (const fs::directory_entry& entry : entries) {
    const std::string folder = entry.path().filename().string();
    if (folder.rfind("models--", 0) != 0 || !entry.is_directory(ec)) continue;
    CachedRepo repo{.dir = entry.path()};
    // "models--org--name" -> "org/name" (names never hold "--", so the first one is the slash)
    const std::string name = folder.substr(8);
    const size_t dash = name.find("--");
    repo.repo = dash == std::string::npos ? name : name.substr(0, dash) + "/" + name.substr(dash + 2);

    const auto refs = read_refs(entry.path());
    for (const auto& snap : fs::directory_iterator(entry.path() / "snapshots", ec)) {
      if (!snap.is_directory(ec)) continue;
      CachedRevision revision{.commit = snap.path().filename().string(), .dir = snap.path()};
      revision.modified = snap.last_write_time(ec);
      for (const auto& [name, commit] : refs)
        if (commit == revision.commit) revision.refs.push_back(name);
      repo.revisions.push_back(std::move(revision));
    }
    std::sort(repo.revisions.begin(), repo.revisions.end(), [](const CachedRevision& a, const CachedRevision& b) {
      const bool a_main = std::count(a.refs.begin(), a.refs.end(), "main") > 0;
      const bool b_main = std::count(b.refs.begin(), b.refs.end(), "main") > 0;
      if (a_main != b_main) return a_main;
      return a.modified > b.modified;
    });

    for (const auto& blob : fs::directory_iterator(entry.path() / "blobs", ec)) {
      if (!blob.is_regular_file(ec)) continue;
      const uint64_t size = blob.file_size(ec);
      if (blob.path().extension() == ".incomplete")
        repo.incomplete_bytes += size;
      else
        repo.blob_bytes += size;
    }
    repos.push_back(std::move(repo));
  }
  std::sort(repos.begin(), repos.end(), [](const CachedRepo& a, const CachedRepo& b) { return a.repo < b.repo; });
  return repos;
}

}  // namespace kiln::hub
