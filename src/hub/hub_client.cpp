#include "hub/hub_client.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <fmt/ranges.h>
#include <fnmatch.h>
#include <openssl/evp.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <system_error>

namespace kiln::hub {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// ---- curl -------------------------------------------------------------------------------------

struct CurlDeleter {
  void operator()(CURL* curl) const { curl_easy_cleanup(curl); }
};
using CurlHandle = std::unique_ptr<CURL, CurlDeleter>;

struct HeaderListDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};
using HeaderList = std::unique_ptr<curl_slist, HeaderListDeleter>;

// A header of the last response of the last request, or "".
std::string response_header(CURL* curl, const char* name) {
  curl_header* h = nullptr;
  if (curl_easy_header(curl, name, 0, CURLH_HEADER, -1, &h) == CURLHE_OK && h && h->value) return h->value;
  return "";
}

long response_status(CURL* curl) {
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  return status;
}

// "path/with spaces/x.json" -> "path/with%20spaces/x.json": each segment escaped, the slashes kept.
std::string escape_path(CURL* curl, const std::string& path, bool keep_slashes) {
  std::string out;
  size_t begin = 0;
  while (true) {
    const size_t end = keep_slashes ? path.find('/', begin) : std::string::npos;
    const std::string segment = path.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    char* escaped = curl_easy_escape(curl, segment.c_str(), int(segment.size()));
    out += escaped ? escaped : segment;
    curl_free(escaped);
    if (end == std::string::npos) break;
    out += '/';
    begin = end + 1;
  }
  return out;
}

// One connection to the Hub, reused for every request of a pull.
class Session {
 public:
  explicit Session(const HubSettings& settings) : settings_(settings), curl_(curl_easy_init()) {}
  bool ok() const { return curl_ != nullptr; }
  CURL* curl() const { return curl_.get(); }
  const HubSettings& settings() const { return settings_; }

  // Resets the handle for a request to `url`; the token goes only to the endpoint's own host.
  void prepare(const std::string& url) {
    CURL* c = curl_.get();
    curl_easy_reset(c);
    headers_.reset();
    curl_slist* list = curl_slist_append(nullptr, "Accept-Encoding: identity");
    if (!settings_.token.empty() && sends_token_to(url))
      list = curl_slist_append(list, ("Authorization: Bearer " + settings_.token).c_str());
    headers_.reset(list);
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers_.get());
    curl_easy_setopt(c, CURLOPT_USERAGENT, settings_.user_agent.c_str());
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
    // a transfer that moves nothing for a minute is given up (and resumed by the next pull)
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error_);
    error_[0] = '\0';
  }

  // curl's own words for a failed transfer: its error buffer when it has one.
  std::string describe(CURLcode code) const {
    return error_[0] ? std::string(error_) : std::string(curl_easy_strerror(code));
  }

 private:
  bool sends_token_to(const std::string& url) const {
    return url.compare(0, settings_.endpoint.size() + 1, settings_.endpoint + "/") == 0;
  }

  const HubSettings& settings_;
  CurlHandle curl_;
  HeaderList headers_;
  char error_[CURL_ERROR_SIZE] = {};
};

// Failures that mean the endpoint is not there at all (as opposed to an HTTP answer).
bool unreachable(CURLcode code) {
  return code == CURLE_COULDNT_RESOLVE_HOST || code == CURLE_COULDNT_RESOLVE_PROXY || code == CURLE_COULDNT_CONNECT ||
         code == CURLE_OPERATION_TIMEDOUT || code == CURLE_SSL_CONNECT_ERROR || code == CURLE_RECV_ERROR ||
         code == CURLE_SEND_ERROR || code == CURLE_GOT_NOTHING;
}

// An HTTP error answer as one line; `what` names the repository, revision or file asked for.
Error http_error(const Session& s, long status, const std::string& what) {
  const std::string code = response_header(s.curl(), "X-Error-Code");
  const std::string message = response_header(s.curl(), "X-Error-Message");
  const std::string detail = message.empty() ? "" : " (" + message + ")";
  const std::string& endpoint = s.settings().endpoint;
  if (status == 401) {
    if (s.settings().token.empty())
      return make_error(
          "{}: 401 Unauthorized from {}: the repository is private or gated, or does not exist; set HF_TOKEN to a "
          "token that can read it{}",
          what, endpoint, detail);
    return make_error("{}: 401 Unauthorized from {}: the token from {} was refused, or the repository does not exist{}",
                      what, endpoint, s.settings().token_source, detail);
  }
  if (status == 403)
    return make_error(
        "{}: 403 Forbidden from {}: the token{} has no access (a gated repository needs its terms "
        "accepted on the Hub){}",
        what, endpoint, s.settings().token.empty() ? " (none: HF_TOKEN is not set)" : "", detail);
  if (status == 404) {
    if (code == "RevisionNotFound") return make_error("{}: no such revision at {} (404){}", what, endpoint, detail);
    if (code == "EntryNotFound") return make_error("{}: no such file at {} (404){}", what, endpoint, detail);
    return make_error("{}: not found at {} (404){}", what, endpoint, detail);
  }
  return make_error("{}: HTTP {} from {}{}", what, status, endpoint, detail);
}

// ---- the revision's file list -----------------------------------------------------------------

struct RevisionInfo {
  std::string commit;
  std::vector<std::string> files;
};

size_t append_to_string(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

// GET /api/models/{repo}/revision/{rev}. `offline` is set when the endpoint could not be reached.
Result<RevisionInfo> fetch_revision(Session& s, const RepoRef& ref, bool& offline, std::string& why) {
  const std::string url = s.settings().endpoint + "/api/models/" + ref.repo + "/revision/" +
                          escape_path(s.curl(), ref.revision_or_main(), false);
  std::string body;
  s.prepare(url);
  curl_easy_setopt(s.curl(), CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(s.curl(), CURLOPT_TIMEOUT, 120L);
  curl_easy_setopt(s.curl(), CURLOPT_WRITEFUNCTION, append_to_string);
  curl_easy_setopt(s.curl(), CURLOPT_WRITEDATA, &body);
  const CURLcode code = curl_easy_perform(s.curl());
  if (code != CURLE_OK) {
    offline = unreachable(code);
    why = s.describe(code);
    return make_error("could not reach {} ({})", s.settings().endpoint, why);
  }
  const long status = response_status(s.curl());
  if (status != 200) return http_error(s, status, ref.describe());
  const auto json = nlohmann::json::parse(body, nullptr, false);
  if (json.is_discarded() || !json.is_object() || !json.contains("sha") || !json["sha"].is_string())
    return make_error("{}: the answer of {} is not the Hub's revision info (no 'sha')", ref.describe(), url);
  RevisionInfo info{.commit = json["sha"].get<std::string>()};
  if (!is_commit_hash(info.commit))
    return make_error("{}: the Hub named commit '{}', which is not a commit hash", ref.describe(), info.commit);
  if (json.contains("siblings") && json["siblings"].is_array())
    for (const auto& sibling : json["siblings"])
      if (sibling.is_object() && sibling.contains("rfilename") && sibling["rfilename"].is_string())
        info.files.push_back(sibling["rfilename"].get<std::string>());
  return info;
}

// ---- one file's metadata ----------------------------------------------------------------------

struct FileMeta {
  std::string etag;  // sha256 (LFS) or git blob sha1
  uint64_t size = 0;
  bool lfs = false;
  std::string url;  // where to GET the bytes
};

std::string normalize_etag(std::string etag) {
  if (etag.rfind("W/", 0) == 0) etag.erase(0, 2);
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') etag = etag.substr(1, etag.size() - 2);
  return etag;
}

bool is_hex(const std::string& text, size_t length) {
  return text.size() == length && text.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// HEAD /{repo}/resolve/{commit}/{path}, following redirects within the endpoint (a renamed
// repository) but not one to another host (where LFS files live): that one's Location is where
// the bytes are fetched from.
Result<FileMeta> fetch_file_meta(Session& s, const std::string& repo, const std::string& commit,
                                 const std::string& path) {
  std::string url = s.settings().endpoint + "/" + repo + "/resolve/" + commit + "/" + escape_path(s.curl(), path, true);
  const std::string what = repo + "@" + commit.substr(0, 8) + ": " + path;
  for (int hop = 0; hop < 10; ++hop) {
    s.prepare(url);
    curl_easy_setopt(s.curl(), CURLOPT_NOBODY, 1L);
    curl_easy_setopt(s.curl(), CURLOPT_TIMEOUT, 60L);
    const CURLcode code = curl_easy_perform(s.curl());
    if (code != CURLE_OK)
      return make_error("{}: could not reach {} ({})", what, s.settings().endpoint, s.describe(code));
    const long status = response_status(s.curl());
    const std::string location = response_header(s.curl(), "Location");
    if (status >= 300 && status < 400 && !location.empty() && location.front() == '/') {
      char* target = nullptr;
      curl_easy_getinfo(s.curl(), CURLINFO_REDIRECT_URL, &target);
      if (!target) return make_error("{}: a redirect to '{}' that cannot be followed", what, location);
      url = target;
      continue;
    }
    if (status >= 400) return http_error(s, status, what);
    FileMeta meta;
    const std::string linked_etag = response_header(s.curl(), "X-Linked-Etag");
    meta.lfs = !linked_etag.empty();
    meta.etag = normalize_etag(meta.lfs ? linked_etag : response_header(s.curl(), "ETag"));
    std::string size = response_header(s.curl(), "X-Linked-Size");
    if (size.empty()) size = response_header(s.curl(), "Content-Length");
    if (meta.etag.empty()) return make_error("{}: the Hub sent no ETag for the file", what);
    if (meta.etag.find_first_of("/\\") != std::string::npos || meta.etag.rfind('.', 0) == 0)
      return make_error("{}: the Hub sent an ETag that is not a file name ('{}')", what, meta.etag);
    if (size.empty() || size.find_first_not_of("0123456789") != std::string::npos)
      return make_error("{}: the Hub sent no size for the file", what);
    meta.size = std::stoull(size);
    meta.url = status >= 300 && status < 400 && !location.empty() ? location : url;
    return meta;
  }
  return make_error("{}: too many redirects", what);
}

// ---- checking the bytes -----------------------------------------------------------------------

struct DigestDeleter {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};

// The checksum a blob is held to: the sha256 of an LFS file is its etag; other files have their
// git blob sha1 as etag. Anything else (a mirror's own etags) is checked by size only.
class BlobDigest {
 public:
  explicit BlobDigest(const FileMeta& meta) : expected_(meta.etag) {
    if (meta.lfs && is_hex(meta.etag, 64))
      start(EVP_sha256(), "sha256");
    else if (!meta.lfs && is_hex(meta.etag, 40)) {
      start(EVP_sha1(), "git blob sha1");
      const std::string header = "blob " + std::to_string(meta.size) + std::string(1, '\0');
      update(header.data(), header.size());
    }
  }
  void update(const void* data, size_t size) {
    if (ctx_) EVP_DigestUpdate(ctx_.get(), data, size);
  }
  // Hashes what `path` already holds (a download resumed).
  Status update_from_file(const fs::path& path) {
    if (!ctx_) return ok_status();
    std::ifstream in(path, std::ios::binary);
    std::vector<char> buffer(1 << 20);
    while (in) {
      in.read(buffer.data(), std::streamsize(buffer.size()));
      update(buffer.data(), size_t(in.gcount()));
    }
    if (in.bad()) return make_error("cannot read {}", path.string());
    return ok_status();
  }
  // Empty when the bytes match (or nothing is checked); else what they hash to.
  std::string mismatch() {
    if (!ctx_) return "";
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    EVP_DigestFinal_ex(ctx_.get(), digest, &length);
    ctx_.reset();
    std::string hex;
    for (unsigned int i = 0; i < length; ++i) hex += fmt::format("{:02x}", digest[i]);
    return hex == expected_ ? "" : hex;
  }
  const char* name() const { return name_; }

 private:
  void start(const EVP_MD* md, const char* name) {
    ctx_.reset(EVP_MD_CTX_new());
    EVP_DigestInit_ex(ctx_.get(), md, nullptr);
    name_ = name;
  }
  std::unique_ptr<EVP_MD_CTX, DigestDeleter> ctx_;
  std::string expected_;
  const char* name_ = "size";
};

// ---- one download -----------------------------------------------------------------------------

struct Transfer {
  std::FILE* file = nullptr;
  BlobDigest* digest = nullptr;
  const PullObserver* observer = nullptr;
  PullEvent event;
  Clock::time_point start;
  Clock::time_point last_report;
  uint64_t resumed = 0;
  bool write_failed = false;
};

size_t write_blob(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  if (std::fwrite(data, 1, n, t->file) != n) {
    t->write_failed = true;
    return 0;  // curl stops the transfer
  }
  t->digest->update(data, n);
  return n;
}

int report_progress(void* user, curl_off_t, curl_off_t now, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  const auto time = Clock::now();
  if (*t->observer && time - t->last_report >= std::chrono::milliseconds(100)) {
    t->last_report = time;
    t->event.kind = PullEvent::Kind::progress;
    t->event.done = t->resumed + uint64_t(now);
    t->event.seconds = std::chrono::duration<double>(time - t->start).count();
    (*t->observer)(t->event);
  }
  return 0;
}

// Holds huggingface_hub's lock for one blob (CACHE/.locks/models--org--name/{etag}.lock, an
// flock as its filelock takes it), so that two downloads of the same blob do not interleave.
class BlobLock {
 public:
  static Result<BlobLock> take(const fs::path& path) {
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    BlobLock lock;
    lock.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock.fd_ < 0) return make_error("cannot create the lock file {}", path.string());
    if (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0) {
      spdlog::warn("{} is held by another download; waiting for it", path.string());
      if (::flock(lock.fd_, LOCK_EX) != 0) return make_error("cannot lock {}", path.string());
    }
    return lock;
  }
  BlobLock(BlobLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ~BlobLock() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  BlobLock() = default;
  int fd_ = -1;
};

// Downloads one blob into `incomplete` (resuming what it holds) and checks it. On success the
// file holds exactly the blob; on failure it is kept for the next attempt.
Status download_blob(Session& s, const FileMeta& meta, const fs::path& incomplete, const std::string& path,
                     const PullObserver& observer, uint64_t& fetched) {
  std::error_code ec;
  const bool partial = fs::exists(incomplete, ec);
  uint64_t resumed = partial ? fs::file_size(incomplete, ec) : 0;
  BlobDigest digest(meta);
  if (partial && resumed == meta.size) {  // an earlier attempt got every byte: check them before anything else
    KILN_TRY(digest.update_from_file(incomplete));
    if (digest.mismatch().empty()) return ok_status();
    spdlog::warn("{}: {} holds all {} bytes but its {} is wrong; downloading it again", path, incomplete.string(),
                 meta.size, digest.name());
    digest = BlobDigest(meta);
    resumed = 0;
  }
  if (resumed > meta.size) resumed = 0;  // not this blob: start over
  if (resumed > 0) KILN_TRY(digest.update_from_file(incomplete));

  std::FILE* file = std::fopen(incomplete.c_str(), resumed > 0 ? "ab" : "wb");
  if (!file) return make_error("cannot write {}", incomplete.string());
  Transfer t{.file = file, .digest = &digest, .observer = &observer, .resumed = resumed};
  t.event = PullEvent{.kind = PullEvent::Kind::started, .path = path, .done = resumed, .total = meta.size};
  t.start = t.last_report = Clock::now();
  if (observer) observer(t.event);

  s.prepare(meta.url);
  CURL* c = s.curl();
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
  curl_easy_setopt(c, CURLOPT_RESUME_FROM_LARGE, curl_off_t(resumed));  // Range: bytes=N-
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, write_blob);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, report_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, &t);
  const CURLcode code = curl_easy_perform(c);
  const bool closed = std::fclose(file) == 0;
  const uint64_t have = fs::file_size(incomplete, ec);
  fetched += have - resumed;

  if (t.write_failed || !closed) return make_error("cannot write {} (is the disk full?)", incomplete.string());
  if (code == CURLE_RANGE_ERROR) {  // the server would not resume: start over from the first byte
    spdlog::warn("{}: the server does not resume downloads; starting over", path);
    fs::remove(incomplete, ec);
    return download_blob(s, meta, incomplete, path, observer, fetched);
  }
  if (code == CURLE_HTTP_RETURNED_ERROR) return http_error(s, response_status(c), path);
  if (code != CURLE_OK)
    return make_error("{}: the download stopped at {} of {} bytes ({}); run kiln pull again to resume it", path, have,
                      meta.size, s.describe(code));
  if (have != meta.size)
    return make_error("{}: got {} bytes where the Hub announced {}; kept as {}", path, have, meta.size,
                      incomplete.string());
  if (const std::string got = digest.mismatch(); !got.empty())
    return make_error(
        "{}: checksum mismatch: the download's {} is {}, the Hub's is {}; refused and kept as {} (a "
        "later kiln pull downloads it again)",
        path, digest.name(), got, meta.etag, incomplete.string());
  if (observer)
    observer(PullEvent{.kind = PullEvent::Kind::finished,
                       .path = path,
                       .done = meta.size,
                       .total = meta.size,
                       .seconds = std::chrono::duration<double>(Clock::now() - t.start).count()});
  return ok_status();
}

// Points snapshots/{commit}/{path} at blobs/{etag} with a relative symlink, as huggingface_hub does.
Status link_into_snapshot(const fs::path& blob, const fs::path& pointer) {
  std::error_code ec;
  fs::create_directories(pointer.parent_path(), ec);
  if (ec) return make_error("cannot create {}: {}", pointer.parent_path().string(), ec.message());
  fs::remove(pointer, ec);
  fs::create_symlink(blob.lexically_relative(pointer.parent_path()), pointer, ec);
  if (ec) return make_error("cannot link {} to {}: {}", pointer.string(), blob.string(), ec.message());
  return ok_status();
}

// A relative path with no ".." in it: one that stays inside the snapshot once joined to it.
bool inside_repository(const std::string& file) {
  const fs::path path(file);
  if (file.empty() || path.is_absolute()) return false;
  for (const fs::path& part : path)
    if (part == "..") return false;
  return true;
}

Status write_ref(const fs::path& repo_dir, const std::string& revision, const std::string& commit) {
  const fs::path ref = repo_dir / "refs" / revision;
  std::error_code ec;
  fs::create_directories(ref.parent_path(), ec);
  std::ofstream out(ref, std::ios::binary | std::ios::trunc);
  out << commit;  // no newline, as huggingface_hub writes it
  out.close();
  if (!out) return make_error("cannot write {}", ref.string());
  return ok_status();
}

}  // namespace

bool matches_any(const std::string& path, const std::vector<std::string>& globs) {
  if (globs.empty()) return true;
  for (std::string glob : globs) {
    if (!glob.empty() && glob.back() == '/') glob += '*';
    if (::fnmatch(glob.c_str(), path.c_str(), FNM_NOESCAPE) == 0) return true;
  }
  return false;
}

Result<PullResult> pull(const HubSettings& settings, const PullRequest& request, const PullObserver& observer) {
  const RepoRef& ref = request.ref;
  const fs::path repo_dir = settings.cache_root / repo_folder_name(ref.repo);
  if (settings.offline) {
    auto cached = find_snapshot(settings.cache_root, ref);
    if (!cached)
      return make_error("HF_HUB_OFFLINE is set, and {} is not in the Hugging Face cache at {}", ref.describe(),
                        repo_dir.string());
    return PullResult{.snapshot = *cached, .offline = true};
  }
  Session session(settings);
  if (!session.ok()) return make_error("cannot start libcurl");

  bool offline = false;
  std::string why;
  auto info = fetch_revision(session, ref, offline, why);
  if (!info) {
    if (!offline) return info.error();
    auto cached = find_snapshot(settings.cache_root, ref);
    if (!cached)
      return make_error("could not reach {} ({}), and {} is not in the Hugging Face cache at {}", settings.endpoint,
                        why, ref.describe(), repo_dir.string());
    spdlog::warn("could not reach {} ({}); {} is cached at {}, kept as it is", settings.endpoint, why, ref.describe(),
                 cached->dir.string());
    return PullResult{.snapshot = *cached, .offline = true};
  }

  std::vector<std::string> files;
  for (const std::string& file : info->files) {
    if (!inside_repository(file))
      return make_error("{}: the Hub listed a file outside the repository ('{}')", ref.describe(), file);
    if (matches_any(file, request.include)) files.push_back(file);
  }
  if (files.empty() && !request.include.empty())
    return make_error("no file of {} matches --include {} ({} files in the repository)", ref.describe(),
                      fmt::join(request.include, " --include "), info->files.size());

  PullResult result{.snapshot = {.dir = repo_dir / "snapshots" / info->commit, .commit = info->commit},
                    .files = int(files.size())};
  if (observer) observer(PullEvent{.kind = PullEvent::Kind::listed, .total = files.size()});
  for (const std::string& file : files) {
    const fs::path pointer = result.snapshot.dir / file;
    std::error_code ec;
    if (fs::exists(pointer, ec)) {  // already complete in the cache (a link to a finished blob)
      if (observer)
        observer(
            PullEvent{.kind = PullEvent::Kind::cached, .path = file, .total = uint64_t(fs::file_size(pointer, ec))});
      continue;
    }
    KILN_ASSIGN(const FileMeta meta, fetch_file_meta(session, ref.repo, info->commit, file));
    const fs::path blob = repo_dir / "blobs" / meta.etag;
    if (!fs::exists(blob, ec)) {
      fs::create_directories(blob.parent_path(), ec);
      KILN_ASSIGN(BlobLock lock,
                  BlobLock::take(settings.cache_root / ".locks" / repo_folder_name(ref.repo) / (meta.etag + ".lock")));
      if (!fs::exists(blob, ec)) {  // another process may have finished it while we waited
        const fs::path incomplete = blob.string() + ".incomplete";
        KILN_TRY(download_blob(session, meta, incomplete, file, observer, result.bytes));
        fs::rename(incomplete, blob, ec);
        if (ec) return make_error("cannot move {} into place: {}", incomplete.string(), ec.message());
        ++result.downloaded;
      }
    } else if (observer) {
      observer(PullEvent{.kind = PullEvent::Kind::cached, .path = file, .total = meta.size});
    }
    KILN_TRY(link_into_snapshot(blob, pointer));
  }
  // refs/ last, so that a pull cut short leaves no branch pointing at a partial snapshot
  if (ref.revision_or_main() != info->commit) KILN_TRY(write_ref(repo_dir, ref.revision_or_main(), info->commit));
  return result;
}

}  // namespace kiln::hub
