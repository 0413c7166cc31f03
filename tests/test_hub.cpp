// Models by name: `kiln pull` against a mock of the Hugging Face Hub's HTTP endpoints (served from
// this process on a random loopback port), the cache it writes checked against huggingface_hub's
// layout, and commands that take a model run on a repository id from that cache.
#include <httplib.h>
#include <openssl/evp.h>
#include <signal.h>
#include <spawn.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "hub/hub_cache.h"
#include "hub/hub_client.h"
#include "io/checkpoint_summary.h"
#include "io/safetensors.h"
#include "test_util.h"

extern char** environ;

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string hex_digest(const EVP_MD* md, const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(data.data(), data.size(), digest, &length, md, nullptr);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}
std::string sha256(const std::string& data) {
  return hex_digest(EVP_sha256(), data);
}
// What git names a file: sha1 over "blob SIZE\0" and the bytes.
std::string git_blob_sha1(const std::string& data) {
  return hex_digest(EVP_sha1(), "blob " + std::to_string(data.size()) + std::string(1, '\0') + data);
}

const std::string kCommitMain = "1111111111111111111111111111111111111111";
const std::string kCommitDev = "2222222222222222222222222222222222222222";
const std::string kCommitCorrupt = "3333333333333333333333333333333333333333";
const std::string kToken = "hf_secret_for_tests";

struct MockFile {
  std::string path;
  std::string content;
  bool lfs = false;
  std::string served;  // bytes the CDN sends instead of `content` (a corrupt download)
  std::string etag() const { return lfs ? sha256(content) : git_blob_sha1(content); }
};

// The Hub's endpoints as huggingface_hub uses them: the revision API, HEAD/GET resolve (LFS files
// redirected to a CDN path with X-Linked-Etag and X-Linked-Size) and the CDN, which honours Range.
class MockHub {
 public:
  MockHub() {
    const std::string dense = fixture_path("qwen3_5_dense");
    const std::string bundled = source_dir() + "/models/kiln-kjv-31m";
    const std::vector<MockFile> main_files = {
        {.path = ".gitattributes", .content = "*.safetensors filter=lfs diff=lfs merge=lfs -text\n"},
        {.path = "README.md", .content = "# tiny\n"},
        {.path = "config.json", .content = read_file(dense + "/config.json")},
        {.path = "model.safetensors", .content = read_file(dense + "/model.safetensors"), .lfs = true},
        {.path = "tokenizer.json", .content = read_file(bundled + "/tokenizer.json")},
        {.path = "tokenizer_config.json", .content = read_file(bundled + "/tokenizer_config.json")},
        {.path = "extra/notes.txt", .content = "notes in a folder\n"},
        {.path = "extra/.keep", .content = ""},
    };
    std::vector<MockFile> dev_files = main_files;
    dev_files[1].content = "# tiny, the dev branch\n";
    repos_["kiln-test/tiny"] = {.branches = {{"main", kCommitMain}, {"dev", kCommitDev}},
                                .commits = {{kCommitMain, main_files}, {kCommitDev, dev_files}}};
    repos_["kiln-test/private"] = {
        .branches = {{"main", kCommitMain}}, .commits = {{kCommitMain, main_files}}, .private_repo = true};
    MockFile bad = main_files[3];
    bad.served = bad.content;
    bad.served[bad.served.size() / 2] ^= 0x5a;  // one byte flipped on the way
    repos_["kiln-test/corrupt"] = {.branches = {{"main", kCommitCorrupt}},
                                   .commits = {{kCommitCorrupt, {main_files[2], bad}}}};

    repos_["kiln-test/escape"] = {.branches = {{"main", kCommitMain}},
                                  .commits = {{kCommitMain, {{.path = "../../../outside.txt", .content = "x"}}}}};

    server_.Get(R"(/api/models/([^/]+)/([^/]+)/revision/(.+))",
                [this](const httplib::Request& req, httplib::Response& res) { revision(req, res); });
    server_.Get(R"(/([^/]+)/([^/]+)/resolve/([^/]+)/(.+))",
                [this](const httplib::Request& req, httplib::Response& res) { resolve(req, res); });
    server_.Get(R"(/cdn/([^/]+)/([0-9a-f]{64}))",
                [this](const httplib::Request& req, httplib::Response& res) { cdn(req, res); });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~MockHub() {
    server_.stop();
    thread_.join();
  }

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // The next CDN download of the blob whose etag is given closes the connection halfway.
  void cut_once(const std::string& etag) {
    std::lock_guard<std::mutex> lock(mutex_);
    cut_ = etag;
  }
  std::vector<std::string> ranges_seen() {
    std::lock_guard<std::mutex> lock(mutex_);
    return ranges_;
  }
  int downloads() const { return downloads_; }
  const MockFile& file(const std::string& repo, const std::string& commit, const std::string& path) const {
    for (const MockFile& f : repos_.at(repo).commits.at(commit))
      if (f.path == path) return f;
    throw std::runtime_error("no file " + path);
  }

 private:
  struct Repo {
    std::map<std::string, std::string> branches;
    std::map<std::string, std::vector<MockFile>> commits;
    bool private_repo = false;
  };

  // The repository, or nothing after answering 401/404 as the Hub does.
  const Repo* find_repo(const httplib::Request& req, httplib::Response& res, const std::string& repo) const {
    auto it = repos_.find(repo);
    if (it != repos_.end() && it->second.private_repo && req.get_header_value("Authorization") != "Bearer " + kToken)
      it = repos_.end();
    if (it == repos_.end()) {
      res.status = req.has_header("Authorization") ? 404 : 401;
      res.set_header("X-Error-Code", "RepoNotFound");
      res.set_content(R"({"error":"Repository not found"})", "application/json");
      return nullptr;
    }
    return &it->second;
  }

  void revision(const httplib::Request& req, httplib::Response& res) {
    const Repo* repo = find_repo(req, res, req.matches[1].str() + "/" + req.matches[2].str());
    if (!repo) return;
    std::string commit = req.matches[3];
    if (auto b = repo->branches.find(commit); b != repo->branches.end()) commit = b->second;
    auto c = repo->commits.find(commit);
    if (c == repo->commits.end()) {
      res.status = 404;
      res.set_header("X-Error-Code", "RevisionNotFound");
      res.set_content(R"({"error":"Invalid rev id"})", "application/json");
      return;
    }
    nlohmann::json siblings = nlohmann::json::array();
    for (const MockFile& f : c->second) siblings.push_back({{"rfilename", f.path}});
    res.set_content(
        nlohmann::json{
            {"id", req.matches[1].str() + "/" + req.matches[2].str()}, {"sha", commit}, {"siblings", siblings}}
            .dump(),
        "application/json");
  }

  void resolve(const httplib::Request& req, httplib::Response& res) {
    const std::string name = req.matches[1].str() + "/" + req.matches[2].str();
    const Repo* repo = find_repo(req, res, name);
    if (!repo) return;
    std::string commit = req.matches[3];
    if (auto b = repo->branches.find(commit); b != repo->branches.end()) commit = b->second;
    auto c = repo->commits.find(commit);
    const MockFile* file = nullptr;
    if (c != repo->commits.end())
      for (const MockFile& f : c->second)
        if (f.path == req.matches[4].str()) file = &f;
    if (!file) {
      res.status = 404;
      res.set_header("X-Error-Code", "EntryNotFound");
      return;
    }
    res.set_header("X-Repo-Commit", commit);
    if (file->lfs) {
      res.set_header("X-Linked-Etag", "\"" + file->etag() + "\"");
      res.set_header("X-Linked-Size", std::to_string(file->content.size()));
      res.set_header("ETag", "\"" + git_blob_sha1("pointer " + file->path) + "\"");
      std::lock_guard<std::mutex> lock(mutex_);
      cdn_[name + "/" + file->etag()] = file->served.empty() ? file->content : file->served;
      res.set_redirect(endpoint() + "/cdn/" + name.substr(name.find('/') + 1) + "/" + file->etag(), 302);
      return;
    }
    res.set_header("ETag", "\"" + file->etag() + "\"");
    if (req.method == "GET") ++downloads_;
    res.set_content(file->content, "application/octet-stream");
  }

  void cdn(const httplib::Request& req, httplib::Response& res) {
    const std::string etag = req.matches[2];
    std::string bytes;
    bool cut = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& [key, content] : cdn_)
        if (key.size() >= etag.size() && key.compare(key.size() - etag.size(), etag.size(), etag) == 0 &&
            key.find("/" + req.matches[1].str() + "/") != std::string::npos)
          bytes = content;
      if (req.has_header("Range")) ranges_.push_back(req.get_header_value("Range"));
      cut = cut_ == etag;
      if (cut) cut_.clear();
    }
    if (bytes.empty()) {
      res.status = 404;
      return;
    }
    ++downloads_;
    auto shared = std::make_shared<std::string>(std::move(bytes));
    res.set_content_provider(shared->size(), "application/octet-stream",
                             [shared, cut](size_t offset, size_t length, httplib::DataSink& sink) {
                               if (cut) {  // half the bytes, then the connection drops
                                 sink.write(shared->data() + offset, shared->size() / 2 - offset);
                                 return false;
                               }
                               sink.write(shared->data() + offset, length);
                               return true;
                             });
  }

  std::map<std::string, Repo> repos_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mutex_;
  std::map<std::string, std::string> cdn_;
  std::vector<std::string> ranges_;
  std::string cut_;
  std::atomic<int> downloads_{0};
};

class Hub : public testing::Test {
 protected:
  void SetUp() override { cache_ = tmp_.path() + "/hub-cache"; }

  // The environment kiln runs under: the mock as endpoint, a fresh cache, no token, no proxy.
  std::string environment(const std::string& endpoint, const std::string& extra = "") const {
    return "env -u HF_TOKEN -u HUGGING_FACE_HUB_TOKEN -u HF_HOME -u HUGGINGFACE_HUB_CACHE -u http_proxy -u "
           "HTTP_PROXY -u https_proxy -u HTTPS_PROXY -u all_proxy -u ALL_PROXY HF_TOKEN_PATH=" +
           tmp_.path() + "/no-token HF_ENDPOINT=" + endpoint + " HF_HUB_CACHE=" + cache_ + " " + extra + " ";
  }
  CommandResult kiln(const std::string& args, const std::string& extra_env = "", bool with_stderr = true) const {
    return run_command(environment(hub_.endpoint(), extra_env) + KILN_BINARY + " " + args, with_stderr);
  }
  std::string repo_dir(const std::string& repo = "kiln-test/tiny") const {
    return cache_ + "/" + hub::repo_folder_name(repo);
  }
  // The last line of a command's output.
  static std::string last_line(std::string text) {
    while (!text.empty() && text.back() == '\n') text.pop_back();
    return text.substr(text.rfind('\n') + 1);
  }
  static int lines(const std::string& text) { return int(std::count(text.begin(), text.end(), '\n')); }

  MockHub hub_;
  TempDir tmp_;
  std::string cache_;
};

TEST_F(Hub, PullLaysOutTheCacheAsHuggingfaceHub) {
  const auto r = kiln("pull kiln-test/tiny");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string repo = repo_dir();
  EXPECT_EQ(last_line(r.output), repo + "/snapshots/" + kCommitMain);
  EXPECT_EQ(read_file(repo + "/refs/main"), kCommitMain);  // no newline
  for (const char* path : {".gitattributes", "README.md", "config.json", "model.safetensors", "tokenizer.json",
                           "tokenizer_config.json", "extra/notes.txt", "extra/.keep"}) {
    SCOPED_TRACE(path);
    const MockFile& want = hub_.file("kiln-test/tiny", kCommitMain, path);
    const fs::path pointer = fs::path(repo) / "snapshots" / kCommitMain / path;
    ASSERT_TRUE(fs::is_symlink(pointer));
    const std::string up = std::string(path).find('/') != std::string::npos ? "../../../" : "../../";
    EXPECT_EQ(fs::read_symlink(pointer).string(), up + "blobs/" + want.etag());
    EXPECT_EQ(read_file(repo + "/blobs/" + want.etag()), want.content);
  }
  // the LFS file is stored under its sha256, the others under their git blob sha1
  EXPECT_EQ(hub_.file("kiln-test/tiny", kCommitMain, "model.safetensors").etag(),
            sha256(read_file(fixture_path("qwen3_5_dense") + "/model.safetensors")));
  EXPECT_EQ(std::distance(fs::directory_iterator(repo + "/blobs"), fs::directory_iterator()), 8);

  // a second pull finds everything in place and downloads nothing
  const int before = hub_.downloads();
  const auto again = kiln("pull kiln-test/tiny");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(hub_.downloads(), before);
  EXPECT_NE(again.output.find("0 downloaded"), std::string::npos) << again.output;
}

TEST_F(Hub, CommandsRunFromTheCacheByName) {
  ASSERT_EQ(kiln("pull kiln-test/tiny").exit_code, 0);
  const std::string out = tmp_.path() + "/logits.npy";
  const auto ids = fixture_ids("qwen3_5_dense");
  std::string csv;
  for (int32_t id : ids) csv += (csv.empty() ? "" : ",") + std::to_string(id);
  const auto r = kiln("logits kiln-test/tiny --ids " + csv + " --out " + out + " --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto got = read_npy(out);
  auto want = read_npy(fixture_path("qwen3_5_dense") + "/logits.npy");
  ASSERT_TRUE(got.ok() && want.ok());
  ASSERT_EQ(got->shape, want->shape);
  EXPECT_LE(compare_logits(got->f32.data(), want->f32.data(), want->shape[0], want->shape[1]).relative(), 1e-4);

  const std::string text = " --text 'In the beginning God created the heaven and the earth.'";
  const auto by_id = kiln("tokenize kiln-test/tiny" + text, "", false);
  const auto by_dir =
      run_command(std::string(KILN_BINARY) + " tokenize " + source_dir() + "/models/kiln-kjv-31m" + text, false);
  ASSERT_EQ(by_id.exit_code, 0) << by_id.output;
  EXPECT_EQ(by_id.output, by_dir.output);

  // a directory of that path wins over the cache
  const fs::path work = fs::path(tmp_.path()) / "work";
  fs::create_directories(work / "kiln-test/tiny");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy(source_dir() + "/models/kiln-kjv-31m/" + f, work / "kiln-test/tiny" / f);
  const auto local =
      run_command("cd " + work.string() + " && " + environment(hub_.endpoint(), "HF_HUB_CACHE=/nonexistent") +
                      KILN_BINARY + " tokenize kiln-test/tiny" + text,
                  false);
  EXPECT_EQ(local.exit_code, 0) << local.output;
  EXPECT_EQ(local.output, by_dir.output);
}

TEST_F(Hub, NotCachedNamesTheCacheAndSuggestsPull) {
  const auto r = kiln("tokenize kiln-test/tiny --text hi");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(lines(r.output), 1) << r.output;
  EXPECT_NE(r.output.find("kiln: error: kiln-test/tiny is not a directory"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(repo_dir()), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kiln pull kiln-test/tiny"), std::string::npos) << r.output;
}

TEST_F(Hub, ResumesACutDownloadWithARange) {
  const MockFile& weights = hub_.file("kiln-test/tiny", kCommitMain, "model.safetensors");
  hub_.cut_once(weights.etag());
  const auto first = kiln("pull kiln-test/tiny");
  EXPECT_NE(first.exit_code, 0);
  EXPECT_NE(first.output.find("kiln: error: model.safetensors: the download stopped at"), std::string::npos)
      << first.output;
  const std::string incomplete = repo_dir() + "/blobs/" + weights.etag() + ".incomplete";
  ASSERT_TRUE(fs::exists(incomplete));
  const size_t partial = fs::file_size(incomplete);
  EXPECT_GT(partial, 0u);
  EXPECT_LT(partial, weights.content.size());
  EXPECT_FALSE(fs::exists(repo_dir() + "/refs/main"));  // no branch points at a partial snapshot

  const auto second = kiln("pull kiln-test/tiny");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const auto ranges = hub_.ranges_seen();
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0], "bytes=" + std::to_string(partial) + "-");
  EXPECT_FALSE(fs::exists(incomplete));
  EXPECT_EQ(read_file(repo_dir() + "/blobs/" + weights.etag()), weights.content);
  EXPECT_EQ(read_file(repo_dir() + "/refs/main"), kCommitMain);
}

TEST_F(Hub, AWrongChecksumIsRefused) {
  const auto r = kiln("pull kiln-test/corrupt");
  EXPECT_NE(r.exit_code, 0);
  const std::string etag = sha256(read_file(fixture_path("qwen3_5_dense") + "/model.safetensors"));
  EXPECT_NE(r.output.find("kiln: error: model.safetensors: checksum mismatch"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(etag), std::string::npos) << r.output;
  const std::string blob = repo_dir("kiln-test/corrupt") + "/blobs/" + etag;
  EXPECT_TRUE(fs::exists(blob + ".incomplete"));
  EXPECT_FALSE(fs::exists(blob));
  EXPECT_FALSE(
      fs::exists(fs::path(repo_dir("kiln-test/corrupt")) / "snapshots" / kCommitCorrupt / "model.safetensors"));
}

TEST_F(Hub, UnauthorizedAndNotFoundAreOneLine) {
  const auto unauthorized = kiln("pull kiln-test/private");
  EXPECT_NE(unauthorized.exit_code, 0);
  EXPECT_EQ(lines(unauthorized.output.substr(unauthorized.output.find("kiln: error:"))), 1) << unauthorized.output;
  EXPECT_NE(unauthorized.output.find("401"), std::string::npos) << unauthorized.output;
  EXPECT_NE(unauthorized.output.find("HF_TOKEN"), std::string::npos) << unauthorized.output;

  EXPECT_EQ(kiln("pull kiln-test/private", "HF_TOKEN=" + kToken).exit_code, 0);
  std::ofstream(tmp_.path() + "/token") << kToken << "\n";
  const auto from_file = kiln("pull kiln-test/private", "HF_TOKEN_PATH=" + tmp_.path() + "/token");
  EXPECT_EQ(from_file.exit_code, 0) << from_file.output;
  const auto refused = kiln("pull kiln-test/private", "HF_TOKEN=hf_wrong");
  EXPECT_NE(refused.exit_code, 0);

  const auto missing = kiln("pull kiln-test/missing");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("kiln: error: kiln-test/missing: "), std::string::npos) << missing.output;
  const auto no_revision = kiln("pull kiln-test/tiny@nope");
  EXPECT_NE(no_revision.exit_code, 0);
  EXPECT_NE(no_revision.output.find("kiln: error: kiln-test/tiny@nope: no such revision"), std::string::npos)
      << no_revision.output;
  const auto escape = kiln("pull kiln-test/escape");
  EXPECT_NE(escape.output.find("kiln: error: kiln-test/escape: the Hub listed a file outside the repository"),
            std::string::npos)
      << escape.output;
  const auto not_an_id = kiln("pull not-an-id");
  EXPECT_NE(not_an_id.output.find("is not a repository id"), std::string::npos) << not_an_id.output;
}

TEST_F(Hub, RevisionsByBranchAndByCommit) {
  const auto dev = kiln("pull kiln-test/tiny@dev");
  ASSERT_EQ(dev.exit_code, 0) << dev.output;
  EXPECT_EQ(read_file(repo_dir() + "/refs/dev"), kCommitDev);
  EXPECT_FALSE(fs::exists(repo_dir() + "/refs/main"));
  EXPECT_EQ(read_file(repo_dir() + "/snapshots/" + kCommitDev + "/README.md"), "# tiny, the dev branch\n");

  const auto by_commit = kiln("pull kiln-test/tiny@" + kCommitMain);
  ASSERT_EQ(by_commit.exit_code, 0) << by_commit.output;
  EXPECT_EQ(read_file(repo_dir() + "/snapshots/" + kCommitMain + "/README.md"), "# tiny\n");
  EXPECT_FALSE(fs::exists(repo_dir() + "/refs/main"));  // a commit is no branch
  EXPECT_EQ(std::distance(fs::directory_iterator(repo_dir() + "/refs"), fs::directory_iterator()), 1);

  const std::string text = " --text 'And God said'";
  for (const std::string& name : {std::string("kiln-test/tiny@dev"), "kiln-test/tiny@" + kCommitMain}) {
    const auto r = kiln("tokenize " + name + text);
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.output;
  }
  const auto main = kiln("tokenize kiln-test/tiny" + text);  // main itself was never pulled
  EXPECT_NE(main.exit_code, 0);
  EXPECT_NE(main.output.find("revision 'main' of kiln-test/tiny is not in the Hugging Face cache"), std::string::npos)
      << main.output;
}

TEST_F(Hub, IncludeFiltersAsFnmatch) {
  const auto json = kiln("pull kiln-test/tiny --include '*.json' --include 'extra/'");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  std::vector<std::string> got;
  const fs::path snapshot = fs::path(repo_dir()) / "snapshots" / kCommitMain;
  for (const auto& e : fs::recursive_directory_iterator(snapshot))
    if (!e.is_directory()) got.push_back(e.path().lexically_relative(snapshot).string());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::string>{"config.json", "extra/.keep", "extra/notes.txt", "tokenizer.json",
                                           "tokenizer_config.json"}));
  const auto none = kiln("pull kiln-test/tiny --include '*.gguf'");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.output.find("no file of kiln-test/tiny matches --include *.gguf"), std::string::npos) << none.output;
}

TEST_F(Hub, UnreachableEndpointNamesTheEndpointAndTheCache) {
  const std::string closed = "http://127.0.0.1:1";
  const auto r = run_command(environment(closed) + KILN_BINARY + " pull kiln-test/tiny");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("could not reach " + closed), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not in the Hugging Face cache at " + repo_dir()), std::string::npos) << r.output;

  // with the revision cached, the pull keeps that copy and says so
  ASSERT_EQ(kiln("pull kiln-test/tiny").exit_code, 0);
  const auto offline = run_command(environment(closed) + KILN_BINARY + " pull kiln-test/tiny");
  EXPECT_EQ(offline.exit_code, 0) << offline.output;
  EXPECT_EQ(last_line(offline.output), repo_dir() + "/snapshots/" + kCommitMain);
  const auto told = kiln("pull kiln-test/tiny@dev", "HF_HUB_OFFLINE=1");
  EXPECT_NE(told.exit_code, 0);
  EXPECT_NE(told.output.find("HF_HUB_OFFLINE is set, and kiln-test/tiny@dev is not in the Hugging Face cache"),
            std::string::npos)
      << told.output;
}

TEST_F(Hub, LsListsThePulledModel) {
  const auto empty = kiln("ls --json", "", false);
  ASSERT_EQ(empty.exit_code, 0) << empty.output;
  EXPECT_EQ(nlohmann::json::parse(empty.output), nlohmann::json::array());
  ASSERT_EQ(kiln("pull kiln-test/tiny").exit_code, 0);
  ASSERT_EQ(kiln("pull kiln-test/tiny@dev").exit_code, 0);

  const auto table = kiln("ls", "", false);
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("MODEL_TYPE"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("kiln-test/tiny"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("main→1111111, dev→2222222"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("qwen3_5_text"), std::string::npos) << table.output;

  const auto listing = kiln("ls --json", "", false);
  ASSERT_EQ(listing.exit_code, 0) << listing.output;
  const auto json = nlohmann::json::parse(listing.output);
  ASSERT_EQ(json.size(), 1u);
  const auto& model = json[0];
  EXPECT_EQ(model["id"], "kiln-test/tiny");
  EXPECT_EQ(model["model_type"], "qwen3_5_text");
  EXPECT_EQ(model["quantization"], "f32");
  EXPECT_EQ(model["runs"], "text");
  uint64_t blobs = 0;
  for (const auto& e : fs::directory_iterator(repo_dir() + "/blobs")) blobs += fs::file_size(e.path());
  EXPECT_EQ(model["size_bytes"], blobs);
  int64_t parameters = 0;
  auto weights = SafetensorsFile::open(fixture_path("qwen3_5_dense") + "/model.safetensors");
  ASSERT_TRUE(weights.ok());
  for (const auto& t : (*weights)->tensors()) parameters += t.shape.numel();
  EXPECT_EQ(model["parameters"], parameters);
  ASSERT_EQ(model["revisions"].size(), 2u);
  EXPECT_EQ(model["revisions"][0]["refs"], nlohmann::json::array({"main"}));
}

// An MLX-quantized checkpoint counts the parameters of the model it was quantized from, mixed
// bits per module included.
TEST(CheckpointSummary, CountsPackedWeightsUnpacked) {
  struct Case {
    const char *packed, *plain, *quantization, *plain_dtype, *model_type;
  };
  for (const Case& c :
       {Case{"q4g64_qwen3_5_dense", "qwen3_5_dense", "mlx 4-bit g64", "f32", "qwen3_5_text"},
        Case{"q4g32_qwen3_5_moe", "qwen3_5_moe", "mlx mixed 4/8-bit g32/64", "f32", "qwen3_5_moe/qwen3_5_moe_text"},
        Case{"qmixed_qwen3_5_untied", "qwen3_5_untied_mlx", "mlx mixed 4/5/6/8-bit g32/64", "bf16",
             "qwen3_5/qwen3_5_text"}}) {
    SCOPED_TRACE(c.packed);
    auto plain = summarize_checkpoint(fixture_path(c.plain));
    auto packed = summarize_checkpoint(fixture_path(c.packed));
    ASSERT_TRUE(plain.ok() && packed.ok());
    int64_t parameters = 0;  // the reference: every tensor's elements
    for (const auto& entry : fs::directory_iterator(fixture_path(c.plain))) {
      if (entry.path().extension() != ".safetensors") continue;
      auto file = SafetensorsFile::open(entry.path().string());
      ASSERT_TRUE(file.ok());
      for (const auto& t : (*file)->tensors()) parameters += t.shape.numel();
    }
    EXPECT_EQ(plain->parameters, parameters);
    EXPECT_EQ(packed->parameters, parameters);
    EXPECT_EQ(packed->quantization, c.quantization);
    EXPECT_EQ(plain->quantization, c.plain_dtype);
    EXPECT_EQ(packed->model_type, c.model_type);
  }
}

// Starts `kiln serve` on a free port and returns the URL it prints.
struct ServeProcess {
  pid_t pid = -1;
  std::string url;
  ~ServeProcess() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      int status = 0;
      waitpid(pid, &status, 0);
    }
  }
};

TEST_F(Hub, ServeNamesTheModelByItsId) {
  ASSERT_EQ(kiln("pull kiln-test/tiny").exit_code, 0);
  const std::string log = tmp_.path() + "/serve.log";
  ServeProcess serve;
  const std::string command = "exec " + environment(hub_.endpoint()) + KILN_BINARY +
                              " serve kiln-test/tiny --port 0 --device cpu --threads 1 --ctx 64 --max-batch 2 >" + log +
                              " 2>&1";
  const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
  ASSERT_EQ(posix_spawn(&serve.pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  for (int i = 0; i < 300 && serve.url.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const std::string text = read_file(log);
    const size_t at = text.find("http://");
    if (at != std::string::npos) serve.url = text.substr(at + 7, text.find_first_of(" \n", at) - at - 7);
  }
  ASSERT_FALSE(serve.url.empty()) << read_file(log);
  httplib::Client client("http://" + serve.url);
  const auto res = client.Get("/v1/models");
  ASSERT_TRUE(res) << read_file(log);
  ASSERT_EQ(res->status, 200);
  const auto models = nlohmann::json::parse(res->body);
  ASSERT_EQ(models["data"].size(), 1u);
  EXPECT_EQ(models["data"][0]["id"], "kiln-test/tiny");
  EXPECT_NE(read_file(log).find("(model kiln-test/tiny,"), std::string::npos) << read_file(log);
}

TEST(RepoRef, ParsesIdsAsTheHubNamesThem) {
  auto ref = hub::parse_repo_ref("Qwen/Qwen3.5-4B");
  ASSERT_TRUE(ref);
  EXPECT_EQ(ref->repo, "Qwen/Qwen3.5-4B");
  EXPECT_EQ(ref->revision_or_main(), "main");
  ref = hub::parse_repo_ref("google/gemma-4-e2b-it@refs/pr/1");
  ASSERT_TRUE(ref);
  EXPECT_EQ(ref->revision, "refs/pr/1");
  for (const char* bad : {"name", "a/b/c", "/abs/path", "./org/name", "org/-name", "org/na--me", "org/name@",
                          "org/name@../x", "org/name.git", "org/na me"})
    EXPECT_FALSE(hub::parse_repo_ref(bad)) << bad;
  EXPECT_EQ(hub::repo_folder_name("Qwen/Qwen3.5-4B"), "models--Qwen--Qwen3.5-4B");
  EXPECT_TRUE(hub::matches_any("model-00001-of-00002.safetensors", {"*.safetensors"}));
  EXPECT_TRUE(hub::matches_any("sub/dir/x.json", {"*.json"}));  // fnmatch's '*' crosses '/'
  EXPECT_TRUE(hub::matches_any("sub/x.bin", {"sub/"}));
  EXPECT_FALSE(hub::matches_any("config.json", {"*.safetensors", "tok*"}));
}

}  // namespace
}  // namespace kiln::test
