// The OpenAI Responses API: POST /v1/responses, streamed and not, and GET and DELETE
// /v1/responses/{id} for stored responses.
//
// Input items become the OpenAI-style chat messages /v1/chat/completions renders (an assistant
// turn's reasoning, text and function calls gathered into one assistant message), so the prompt,
// tool calls and limits are those of chat completions. The output comes back as items in the
// order the model wrote them: a `reasoning` item (its raw text as `reasoning_text` content, as
// open-weight models' reasoning is returned), a `message`, a `function_call` per tool call.
// A stored response keeps its conversation, which previous_response_id continues.
//
// Left out (refused with a 400 naming the field): tools other than functions, structured output
// (text.format json_schema / json_object: there is no constrained decoding), background
// responses, conversations, stored prompts, logprobs, truncation "auto", file inputs and item
// references.
#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <set>
#include <utility>

#include "server/handlers.h"
#include "server/responses.h"

namespace kiln::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kPoll = std::chrono::milliseconds(50);
constexpr const char* kEndpoint = "/v1/responses";

ApiError bad_request(std::string param, std::string message) {
  return ApiError{.message = std::move(message), .param = std::move(param)};
}

// ---- input items to chat messages ----

// A message item's content: a string, or parts (input_text, input_image; an assistant's
// output_text and refusal). Text alone becomes one string; with images, chat parts (text and
// image_url) in order.
std::variant<json, ApiError> message_content(const json& content, const std::string& at, bool assistant) {
  if (content.is_string()) return content;
  if (!content.is_array())
    return bad_request(at, fmt::format("'{}' must be a string or an array of content parts", at));
  std::string text;
  json parts = json::array();
  bool images = false;
  for (size_t j = 0; j < content.size(); ++j) {
    const json& part = content[j];
    const std::string here = fmt::format("{}[{}]", at, j);
    const std::string type = string_field(part, "type");
    if (type == "input_text" || (assistant && type == "output_text")) {
      if (!part.contains("text") || !part["text"].is_string())
        return bad_request(here + ".text", fmt::format("'{}.text' must be a string", here));
      text += part["text"].get<std::string>();
      parts.push_back({{"type", "text"}, {"text", part["text"]}});
    } else if (assistant && type == "refusal") {
      if (!part.contains("refusal") || !part["refusal"].is_string())
        return bad_request(here + ".refusal", fmt::format("'{}.refusal' must be a string", here));
      text += part["refusal"].get<std::string>();
      parts.push_back({{"type", "text"}, {"text", part["refusal"]}});
    } else if (!assistant && type == "input_image") {
      if (part.contains("file_id") && !part["file_id"].is_null())
        return bad_request(here + ".file_id", fmt::format("'{}.file_id' is not supported: send image_url", here));
      if (!part.contains("image_url") || !part["image_url"].is_string())
        return bad_request(here + ".image_url",
                           fmt::format("'{}.image_url' must be a data: URL or an http(s) URL", here));
      parts.push_back({{"type", "image_url"}, {"image_url", {{"url", part["image_url"]}}}});
      images = true;
    } else {
      const char* allowed = assistant ? "output_text, input_text or refusal" : "input_text or input_image";
      return bad_request(here + ".type",
                         type.empty() ? fmt::format("'{}.type' is required ({})", here, allowed)
                                      : fmt::format("'{}.type' '{}' is not supported ({})", here, type, allowed));
    }
  }
  if (images) return parts;
  return text;
}

// A function_call_output item's output: a string, or input_text parts.
std::variant<std::string, ApiError> call_output(const json& output, const std::string& at) {
  if (output.is_string()) return output.get<std::string>();
  if (!output.is_array()) return bad_request(at, fmt::format("'{}' must be a string or an array of input_text", at));
  std::string text;
  for (size_t j = 0; j < output.size(); ++j) {
    const std::string here = fmt::format("{}[{}]", at, j);
    if (string_field(output[j], "type") != "input_text" || !output[j].contains("text") ||
        !output[j]["text"].is_string())
      return bad_request(here, fmt::format("'{}' must be an input_text part (other outputs are not supported)", here));
    text += output[j]["text"].get<std::string>();
  }
  return text;
}

// A string field an item requires.
std::variant<std::string, ApiError> required_string(const json& item, const std::string& at, const char* key) {
  if (!item.contains(key) || !item[key].is_string())
    return bad_request(fmt::format("{}.{}", at, key), fmt::format("'{}.{}' must be a string", at, key));
  return item[key].get<std::string>();
}

}  // namespace

std::optional<ApiError> append_response_items(const json& items, const std::string& name, json& messages) {
  json turn;  // the assistant turn being gathered (null: none)
  auto flush = [&] {
    if (!turn.is_null()) messages.push_back(std::move(turn));
    turn = json();
  };
  // `fresh`: the item opens a new assistant message unless the turn so far holds only reasoning
  auto assistant = [&](bool fresh) -> json& {
    if (fresh && !turn.is_null() &&
        (!turn["content"].get_ref<const std::string&>().empty() || turn.contains("tool_calls")))
      flush();
    if (turn.is_null()) turn = {{"role", "assistant"}, {"content", ""}};
    return turn;
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const json& item = items[i];
    const std::string at = fmt::format("{}[{}]", name, i);
    if (!item.is_object()) return bad_request(at, fmt::format("'{}' must be an object (an input item)", at));
    if (item.contains("type") && !item["type"].is_string())
      return bad_request(at + ".type", fmt::format("'{}.type' must be a string", at));
    std::string type = string_field(item, "type");
    if (type.empty() && item.contains("role")) type = "message";  // an easy input message
    if (type == "message") {
      const std::string role = string_field(item, "role");
      if (role != "user" && role != "system" && role != "developer" && role != "assistant")
        return bad_request(at + ".role", fmt::format("'{}.role' must be user, system, developer or assistant", at));
      if (!item.contains("content")) return bad_request(at + ".content", fmt::format("'{}.content' is required", at));
      auto content = message_content(item["content"], at + ".content", role == "assistant");
      if (auto* e = std::get_if<ApiError>(&content)) return *e;
      if (role == "assistant") {
        const std::string text = std::get<json>(content).get<std::string>();  // an assistant's is text
        json& message = assistant(/*fresh=*/true);
        message["content"] = message["content"].get<std::string>() + text;
      } else {
        flush();
        messages.push_back({{"role", role}, {"content", std::move(std::get<json>(content))}});
      }
    } else if (type == "reasoning") {
      // its raw text (reasoning_text content) goes back as the turn's reasoning_content; a summary
      // is not what the model wrote, and encrypted content is not kiln's
      std::string text;
      if (item.contains("content") && item["content"].is_array())
        for (const json& part : item["content"])
          if (string_field(part, "type") == "reasoning_text") text += string_field(part, "text");
      json& message = assistant(/*fresh=*/true);
      if (!text.empty()) message["reasoning_content"] = message.value("reasoning_content", "") + text;
    } else if (type == "function_call") {
      auto call_id = required_string(item, at, "call_id");
      auto function = required_string(item, at, "name");
      auto arguments = required_string(item, at, "arguments");
      for (auto* field : {&call_id, &function, &arguments})
        if (auto* e = std::get_if<ApiError>(field)) return *e;
      const std::string& text = std::get<std::string>(arguments);
      const bool object = nesting_depth(text) <= kMaxNesting && json::parse(text, nullptr, false).is_object();
      if (!object) return bad_request(at + ".arguments", fmt::format("'{}.arguments' must hold a JSON object", at));
      json& message = assistant(/*fresh=*/false);
      if (!message.contains("tool_calls")) message["tool_calls"] = json::array();
      message["tool_calls"].push_back({{"id", std::get<std::string>(call_id)},
                                       {"type", "function"},
                                       {"function", {{"name", std::get<std::string>(function)}, {"arguments", text}}}});
    } else if (type == "function_call_output") {
      auto call_id = required_string(item, at, "call_id");
      if (auto* e = std::get_if<ApiError>(&call_id)) return *e;
      if (!item.contains("output")) return bad_request(at + ".output", fmt::format("'{}.output' is required", at));
      auto output = call_output(item["output"], at + ".output");
      if (auto* e = std::get_if<ApiError>(&output)) return *e;
      flush();
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", std::get<std::string>(call_id)},
                          {"content", std::get<std::string>(output)}});
    } else if (type == "item_reference") {
      return bad_request(at, fmt::format("'{}': item references are not supported: send the item, or continue a "
                                         "stored response with 'previous_response_id'",
                                         at));
    } else {
      return bad_request(at + ".type", type.empty()
                                           ? fmt::format("'{}.type' is required", at)
                                           : fmt::format("'{}.type' '{}' is not supported (message, function_call, "
                                                         "function_call_output, reasoning)",
                                                         at, type));
    }
  }
  flush();
  return std::nullopt;
}

namespace {

// ---- the request's tools ----

struct Tools {
  json chat = json::array();    // as chat completions takes them: {"type", "function": {...}}
  json echoed = json::array();  // as the response lists them
};

// Function tools, {"type": "function", "name", "description", "parameters", "strict"}, each name its
// own. `strict` is taken and echoed: the arguments are not held to the schema (no constrained
// decoding), as chat completions does not hold them either.
void read_tools(RequestFields& fields, const json& tools, Tools& out) {
  std::map<std::string, size_t> names;  // name -> index of the tool that has it
  for (size_t i = 0; i < tools.size() && fields.ok(); ++i) {
    const std::string at = fmt::format("tools[{}]", i);
    if (!tools[i].is_object()) return fields.fail(at, fmt::format("'{}' must be an object", at));
    RequestFields tool(tools[i], at);
    std::string type, name, description;
    tool.string("type", type, /*required=*/true);
    if (tool.ok() && type != "function")
      tool.fail(at + ".type",
                fmt::format("'{}.type' '{}' is not supported: kiln serves function tools only", at, type));
    tool.string("name", name, /*required=*/true);
    tool.string("description", description);
    const json* parameters = tool.object("parameters");
    bool strict = false;
    tool.boolean("strict", strict);
    if (tool.ok() && !valid_tool_name(name, 64))
      tool.fail(at + ".name",
                fmt::format("'{}.name' must be 1 to 64 letters, digits, '_' or '-', got {}", at, json(name).dump()));
    if (tool.ok())
      if (auto [it, added] = names.emplace(name, i); !added)
        tool.fail(at + ".name", fmt::format("'{}.name' repeats the name of tools[{}], '{}'", at, it->second, name));
    if (!tool.ok()) return fields.fail(tool.error()->param, tool.error()->message);
    json function = {{"name", name}, {"description", description}};
    if (parameters) function["parameters"] = *parameters;
    out.chat.push_back({{"type", "function"}, {"function", function}});
    const json& t = tools[i];
    out.echoed.push_back({{"type", "function"},
                          {"name", name},
                          {"description", t.contains("description") ? t["description"] : json()},
                          {"parameters", parameters ? *parameters : json()},
                          {"strict", t.contains("strict") ? t["strict"] : json()}});
  }
}

// tool_choice: "auto", "none", "required", {"type": "function", "name"}, or
// {"type": "allowed_tools", "mode": "auto" | "required", "tools": [{"type": "function", "name"}]}.
// Narrows `tools.chat` to the tools the model may call and sets whether (and which) it must.
void read_tool_choice(RequestFields& fields, const json& body, Tools& tools, bool& offered,
                      GenerationRequest& request) {
  const json choice = body.value("tool_choice", json());
  std::set<std::string> allowed;  // empty: every tool
  if (choice.is_null() || choice == "auto") return;
  if (choice == "none") {
    offered = false;
    return;
  }
  if (choice == "required") {
    request.call_required = true;
  } else if (choice.is_object() && choice.value("type", json()) == "function") {
    const std::string name = string_field(choice, "name");
    if (name.empty()) return fields.fail("tool_choice.name", "'tool_choice.name' must name a function");
    allowed.insert(name);
    request.call_required = true;
    request.call_name = name;
  } else if (choice.is_object() && choice.value("type", json()) == "allowed_tools") {
    const json mode = choice.value("mode", json());
    if (mode != "auto" && mode != "required")
      return fields.fail("tool_choice.mode", "'tool_choice.mode' must be auto or required");
    const json list = choice.value("tools", json());
    if (!list.is_array() || list.empty())
      return fields.fail("tool_choice.tools", "'tool_choice.tools' must be a non-empty array of function tools");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string name = string_field(list[i], "name");
      if (string_field(list[i], "type") != "function" || name.empty())
        return fields.fail(fmt::format("tool_choice.tools[{}]", i),
                           fmt::format("'tool_choice.tools[{}]' must be {{\"type\": \"function\", \"name\": ...}}", i));
      allowed.insert(name);
    }
    request.call_required = mode == "required";
  } else if (choice.is_object() && choice.contains("type") && choice["type"].is_string()) {
    return fields.fail("tool_choice", fmt::format("'tool_choice' of type '{}' is not supported: kiln serves function "
                                                  "tools only",
                                                  choice["type"].get<std::string>()));
  } else {
    return fields.fail("tool_choice", "'tool_choice' must be none, auto, required, a function or allowed_tools");
  }
  if (tools.chat.empty()) return fields.fail("tool_choice", "'tool_choice' needs 'tools'");
  if (allowed.empty()) return;
  json kept = json::array();
  for (const json& tool : tools.chat)
    if (allowed.count(tool["function"]["name"].get<std::string>())) kept.push_back(tool);
  for (const std::string& name : allowed) {
    const bool known =
        std::any_of(kept.begin(), kept.end(), [&](const json& t) { return t["function"]["name"] == name; });
    if (!known)
      return fields.fail("tool_choice",
                         fmt::format("'tool_choice' names the function '{}', which is not among 'tools'", name));
  }
  tools.chat = std::move(kept);
}

json usage_json(const TextGeneration& gen) {
  const int64_t input = gen.generation().prompt_tokens();
  const int64_t cached = std::max<int64_t>(0, gen.generation().cached_tokens());
  return {{"input_tokens", input},
          {"input_tokens_details", {{"cached_tokens", cached}}},
          {"output_tokens", gen.completion_tokens()},
          // the reasoning's share of the output is not counted apart
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", input + gen.completion_tokens()}};
}

// A sampling value as the response shows it (a float's binary noise rounded off).
double shown(float value) {
  return std::round(double(value) * 1e6) / 1e6;
}

// What the response's status is once the generation has ended, and the event that ends its stream.
struct Outcome {
  const char* status;
  const char* event;
};

Outcome outcome(const TextGeneration& gen) {
  const std::string reason = gen.finish_reason();
  if (reason == "error") return {"failed", "response.failed"};
  if (reason == "cancelled") return {"cancelled", "response.failed"};
  if (reason == "length") return {"incomplete", "response.incomplete"};
  return {"completed", "response.completed"};
}

// The finished response: `base` (the request's settings, as response.created showed them) with
// the status, output and usage.
json finished(const json& base, const TextGeneration& gen, const json& output) {
  json response = base;
  const Outcome o = outcome(gen);
  response["status"] = o.status;
  response["output"] = output;
  response["usage"] = usage_json(gen);
  if (std::string(o.status) == "completed") response["completed_at"] = int64_t(std::time(nullptr));
  if (std::string(o.status) == "incomplete") response["incomplete_details"] = {{"reason", "max_output_tokens"}};
  if (std::string(o.status) == "failed") response["error"] = {{"code", "server_error"}, {"message", gen.error()}};
  return response;
}

// Keeps a finished response and its conversation (`messages`, then its output as the assistant's
// turn) for GET and previous_response_id. A failed or cancelled one is not kept.
void keep(ResponseStore& store, const json& response, json messages) {
  const std::string status = response["status"].get<std::string>();
  if (status != "completed" && status != "incomplete") return;
  if (append_response_items(response["output"], "output", messages)) return;  // (its own items always read back)
  store.put(response["id"].get<std::string>(), {.response = response, .messages = std::move(messages)});
}

}  // namespace

// ---- the endpoints ----

void handle_responses(Service& service, ResponseStore& store, const httplib::Request& req, httplib::Response& res) {
  auto fail = [&](const ApiError& e) {
    service.metrics().request(kEndpoint, e.status);
    respond_json(res, e.status, openai_error(e));
  };
  auto parsed = read_request(service, req);
  if (auto* e = std::get_if<ApiError>(&parsed)) return fail(*e);
  const json& body = std::get<json>(parsed);
  RequestFields fields(body);

  GenerationRequest request;
  request.prompt_field = "input";
  bool stream = false, keep_it = true;
  fields.boolean("stream", stream);
  if (const json* options = fields.object("stream_options")) {
    RequestFields o(*options, "stream_options");
    bool obfuscation = false;  // padding against length side channels: nothing to pad here
    o.boolean("include_obfuscation", obfuscation);
    if (!o.ok()) fields.fail(o.error()->param, o.error()->message);
    if (!stream) fields.fail("stream_options", "'stream_options' is only allowed with 'stream': true");
  }
  fields.boolean("store", keep_it);
  fields.integer("max_output_tokens", 1, INT32_MAX, request.max_tokens);
  request.sampling = read_sampling(fields, service.model().sampling);
  std::string instructions, previous_id;
  fields.string("instructions", instructions);
  fields.string("previous_response_id", previous_id);
  const json* metadata = fields.object("metadata");
  // ids for the provider's caching and abuse monitoring, and its service tiers: kiln has none
  for (const char* ignored :
       {"user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "service_tier"}) {
    std::string value;
    fields.string(ignored, value);
  }
  bool background = false;
  fields.boolean("background", background);
  if (background) fields.fail("background", "'background' responses are not supported");
  for (const auto& [field, why] : std::initializer_list<std::pair<const char*, const char*>>{
           {"conversation", "continue a stored response with 'previous_response_id'"},
           {"prompt", "stored prompts are not kept here"},
           {"context_management", "send the conversation that should be kept"},
           {"moderation", "there is no moderation model"}})
    if (body.contains(field) && !body[field].is_null())
      fields.fail(field, fmt::format("'{}' is not supported: {}", field, why));
  std::string truncation = "disabled";
  fields.string("truncation", truncation);
  if (truncation != "disabled")
    fields.fail("truncation", "'truncation' must be disabled: an input beyond the context is refused, not cut");
  int64_t top_logprobs = 0;
  fields.integer("top_logprobs", 0, 20, top_logprobs);
  if (top_logprobs > 0) fields.fail("top_logprobs", "'top_logprobs' is not supported here");
  std::vector<std::string> include;
  fields.strings("include", include, 32, /*or_string=*/false);
  // more output asked for: logprobs are not given here; the others (encrypted reasoning, tool
  // results) have nothing to add to what kiln returns
  for (const std::string& what : include)
    if (what == "message.output_text.logprobs")
      fields.fail("include", "'include' message.output_text.logprobs is not supported");
  // no constrained decoding: a JSON format is refused rather than promised and not kept
  json text_config = {{"format", {{"type", "text"}}}};
  if (const json* text = fields.object("text")) {
    RequestFields t(*text, "text");
    if (const json* format = t.object("format")) {
      const std::string type = string_field(*format, "type");
      if (type == "json_schema" || type == "json_object")
        t.fail("text.format", fmt::format("'text.format' {} is not supported (no constrained decoding)", type));
      else if (type != "text")
        t.fail("text.format", "'text.format' must be {\"type\": \"text\"}");
    }
    std::string verbosity;  // a hint for the provider's models
    t.string("verbosity", verbosity);
    if (!verbosity.empty()) text_config["verbosity"] = verbosity;
    if (!t.ok()) fields.fail(t.error()->param, t.error()->message);
  }
  json kwargs = json::object();
  if (const json* k = fields.object("chat_template_kwargs")) kwargs = *k;
  for (const char* reserved : {"messages", "tools", "add_generation_prompt"})
    if (kwargs.contains(reserved))
      fields.fail("chat_template_kwargs",
                  fmt::format("'chat_template_kwargs' may not set '{}' (a field of the request)", reserved));
  if (const auto it = kwargs.find("reasoning_effort");
      it != kwargs.end() && !(it->is_string() && known_reasoning_effort(it->get<std::string>())))
    fields.fail("chat_template_kwargs.reasoning_effort",
                "'chat_template_kwargs.reasoning_effort' must be none, minimal, low, medium, high or xhigh");
  // reasoning.effort reaches the chat template as reasoning_effort, as chat completions passes it
  json reasoning_shown = {{"effort", nullptr}, {"summary", nullptr}};
  if (const json* reasoning = fields.object("reasoning")) {
    RequestFields r(*reasoning, "reasoning");
    std::string effort, summary, generate_summary;
    r.string("effort", effort);
    if (r.ok() && !effort.empty() && !known_reasoning_effort(effort))
      r.fail("reasoning.effort", "'reasoning.effort' must be none, minimal, low, medium, high or xhigh");
    // the reasoning comes back whole: no summary is written
    r.string("summary", summary);
    r.string("generate_summary", generate_summary);
    if (!r.ok()) fields.fail(r.error()->param, r.error()->message);
    if (!effort.empty()) kwargs["reasoning_effort"] = reasoning_shown["effort"] = effort;
    if (!summary.empty()) reasoning_shown["summary"] = summary;
  }
  Tools tools;
  if (const json* list = fields.array("tools")) read_tools(fields, *list, tools);
  bool offered = true;  // the tools reach the model (not with tool_choice none)
  if (fields.ok()) read_tool_choice(fields, body, tools, offered, request);
  bool parallel_tool_calls = true;
  fields.boolean("parallel_tool_calls", parallel_tool_calls);
  request.one_tool_call = !parallel_tool_calls;
  const json* input = body.contains("input") && !body["input"].is_null() ? &body["input"] : nullptr;
  if (input && !input->is_string() && !input->is_array())
    fields.fail("input", "'input' must be a string or an array of input items");
  if (!input && previous_id.empty()) fields.fail("input", "'input' is required");
  if (!fields.ok()) return fail(*fields.error());

  // the conversation: the previous response's, then the input
  json conversation = json::array();
  if (!previous_id.empty()) {
    auto previous = store.get(previous_id);
    if (!previous)
      return fail(ApiError{.message = fmt::format("'previous_response_id' {} is not a stored response (it was "
                                                  "not stored, was deleted, or the server has restarted since)",
                                                  json(previous_id).dump()),
                           .param = "previous_response_id",
                           .code = "previous_response_not_found"});
    conversation = previous->messages;
  }
  if (input && input->is_string()) conversation.push_back({{"role", "user"}, {"content", *input}});
  if (input && input->is_array())
    if (auto e = append_response_items(*input, "input", conversation)) return fail(*e);
  if (conversation.empty()) return fail(bad_request("input", "'input' holds no items"));
  json messages = json::array();
  if (!instructions.empty()) messages.push_back({{"role", "system"}, {"content", instructions}});
  messages.insert(messages.end(), conversation.begin(), conversation.end());
  const json* chat_tools = offered && !tools.chat.empty() ? &tools.chat : nullptr;
  auto prompt = service.chat_prompt(messages, chat_tools, kwargs);
  if (auto* e = std::get_if<ApiError>(&prompt)) return fail(*e);
  request.prompt = std::move(std::get<Prompt>(prompt));

  // the response as it stands before any output: the request's settings echoed
  const json base = {
      {"id", random_id("resp_")},
      {"object", "response"},
      {"created_at", int64_t(std::time(nullptr))},
      {"status", "in_progress"},
      {"background", false},
      {"error", nullptr},
      {"incomplete_details", nullptr},
      {"instructions", body.contains("instructions") ? body["instructions"] : json()},
      {"max_output_tokens", request.max_tokens > 0 ? json(request.max_tokens) : json()},
      {"metadata", metadata ? *metadata : json::object()},
      {"model", service.model_name()},
      {"output", json::array()},
      {"parallel_tool_calls", parallel_tool_calls},
      {"previous_response_id", previous_id.empty() ? json() : json(previous_id)},
      {"reasoning", reasoning_shown},
      {"store", keep_it},
      {"temperature", shown(request.sampling.temperature)},
      {"text", text_config},
      {"tool_choice",
       body.contains("tool_choice") && !body["tool_choice"].is_null() ? body["tool_choice"] : json("auto")},
      {"tools", tools.echoed},
      {"top_p", shown(request.sampling.top_p)},
      {"truncation", "disabled"},
      {"usage", nullptr},
  };

  const auto t0 = Clock::now();
  auto started = service.start(std::move(request));
  if (auto* e = std::get_if<ApiError>(&started)) {
    ApiError error = *e;
    if (error.param == "max_tokens") {  // chat completions' name for it
      error.param = "max_output_tokens";
      if (const size_t at = error.message.find("max_tokens"); at != std::string::npos)
        error.message.replace(at, 10, "max_output_tokens");
    }
    return fail(error);
  }
  std::shared_ptr<TextGeneration> gen = std::move(std::get<std::unique_ptr<TextGeneration>>(started));
  // a streamed answer's status goes out with its first bytes; a whole one's when it is ready
  if (stream) service.metrics().request(kEndpoint, 200);

  if (!stream) {
    ResponseOutput output(/*events=*/false);
    std::string unused;
    double ttft = -1;
    const ClientConnection client(req);
    for (bool more = true; more;) {
      OutputDelta delta;
      std::vector<int32_t> ids;
      more = gen->next(delta, ids, kPoll);
      if (ttft < 0 && !ids.empty()) ttft = std::chrono::duration<double>(Clock::now() - t0).count();
      output.add(delta, unused);
      if (more && client.closed()) {  // nobody is waiting for the answer
        gen->cancel();
        return fail(ApiError{.status = 499, .message = "the client closed the request"});
      }
    }
    if (gen->finish_reason() == "error")
      return fail(ApiError{.status = 500, .type = "server_error", .message = gen->error()});
    service.metrics().latency(std::max(ttft, 0.0), std::chrono::duration<double>(Clock::now() - t0).count());
    output.finish(gen->finish_reason() == "length", unused);
    const json response = finished(base, *gen, output.items());
    if (keep_it) keep(store, response, std::move(conversation));
    service.metrics().request(kEndpoint, 200);
    return respond_json(res, 200, response);
  }

  struct StreamState {
    ResponseOutput output{/*events=*/true};
    bool started = false, done = false;
    double ttft = -1;
    json conversation;
  };
  auto state = std::make_shared<StreamState>();
  state->conversation = std::move(conversation);
  respond_events(res, service, [=, &service, &store](const Send& send) {
    if (state->done) return false;
    std::string out;
    if (!state->started) {
      state->started = true;
      out += state->output.event("response.created", {{"response", base}});
      out += state->output.event("response.in_progress", {{"response", base}});
    }
    OutputDelta delta;
    std::vector<int32_t> ids;
    const bool more = gen->next(delta, ids, kPoll);
    if (state->ttft < 0 && !ids.empty()) state->ttft = std::chrono::duration<double>(Clock::now() - t0).count();
    state->output.add(delta, out);
    if (!more) {
      state->done = true;
      if (gen->finish_reason() != "error") {
        service.metrics().latency(std::max(state->ttft, 0.0), std::chrono::duration<double>(Clock::now() - t0).count());
        state->output.finish(gen->finish_reason() == "length", out);
      }
      const json response = finished(base, *gen, state->output.items());
      // kept before the client reads the end, so its next request finds it
      if (keep_it) keep(store, response, std::move(state->conversation));
      out += state->output.event(outcome(*gen).event, {{"response", response}});
    }
    // an empty write checks that the client is still there
    if (!send(out)) return gen->cancel(), false;
    return more;
  });
}

void handle_get_response(Service& service, ResponseStore& store, const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  auto entry = store.get(id);
  const int status = entry ? 200 : 404;
  service.metrics().request("/v1/responses/{id}", status);
  if (!entry)
    return respond_json(
        res, 404,
        openai_error(ApiError{
            .status = 404, .message = fmt::format("No stored response with id '{}'", id), .code = "not_found"}));
  respond_json(res, 200, entry->response);
}

void handle_delete_response(Service& service, ResponseStore& store, const httplib::Request& req,
                            httplib::Response& res) {
  const std::string id = req.matches[1];
  const bool erased = store.erase(id);
  service.metrics().request("/v1/responses/{id}", erased ? 200 : 404);
  if (!erased)
    return respond_json(
        res, 404,
        openai_error(ApiError{
            .status = 404, .message = fmt::format("No stored response with id '{}'", id), .code = "not_found"}));
  respond_json(res, 200, {{"id", id}, {"object", "response"}, {"deleted", true}});
}

}  // namespace kiln::server
