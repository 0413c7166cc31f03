// The Responses API's request checks, input items, output items with their stream events, and
// store, without a model: what a handler refuses and names, and what it builds.
#include <gtest/gtest.h>
#include <httplib.h>

#include <tuple>

#include "server/handlers.h"
#include "server/responses.h"
#include "server/service.h"
#include "server_request_util.h"

namespace kiln::server {
namespace {

using nlohmann::json;

// The Responses API's handler, with a store of its own.
void post_response(Service& service, const httplib::Request& req, httplib::Response& res) {
  static ResponseStore store;
  handle_responses(service, store, req, res);
}

TEST(ResponsesChecks, FieldsAreCheckedAndNamed) {
  const json hi = json::parse(R"({"model": "m", "input": "hi"})");
  const std::vector<std::tuple<std::string, std::string, std::string>> refused = {
      {"input", "3", "input"},
      {"input", R"([3])", "input[0]"},
      {"input", R"([{"role": "wizard", "content": "x"}])", "input[0].role"},
      {"input", R"([{"role": "user"}])", "input[0].content"},
      {"input", R"([{"role": "user", "content": 5}])", "input[0].content"},
      {"input", R"([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}])",
       "input[0].content[0].type"},
      {"input", R"([{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}])",
       "input[0].content[0].file_id"},
      {"input", R"([{"role": "user", "content": [{"type": "input_text", "text": 1}]}])", "input[0].content[0].text"},
      {"input", R"([{"role": "user", "content": [{"type": "output_text", "text": "x"}]}])", "input[0].content[0].type"},
      {"input", R"([{"role": "assistant", "content": [{"type": "input_image", "image_url": "data:,"}]}])",
       "input[0].content[0].type"},
      {"input", R"([{"type": "function_call", "name": "f", "arguments": "{}"}])", "input[0].call_id"},
      {"input", R"([{"type": "function_call", "call_id": "c", "arguments": "{}"}])", "input[0].name"},
      {"input", R"([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}])",
       "input[0].arguments"},
      {"input", R"([{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}])", "input[0].arguments"},
      {"input", R"([{"type": "function_call_output", "call_id": "c"}])", "input[0].output"},
      {"input", R"([{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]}])",
       "input[0].output[0]"},
      {"input", R"([{"type": "item_reference", "id": "msg_1"}])", "input[0]"},
      {"input", R"([{"type": "web_search_call", "id": "ws_1"}])", "input[0].type"},
      {"input", "[]", "input"},
      {"tools", R"([{"type": "web_search"}])", "tools[0].type"},
      {"tools", R"([{"name": "f"}])", "tools[0].type"},
      {"tools", R"([{"type": "function"}])", "tools[0].name"},
      {"tools", R"([{"type": "function", "name": "a b"}])", "tools[0].name"},
      {"tools", R"([{"type": "function", "name": "f"}, {"type": "function", "name": "f"}])", "tools[1].name"},
      {"tools", R"([{"type": "function", "name": "f", "parameters": "{}"}])", "tools[0].parameters"},
      {"tools", R"([{"type": "function", "name": "f", "strict": "yes"}])", "tools[0].strict"},
      {"tool_choice", R"("required")", "tool_choice"},
      {"tool_choice", R"("sometimes")", "tool_choice"},
      {"tool_choice", R"({"type": "file_search"})", "tool_choice"},
      {"tool_choice", R"({"type": "function"})", "tool_choice.name"},
      {"text", R"({"format": {"type": "json_schema", "name": "x", "schema": {}}})", "text.format"},
      {"text", R"({"format": {"type": "json_object"}})", "text.format"},
      {"text", R"({"verbosity": 1})", "text.verbosity"},
      {"reasoning", R"({"effort": "max"})", "reasoning.effort"},
      {"reasoning", R"("high")", "reasoning"},
      {"max_output_tokens", "0", "max_output_tokens"},
      {"temperature", "3", "temperature"},
      {"top_p", "\"x\"", "top_p"},
      {"parallel_tool_calls", "\"no\"", "parallel_tool_calls"},
      {"instructions", "[]", "instructions"},
      {"metadata", "[]", "metadata"},
      {"background", "true", "background"},
      {"conversation", R"("conv_1")", "conversation"},
      {"prompt", R"({"id": "pmpt_1"})", "prompt"},
      {"truncation", R"("auto")", "truncation"},
      {"top_logprobs", "2", "top_logprobs"},
      {"include", R"(["message.output_text.logprobs"])", "include"},
      {"stream_options", R"({"include_obfuscation": false})", "stream_options"},
      {"store", "\"yes\"", "store"},
      {"chat_template_kwargs", R"({"tools": []})", "chat_template_kwargs"},
      {"chat_template_kwargs", R"({"reasoning_effort": "bogus"})", "chat_template_kwargs.reasoning_effort"},
      {"previous_response_id", R"("resp_unknown")", "previous_response_id"},
  };
  for (const auto& [field, value, param] : refused) {
    const Answer a = post(post_response, with(hi, field, value));
    EXPECT_EQ(a.status, 400) << field << " " << value;
    EXPECT_EQ(a.param, param) << field << " " << value << ": " << a.message;
    EXPECT_NE(a.message.find("'" + param + "'"), std::string::npos) << a.message;
  }
  EXPECT_EQ(post(post_response, R"({"model": "m"})").param, "input");
  EXPECT_EQ(post(post_response, with(hi, "model", "\"other\"")).status, 404);
  EXPECT_EQ(post(post_response, with(hi, "tools", R"([{"type": "web_search"}])")).message,
            "'tools[0].type' 'web_search' is not supported: kiln serves function tools only");

  // what is valid passes
  const std::string weather =
      R"([{"type": "function", "name": "get_weather", "description": "Weather", "strict": true,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}])";
  for (const auto& [field, value] : std::vector<std::pair<std::string, std::string>>{
           {"input", R"([{"role": "developer", "content": "Be brief."}, {"type": "message", "role": "user",
              "content": [{"type": "input_text", "text": "hi"}]}, {"type": "reasoning", "id": "rs_1", "summary": [],
              "encrypted_content": "x"}, {"role": "assistant", "content": [{"type": "output_text", "text": "Hi",
              "annotations": []}, {"type": "refusal", "refusal": "no"}]}, {"type": "function_call", "id": "fc_1",
              "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}", "status": "completed"},
              {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "21"}]}])"},
           {"tools", weather},
           {"tool_choice", R"("none")"},
           {"tool_choice", R"("auto")"},
           {"reasoning", R"({"effort": "low", "summary": "auto"})"},
           {"text", R"({"format": {"type": "text"}, "verbosity": "low"})"},
           {"include", R"(["reasoning.encrypted_content"])"},
           {"metadata", R"({"session": "1"})"},
           {"store", "false"},
           {"truncation", R"("disabled")"},
           {"parallel_tool_calls", "false"},
           {"max_output_tokens", "16"},
           {"user", R"("u-1")"},
           {"service_tier", R"("auto")"},
           {"chat_template_kwargs", R"({"enable_thinking": false})"}})
    EXPECT_TRUE(passes_checks(post(post_response, with(hi, field, value)))) << field << " " << value;
  json with_tools = hi;
  with_tools["tools"] = json::parse(weather);
  for (const char* choice : {R"("required")", R"({"type": "function", "name": "get_weather"})",
                             R"({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function",
                                 "name": "get_weather"}]})"})
    EXPECT_TRUE(passes_checks(post(post_response, with(with_tools, "tool_choice", choice)))) << choice;
  const Answer missing = post(post_response, with(with_tools, "tool_choice", R"({"type": "function", "name": "f"})"));
  EXPECT_EQ(missing.param, "tool_choice");
  EXPECT_EQ(missing.message, "'tool_choice' names the function 'f', which is not among 'tools'");
}

// Items as a response's output lists them (and as clients send them back) become the chat
// messages of the turns they were: one assistant message per turn, tool results as tool messages.
TEST(ResponsesItems, AnAssistantTurnBecomesOneMessage) {
  const json items = json::parse(R"([
    {"role": "developer", "content": "Be brief."},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather "},
                                                    {"type": "input_text", "text": "in Paris?"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Look it up."}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
    {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "21 degrees"},
    {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]},
    {"role": "assistant", "content": "Sunny."},
    {"role": "assistant", "content": "At noon."},
    {"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"},
                                 {"type": "input_text", "text": "And here?"}]}
  ])");
  json messages = json::array();
  const auto error = append_response_items(items, "input", messages);
  ASSERT_FALSE(error) << error->message;
  const json expected = json::parse(R"([
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "Checking.", "reasoning_content": "Look it up.", "tool_calls": [
      {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
      {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"},
    {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
    {"role": "assistant", "content": "Sunny."},
    {"role": "assistant", "content": "At noon."},
    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                                 {"type": "text", "text": "And here?"}]}
  ])");
  EXPECT_EQ(messages, expected);
}

// The output items come in the order the model wrote them, and a stream's events build exactly
// those items: each event names its type and has the next sequence number, deltas add up to the
// items' text, and each output_item.done carries the finished item.
TEST(ResponsesOutput, ItemsInTheOrderWrittenWithTheirEvents) {
  ResponseOutput output(/*events=*/true);
  std::string events;
  output.add({.reasoning = "Hmm"}, events);
  output.add({.reasoning = ", yes"}, events);
  output.add({.content = "\n"}, events);  // whitespace opens no item until text follows
  output.add({.content = "Hi"}, events);
  output.add({.content = " there"}, events);
  output.add({.tool_calls = {{.name = "f", .arguments = R"({"x":1})"}}}, events);
  output.add({.content = "\n"}, events);  // dropped: a call follows
  output.add({.tool_calls = {{.name = "g", .arguments = "{}"}}}, events);
  output.finish(/*incomplete=*/false, events);

  const json& items = output.items();
  ASSERT_EQ(items.size(), 4u) << items.dump();
  EXPECT_EQ(items[0]["type"], "reasoning");
  EXPECT_EQ(items[0]["summary"], json::array());
  EXPECT_EQ(items[0]["content"], json::parse(R"([{"type": "reasoning_text", "text": "Hmm, yes"}])"));
  EXPECT_EQ(items[1]["type"], "message");
  EXPECT_EQ(items[1]["role"], "assistant");
  EXPECT_EQ(items[1]["status"], "completed");
  EXPECT_EQ(items[1]["content"][0]["type"], "output_text");
  EXPECT_EQ(items[1]["content"][0]["text"], "\nHi there");
  EXPECT_EQ(items[1]["content"][0]["annotations"], json::array());
  for (size_t i : {2, 3}) {
    EXPECT_EQ(items[i]["type"], "function_call");
    EXPECT_EQ(items[i]["status"], "completed");
    EXPECT_EQ(items[i]["id"].get<std::string>().rfind("fc_", 0), 0u);
    EXPECT_EQ(items[i]["call_id"].get<std::string>().rfind("call_", 0), 0u);
  }
  EXPECT_EQ(items[2]["name"], "f");
  EXPECT_EQ(items[2]["arguments"], R"({"x":1})");
  EXPECT_EQ(items[3]["name"], "g");

  std::vector<std::string> types;
  std::string text, reasoning, arguments;
  size_t at = 0;
  for (size_t end; (end = events.find("\n\n", at)) != std::string::npos; at = end + 2) {
    const std::string event = events.substr(at, end - at);
    ASSERT_EQ(event.rfind("event: ", 0), 0u) << event;
    const size_t newline = event.find('\n');
    ASSERT_EQ(event.compare(newline + 1, 6, "data: "), 0) << event;
    const json data = json::parse(event.substr(newline + 7));
    EXPECT_EQ(data["type"], event.substr(7, newline - 7));
    EXPECT_EQ(data["sequence_number"], types.size());
    types.push_back(data["type"]);
    if (data["type"] == "response.output_text.delta") text += data["delta"].get<std::string>();
    if (data["type"] == "response.reasoning_text.delta") reasoning += data["delta"].get<std::string>();
    if (data["type"] == "response.function_call_arguments.delta") arguments += data["delta"].get<std::string>();
    if (data["type"] == "response.output_item.done") {
      EXPECT_EQ(data["item"], items[data["output_index"].get<size_t>()]);
    }
  }
  EXPECT_EQ(at, events.size());
  const std::vector<std::string> expected = {"response.output_item.added",
                                             "response.content_part.added",
                                             "response.reasoning_text.delta",
                                             "response.reasoning_text.delta",
                                             "response.reasoning_text.done",
                                             "response.content_part.done",
                                             "response.output_item.done",
                                             "response.output_item.added",
                                             "response.content_part.added",
                                             "response.output_text.delta",
                                             "response.output_text.delta",
                                             "response.output_text.done",
                                             "response.content_part.done",
                                             "response.output_item.done",
                                             "response.output_item.added",
                                             "response.function_call_arguments.delta",
                                             "response.function_call_arguments.done",
                                             "response.output_item.done",
                                             "response.output_item.added",
                                             "response.function_call_arguments.delta",
                                             "response.function_call_arguments.done",
                                             "response.output_item.done"};
  EXPECT_EQ(types, expected);
  EXPECT_EQ(text, "\nHi there");
  EXPECT_EQ(reasoning, "Hmm, yes");
  EXPECT_EQ(arguments, R"({"x":1}{})");

  // the output read back as input is the assistant's turn
  json messages = json::array();
  ASSERT_FALSE(append_response_items(items, "output", messages));
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0]["content"], "\nHi there");
  EXPECT_EQ(messages[0]["reasoning_content"], "Hmm, yes");
  EXPECT_EQ(messages[0]["tool_calls"].size(), 2u);
  EXPECT_EQ(messages[0]["tool_calls"][0]["id"], items[2]["call_id"]);

  // an output cut short with nothing written is an empty, incomplete message
  ResponseOutput empty(/*events=*/false);
  std::string none;
  empty.add({.content = "  "}, none);
  empty.finish(/*incomplete=*/true, none);
  EXPECT_TRUE(none.empty());
  ASSERT_EQ(empty.items().size(), 1u);
  EXPECT_EQ(empty.items()[0]["status"], "incomplete");
  EXPECT_EQ(empty.items()[0]["content"][0]["text"], "");
}

TEST(ResponseStore, KeepsTheNewestAndForgetsDeletedOnes) {
  ResponseStore store;
  const size_t n = ResponseStore::kMaxEntries + 5;
  for (size_t i = 0; i < n; ++i)
    store.put("resp_" + std::to_string(i), {.response = {{"n", i}}, .messages = json::array()});
  EXPECT_EQ(store.size(), ResponseStore::kMaxEntries);
  EXPECT_EQ(store.get("resp_4"), nullptr);
  ASSERT_NE(store.get("resp_5"), nullptr);
  EXPECT_EQ(store.get("resp_5")->response["n"], 5);
  EXPECT_TRUE(store.erase("resp_5"));
  EXPECT_FALSE(store.erase("resp_5"));
  EXPECT_EQ(store.get("resp_5"), nullptr);
  EXPECT_EQ(store.size(), ResponseStore::kMaxEntries - 1);
  // an entry handed out outlives its eviction
  auto last = store.get("resp_" + std::to_string(n - 1));
  for (size_t i = 0; i < n; ++i) store.put("other_" + std::to_string(i), {.response = 1, .messages = json::array()});
  EXPECT_EQ(store.get("resp_" + std::to_string(n - 1)), nullptr);
  EXPECT_EQ(last->response["n"], n - 1);
}

}  // namespace
}  // namespace kiln::server
