// kiln pull ORG/NAME[@REV] [--include GLOB]...
// Downloads a revision of a Hugging Face model repository into the Hugging Face cache, laid out as
// huggingface_hub lays it out (see hub/hub_client.h), and prints the snapshot directory. Progress
// goes to stderr: one updating line per file on a terminal, a line per file started and finished
// otherwise.
#include <fmt/format.h>
#include <unistd.h>

#include "cli/commands.h"
#include "hub/hub_client.h"

namespace kiln::cli {

namespace {

struct PullOptions {
  std::string repo;
  std::vector<std::string> include;
};

std::string format_bytes(double bytes) {
  if (bytes >= 1e9) return fmt::format("{:.2f} GB", bytes / 1e9);
  if (bytes >= 1e6) return fmt::format("{:.1f} MB", bytes / 1e6);
  if (bytes >= 1e3) return fmt::format("{:.1f} kB", bytes / 1e3);
  return fmt::format("{:.0f} B", bytes);
}

std::string format_seconds(double seconds) {
  const long s = long(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

// Shows a pull's progress on stderr.
class ProgressDisplay {
 public:
  explicit ProgressDisplay(bool terminal) : terminal_(terminal) {}

  void operator()(const hub::PullEvent& e) {
    using Kind = hub::PullEvent::Kind;
    switch (e.kind) {
      case Kind::listed:
        fmt::print(stderr, "{} files\n", e.total);
        break;
      case Kind::cached:
        fmt::print(stderr, "{}: in the cache ({})\n", e.path, format_bytes(double(e.total)));
        break;
      case Kind::started:
        resumed_ = e.done;
        if (terminal_)
          show(e);
        else if (e.done > 0)
          fmt::print(stderr, "{}: resuming at {} of {}\n", e.path, format_bytes(double(e.done)),
                     format_bytes(double(e.total)));
        else
          fmt::print(stderr, "{}: downloading {}\n", e.path, format_bytes(double(e.total)));
        break;
      case Kind::progress:
        if (terminal_) show(e);
        break;
      case Kind::finished:
        if (terminal_) fmt::print(stderr, "\r\033[K");
        fmt::print(stderr, "{}: {} in {:.1f} s ({}/s)\n", e.path, format_bytes(double(e.total)), e.seconds,
                   format_bytes(double(e.total - resumed_) / std::max(e.seconds, 1e-3)));
        break;
    }
    std::fflush(stderr);
  }

 private:
  // One line, rewritten in place: bytes, rate and time left.
  void show(const hub::PullEvent& e) const {
    const double rate = e.seconds > 0 ? double(e.done - resumed_) / e.seconds : 0;
    const std::string eta = rate > 0 ? format_seconds(double(e.total - e.done) / rate) : "--:--";
    fmt::print(stderr, "\r\033[K{}  {} / {}  {:3.0f}%  {}/s  ETA {}", e.path, format_bytes(double(e.done)),
               format_bytes(double(e.total)), e.total ? 100.0 * double(e.done) / double(e.total) : 100.0,
               format_bytes(rate), eta);
  }

  bool terminal_;
  uint64_t resumed_ = 0;
};

Status run_pull(const PullOptions& o, const Environment& env) {
  const auto ref = hub::parse_repo_ref(o.repo);
  if (!ref) return make_error("pull: '{}' is not a repository id (ORG/NAME or ORG/NAME@REVISION)", o.repo);
  ProgressDisplay display(::isatty(STDERR_FILENO) == 1);
  fmt::print(stderr, "pulling {} from {} into {}\n", ref->describe(), env.hub.endpoint, env.hub.cache_root.string());
  KILN_ASSIGN(const hub::PullResult result, hub::pull(env.hub, hub::PullRequest{.ref = *ref, .include = o.include},
                                                      [&display](const hub::PullEvent& e) { display(e); }));
  if (!result.offline)
    fmt::print(stderr, "{} at commit {}: {} files, {} downloaded ({})\n", ref->describe(), result.snapshot.commit,
               result.files, result.downloaded, format_bytes(double(result.bytes)));
  fmt::print("{}\n", result.snapshot.dir.string());
  return ok_status();
}

}  // namespace

void add_pull_command(CLI::App& app, Action& action, const Environment& env) {
  auto options = std::make_shared<PullOptions>();
  auto* cmd = app.add_subcommand("pull", "Download a Hugging Face model repository into the Hugging Face cache");
  cmd->add_option("repo", options->repo, "Repository id ORG/NAME[@REVISION] (a branch, tag or commit; default main)")
      ->required();
  cmd->add_option("--include", options->include,
                  "Download only the files matching this glob (fnmatch rules; repeatable; default: every file)")
      ->allow_extra_args(false);  // one glob per --include, so that a repository id after it stays one
  cmd->callback([options, &action, &env] { action = [options, &env] { return run_pull(*options, env); }; });
}

}  // namespace kiln::cli
