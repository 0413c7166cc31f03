// Unit tests of the engine's API and of the chat layer's loading rules: template reuse, limits,
// error reporting, Python number formatting, template selection and special tokens.
#include "jinja_test_util.h"
#include "text/chat_template.h"
#include "text/jinja/pystr.h"

namespace kiln::jinja::test {
namespace {

namespace fs = std::filesystem;

Result<std::string> render(const std::string& source, const Json& variables = Json::object(),
                           const RenderOptions& options = {}, TemplateFailure* failure = nullptr) {
  auto compiled = Template::parse(source, failure);
  if (!compiled) return compiled.error();
  return compiled->render(variables, options, failure);
}

TEST(JinjaApi, TemplateIsReusableAcrossRenders) {
  auto t =
      Template::parse("{% set ns = namespace(n=0) %}{% for x in xs %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->render({{"xs", {1, 2, 3}}}), "6");
  EXPECT_EQ(*t->render({{"xs", {10}}}), "10");
  EXPECT_EQ(*t->render(Json::object()), "0");
}

TEST(JinjaApi, RaiseExceptionMessageIsTheError) {
  TemplateFailure failure;
  auto result = render("line\n{{ raise_exception('Roles must alternate') }}", Json::object(), {}, &failure);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().message, "Roles must alternate");
  EXPECT_EQ(failure.kind, FailureKind::raised);
  EXPECT_EQ(failure.line, 2);
}

TEST(JinjaApi, SyntaxErrorsNameTheLine) {
  TemplateFailure failure;
  auto result = render("ok\n{% if %}", Json::object(), {}, &failure);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(failure.kind, FailureKind::syntax);
  EXPECT_EQ(failure.line, 2);
  EXPECT_EQ(result.error().message.rfind("template syntax error at line 2: ", 0), 0u) << result.error().message;
}

TEST(JinjaApi, VariablesMustBeAnObject) {
  auto t = Template::parse("x");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->render(Json::array()).ok());
  EXPECT_EQ(*t->render(Json()), "x");
}

TEST(JinjaLimits, OutputSizeIsBounded) {
  RenderOptions options;
  options.limits.max_output_bytes = 1000;
  TemplateFailure failure;
  EXPECT_FALSE(render("{% for i in range(100) %}{{ 'x' * 50 }}{% endfor %}", Json::object(), options, &failure).ok());
  EXPECT_EQ(failure.kind, FailureKind::limit);
  EXPECT_FALSE(render("{{ 'x' * 100000000000 }}", Json::object(), options, &failure).ok());
  EXPECT_EQ(failure.kind, FailureKind::limit);
}

// truncate as Python runs it: a huge length does not overflow, and a sequence that needs cutting
// fails as Python's str methods would on a tuple, instead of crashing.
TEST(JinjaLimits, TruncateTakesAnyLengthAndValue) {
  auto kept = render("{{ (122,)|truncate(9223372036854775807) }}", Json::object(), RenderOptions{}, nullptr);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, "(122,)");
  TemplateFailure failure;
  EXPECT_FALSE(render("{{ (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)|truncate(3, end='') }}", Json::object(),
                      RenderOptions{}, &failure)
                   .ok());
  EXPECT_EQ(failure.kind, FailureKind::runtime);
}

TEST(JinjaLimits, RunawayLoopsStop) {
  RenderOptions options;
  options.limits.max_steps = 100000;
  TemplateFailure failure;
  auto result = render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                       Json::object(), options, &failure);
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(failure.kind, FailureKind::limit);
}

TEST(JinjaLimits, InfiniteRecursionStops) {
  TemplateFailure failure;
  EXPECT_FALSE(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", Json::object(), {}, &failure).ok());
  EXPECT_EQ(failure.kind, FailureKind::limit);
  EXPECT_FALSE(render("{% for x in [1] recursive %}{{ loop([x]) }}{% endfor %}", Json::object(), {}, &failure).ok());
  EXPECT_EQ(failure.kind, FailureKind::limit);
}

TEST(JinjaLimits, DeepNestingIsASyntaxErrorNotACrash) {
  std::string deep(5000, '(');
  TemplateFailure failure;
  EXPECT_FALSE(render("{{ " + deep + "1" + std::string(5000, ')') + " }}", Json::object(), {}, &failure).ok());
  EXPECT_EQ(failure.kind, FailureKind::syntax);
  std::string chain = "{{ 1";
  for (int i = 0; i < 5000; ++i) chain += " + 1";
  EXPECT_FALSE(render(chain + " }}", Json::object(), {}, &failure).ok());
  std::string blocks;
  for (int i = 0; i < 1000; ++i) blocks += "{% if true %}";
  EXPECT_FALSE(render(blocks, Json::object(), {}, &failure).ok());
}

// `depth` arrays nested in one another, built by the parser (building it in C++ would recurse).
Json nested_lists(int depth) {
  return Json::parse(std::string(size_t(depth), '[') + std::string(size_t(depth), ']'));
}

// Variables are converted to values with a bounded recursion: what is nested deeper than values may
// nest is a limit error, however deep it goes, not a stack overflow.
TEST(JinjaLimits, DeeplyNestedVariablesAreALimitErrorNotACrash) {
  auto t = Template::parse("{{ xs|length }}");
  ASSERT_TRUE(t.ok());
  for (int depth : {256, 257, 100000}) {
    Json variables = Json::object();
    variables["xs"] = nested_lists(depth);
    TemplateFailure failure;
    auto result = t->render(variables, {}, &failure);
    if (depth <= 256) {
      EXPECT_EQ(*result, "1");
      continue;
    }
    ASSERT_FALSE(result.ok()) << depth;
    EXPECT_EQ(failure.kind, FailureKind::limit);
    EXPECT_EQ(result.error().message, "template error: values nested deeper than kiln's limit of 256");
    EXPECT_FALSE(Template::check_depth(variables["xs"]).ok());
  }
  EXPECT_TRUE(Template::check_depth(nested_lists(256)).ok());
  EXPECT_TRUE(Template::check_depth(Json::parse(R"({"a": [{"b": 1}], "c": "[[["})")).ok());
}

TEST(JinjaLimits, SelfReferencingNamespacesAreReleased) {
  auto t = Template::parse("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns.self.self is defined }}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->render(Json::object()), "True");
}

TEST(PythonFormatting, FloatRepr) {
  EXPECT_EQ(py::float_repr(0.1), "0.1");
  EXPECT_EQ(py::float_repr(1e16), "1e+16");
  EXPECT_EQ(py::float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(py::float_repr(1e-5), "1e-05");
  EXPECT_EQ(py::float_repr(0.0001), "0.0001");
  EXPECT_EQ(py::float_repr(-0.0), "-0.0");
  EXPECT_EQ(py::float_repr(5e-324), "5e-324");
  EXPECT_EQ(py::float_repr(1.7976931348623157e308), "1.7976931348623157e+308");
  EXPECT_EQ(py::float_repr(0.1 + 0.2), "0.30000000000000004");
}

TEST(PythonFormatting, StringRepr) {
  EXPECT_EQ(py::repr("it's"), "\"it's\"");
  EXPECT_EQ(py::repr("a'b\"c"), "'a\\'b\"c'");
  EXPECT_EQ(py::repr("\t\n\x01\u00e9\u200b"), "'\\t\\n\\x01\u00e9\\u200b'");
}

// --- the chat layer ------------------------------------------------------------------------------

class ChatLayer : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kiln_chat_layer_" + std::string(testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  fs::path dir_;
};

TEST_F(ChatLayer, NamedTemplatesPickToolUseWhenToolsAreGiven) {
  ChatTemplate chat = ChatTemplate::from_named_sources({{"default", "D"}, {"tool_use", "T"}}, Json::object());
  ChatRequest request;
  EXPECT_EQ(*chat.render(request), "D");
  request.tools = Json::array();  // tools=[] is "given" for the selection, as in transformers
  EXPECT_EQ(*chat.render(request), "T");
}

TEST_F(ChatLayer, NamedTemplatesWithoutDefaultAreAnError) {
  ChatTemplate chat = ChatTemplate::from_named_sources({{"rag", "R"}}, Json::object());
  auto result = chat.render(ChatRequest{});
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error().message.find("Available template names are [rag]"), std::string::npos);
}

TEST_F(ChatLayer, ListFormInTokenizerConfig) {
  write(
      "tokenizer_config.json",
      R"({"chat_template": [{"name": "default", "template": "d{{ bos_token }}"}, {"name": "tool_use", "template": "t{{ tools|length }}"}], "bos_token": "<s>"})");
  auto chat = ChatTemplate::load(dir_.string());
  ASSERT_TRUE(chat.ok()) << chat.error().message;
  ChatRequest request;
  EXPECT_EQ(*chat->render(request), "d<s>");
  request.tools = Json::array({Json::object()});
  EXPECT_EQ(*chat->render(request), "t1");
}

TEST_F(ChatLayer, MissingTemplateIsAnError) {
  write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  auto chat = ChatTemplate::load(dir_.string());
  ASSERT_TRUE(chat.ok());
  EXPECT_FALSE(chat->render(ChatRequest{}).ok());
}

TEST_F(ChatLayer, SpecialTokensAndTheirOverrides) {
  write(
      "tokenizer_config.json",
      R"({"chat_template": "x", "bos_token": {"content": "<bos>", "lstrip": false}, "eos_token": "<eos>", "unk_token": null, "pad_token": "<pad>", "additional_special_tokens": ["<a>"], "boi_token": "<img>"})");
  write("special_tokens_map.json", R"({"eos_token": {"content": "<end>"}, "pad_token": null})");
  auto chat = ChatTemplate::load(dir_.string());
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->special_tokens(), Json({{"bos_token", "<bos>"}, {"eos_token", "<end>"}}));
}

TEST_F(ChatLayer, TemplateVariables) {
  ChatTemplate chat = ChatTemplate::from_source("", Json({{"bos_token", "<s>"}}));
  ChatRequest request;
  request.messages = Json::array({{{"role", "user"}, {"content", "hi"}}});
  request.add_generation_prompt = false;
  request.extra_variables = {{"enable_thinking", false}, {"bos_token", "override"}};
  Json vars = chat.variables(request);
  EXPECT_EQ(vars["tools"], Json());
  EXPECT_EQ(vars["documents"], Json());
  EXPECT_EQ(vars["add_generation_prompt"], false);
  EXPECT_EQ(vars["bos_token"], "override");
  EXPECT_EQ(vars["enable_thinking"], false);
}

// The request's JSON is checked before it is copied into the variables (a copy recurses too).
TEST_F(ChatLayer, DeeplyNestedMessagesToolsAndKwargsAreRefused) {
  ChatTemplate chat = ChatTemplate::from_source("{{ messages|length }}", Json::object());
  for (const char* where : {"messages", "tools", "kwargs"}) {
    ChatRequest request;
    Json deep = nested_lists(100000);
    if (std::string(where) == "messages")
      request.messages = std::move(deep);
    else if (std::string(where) == "tools")
      request.tools = std::move(deep);
    else
      request.extra_variables["deep"] = std::move(deep);
    TemplateFailure failure;
    auto result = chat.render(request, {}, &failure);
    ASSERT_FALSE(result.ok()) << where;
    EXPECT_EQ(result.error().message, "template error: values nested deeper than kiln's limit of 256") << where;
    EXPECT_EQ(failure.kind, FailureKind::limit);
  }
}

TEST_F(ChatLayer, TemplateSyntaxErrorSurfacesAtRender) {
  write("chat_template.jinja", "{% if %}");
  auto chat = ChatTemplate::load(dir_.string());
  ASSERT_TRUE(chat.ok());
  auto result = chat->render(ChatRequest{});
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error().message.find("syntax error"), std::string::npos);
}

}  // namespace
}  // namespace kiln::jinja::test
