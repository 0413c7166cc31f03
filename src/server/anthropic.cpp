// The Anthropic Messages API: /v1/messages, streamed and not, with tools and thinking blocks.
// Messages are translated to the OpenAI-style messages the chat template takes.
#include <httplib.h>

#include <chrono>
#include <map>

#include "server/handlers.h"

namespace kiln::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kPoll = std::chrono::milliseconds(50);

// Text of a content field (the system prompt, a tool result): a string or an array of text
// blocks. Any other block (an image) is refused rather than dropped.
std::variant<std::string, ApiError> block_text(const json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return ApiError{.message = "must be a string or an array of text blocks", .param = param};
  std::string text;
  for (const auto& b : content) {
    const std::string type = b.is_object() ? string_field(b, "type") : "";
    if (type != "text")
      return ApiError{.message = fmt::format("content blocks of type '{}' are not supported here", type),
                      .param = param};
    if (!b.contains("text") || !b["text"].is_string())
      return ApiError{.message = "a text block needs text", .param = param};
    text += b["text"].get<std::string>();
  }
  return text;
}

std::variant<json, ApiError> to_openai_messages(const json& system, const json& messages) {
  json out = json::array();
  if (!system.is_null()) {
    auto text = block_text(system, "system");
    if (auto* e = std::get_if<ApiError>(&text)) return *e;
    out.push_back({{"role", "system"}, {"content", std::get<std::string>(text)}});
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string param = fmt::format("messages[{}]", i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return ApiError{.message = "each message must be an object with a role", .param = param};
    const std::string role = m["role"].get<std::string>();
    if (role != "user" && role != "assistant")
      return ApiError{.message = fmt::format("unknown role '{}' (user or assistant)", role), .param = param + ".role"};
    if (!m.contains("content") || (!m["content"].is_string() && !m["content"].is_array()))
      return ApiError{.message = "content must be a string or an array of blocks", .param = param + ".content"};
    const json& content = m["content"];
    // As Anthropic's API: no message may be empty but a final assistant one (a prefill of nothing,
    // which leaves the answer to start afresh).
    const bool empty = content.is_string() ? content.get_ref<const std::string&>().empty() : content.empty();
    if (empty && (i + 1 < messages.size() || role != "assistant"))
      return ApiError{
          .message = "all messages must have non-empty content except for the optional final assistant message",
          .param = param + ".content"};
    if (content.is_string()) {
      out.push_back({{"role", role}, {"content", content}});
      continue;
    }
    std::string text, thinking;
    json calls = json::array();
    json parts = json::array();  // a user message's text and images in order, when it holds images
    bool has_images = false;
    for (size_t j = 0; j < content.size(); ++j) {
      const json& b = content[j];
      const std::string block = fmt::format("{}.content[{}]", param, j);
      if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
        return ApiError{.message = "each content block needs a type", .param = param + ".content"};
      const std::string type = b["type"].get<std::string>();
      if (type == "text") {
        if (!b.contains("text") || !b["text"].is_string())
          return ApiError{.message = "a text block needs text", .param = param + ".content"};
        text += b["text"].get<std::string>();
        parts.push_back({{"type", "text"}, {"text", b["text"]}});
      } else if (type == "image" && role == "user") {
        // as an OpenAI image_url part: base64 data as a data: URL, a url source as it is
        const json* source = b.contains("source") && b["source"].is_object() ? &b["source"] : nullptr;
        const std::string kind = source ? string_field(*source, "type") : "";
        std::string url;
        if (kind == "base64") {
          if (!source->contains("data") || !(*source)["data"].is_string())
            return ApiError{.message = "a base64 image source needs data", .param = block + ".source.data"};
          const std::string media = string_field(*source, "media_type");
          if (media.rfind("image/", 0) != 0)
            return ApiError{.message = "a base64 image source needs a media_type such as image/png",
                            .param = block + ".source.media_type"};
          url = "data:" + media + ";base64," + (*source)["data"].get<std::string>();
        } else if (kind == "url") {
          if (!source->contains("url") || !(*source)["url"].is_string())
            return ApiError{.message = "a url image source needs a url", .param = block + ".source.url"};
          url = (*source)["url"].get<std::string>();
        } else {
          return ApiError{.message = "an image block's source must be of type base64 or url",
                          .param = block + ".source"};
        }
        parts.push_back({{"type", "image_url"}, {"image_url", {{"url", std::move(url)}}}});
        has_images = true;
      } else if (type == "thinking" && role == "assistant") {
        if (b.contains("thinking") && b["thinking"].is_string()) thinking += b["thinking"].get<std::string>();
      } else if (type == "redacted_thinking" && role == "assistant") {
      } else if (type == "tool_use" && role == "assistant") {
        if (!b.contains("name") || !b["name"].is_string())
          return ApiError{.message = "a tool_use block needs a name", .param = param + ".content"};
        if (!b.contains("input") || !b["input"].is_object())
          return ApiError{.message = "a tool_use block's input must be an object", .param = block + ".input"};
        if (b.contains("id") && !b["id"].is_string())
          return ApiError{.message = "a tool_use block's id must be a string", .param = block + ".id"};
        calls.push_back({{"id", string_field(b, "id")},
                         {"type", "function"},
                         {"function", {{"name", b["name"]}, {"arguments", b["input"].dump()}}}});
      } else if (type == "tool_result" && role == "user") {
        if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string())
          return ApiError{.message = "a tool_result block needs the tool_use_id of the call it answers",
                          .param = block + ".tool_use_id"};
        if (b.contains("is_error") && !b["is_error"].is_boolean())
          return ApiError{.message = "a tool_result block's is_error must be true or false",
                          .param = block + ".is_error"};
        auto result = block_text(b.contains("content") && !b["content"].is_null() ? b["content"] : json(""),
                                 param + ".content.tool_result");
        if (auto* e = std::get_if<ApiError>(&result)) return *e;
        out.push_back({{"role", "tool"},
                       {"tool_call_id", string_field(b, "tool_use_id")},
                       {"content", std::get<std::string>(result)}});
      } else {
        return ApiError{.message = fmt::format("content blocks of type '{}' are not supported here", type),
                        .param = param + ".content"};
      }
    }
    if (role == "assistant") {
      json msg = {{"role", "assistant"}, {"content", text}};
      if (!thinking.empty()) msg["reasoning_content"] = thinking;
      if (!calls.empty()) msg["tool_calls"] = calls;
      out.push_back(msg);
    } else if (has_images) {
      out.push_back({{"role", "user"}, {"content", std::move(parts)}});
    } else if (!text.empty()) {
      out.push_back({{"role", "user"}, {"content", text}});
    }
  }
  return out;
}

std::string stop_reason(const TextGeneration& gen) {
  const std::string r = gen.finish_reason();
  if (r == "tool_calls") return "tool_use";
  if (r == "length") return "max_tokens";
  if (r == "stop" && !gen.matched_stop().empty()) return "stop_sequence";
  return "end_turn";
}

json usage_json(const TextGeneration& gen) {
  const int64_t cached = std::max<int64_t>(0, gen.generation().cached_tokens());
  return {{"input_tokens", gen.generation().prompt_tokens() - cached},
          {"output_tokens", gen.completion_tokens()},
          {"cache_read_input_tokens", cached},
          {"cache_creation_input_tokens", 0}};
}

json tool_use_block(const ToolCall& call) {
  json input = json::parse(call.arguments, nullptr, false);
  if (input.is_discarded() || !input.is_object()) input = json::object();
  return {{"type", "tool_use"}, {"id", random_id("toolu_")}, {"name", call.name}, {"input", input}};
}

}  // namespace

namespace {

// /v1/messages, or with `count_only` /v1/messages/count_tokens: the same request (max_tokens not
// required), answered with the prompt's token count instead of a generation.
void messages(Service& service, const httplib::Request& req, httplib::Response& res, bool count_only) {
  const std::string endpoint = count_only ? "/v1/messages/count_tokens" : "/v1/messages";
  auto fail = [&](const ApiError& e) {
    service.metrics().request(endpoint, e.status);
    respond_json(res, e.status, anthropic_error(e));
  };
  auto parsed = read_request(service, req, /*model_required=*/true);
  if (auto* e = std::get_if<ApiError>(&parsed)) return fail(*e);
  const json& body = std::get<json>(parsed);
  RequestFields fields(body);
  GenerationRequest request;
  request.max_tokens = -1;
  fields.integer("max_tokens", 1, INT32_MAX, request.max_tokens);
  if (request.max_tokens < 0 && !count_only) fields.fail("max_tokens", "'max_tokens' is required");
  bool stream = false;
  fields.boolean("stream", stream);
  fields.strings("stop_sequences", request.stops, 16, /*or_string=*/false);
  if (const json* metadata = fields.object("metadata")) {
    RequestFields m(*metadata, "metadata");
    std::string user_id;  // an end user's id, for the provider's abuse monitoring: kiln has none
    m.string("user_id", user_id);
    if (!m.ok()) fields.fail(m.error()->param, m.error()->message);
  }
  float temperature = 0;  // Anthropic's range, inside the OpenAI one read_sampling takes
  fields.number("temperature", 0, 1, temperature);
  request.sampling = read_sampling(fields, service.model().sampling);
  const json* messages = fields.array("messages", true);
  const json* tools = fields.array("tools");
  json kwargs = json::object();
  // enabled and adaptive (the model decides how much to think) turn the template's thinking on;
  // enabled closes the reasoning after its budget_tokens, which Anthropic requires below max_tokens
  if (const json* thinking = fields.object("thinking")) {
    RequestFields t(*thinking, "thinking");
    std::string type;
    t.string("type", type, /*required=*/true);
    if (type == "enabled") {
      int64_t budget = -1;
      t.integer("budget_tokens", 1024, INT32_MAX, budget);
      if (budget < 0) t.fail("thinking.budget_tokens", "'thinking.budget_tokens' is required with thinking enabled");
      if (t.ok() && request.max_tokens >= 0 && budget >= request.max_tokens)
        t.fail("thinking.budget_tokens",
               fmt::format("'max_tokens' ({}) must be greater than 'thinking.budget_tokens' ({})", request.max_tokens,
                           budget));
      request.reasoning_budget = budget;
    } else if (t.ok() && type != "adaptive" && type != "disabled") {
      t.fail("thinking.type", "'thinking.type' must be enabled, adaptive or disabled");
    }
    if (!t.ok()) fields.fail(t.error()->param, t.error()->message);
    kwargs["enable_thinking"] = type == "enabled" || type == "adaptive";
  }
  // auto and any show every tool, none drops them, tool shows the one it names; any and tool make
  // the answer open a tool call
  std::string chosen;
  if (const json* choice = fields.object("tool_choice")) {
    const std::string type = string_field(*choice, "type");
    request.call_required = type == "any" || type == "tool";
    RequestFields c(*choice, "tool_choice");
    c.boolean("disable_parallel_tool_use", request.one_tool_call);
    if (!c.ok()) fields.fail(c.error()->param, c.error()->message);
    if (type == "none") {
      tools = nullptr;
    } else if (type == "tool") {
      chosen = string_field(*choice, "name");
      if (chosen.empty()) fields.fail("tool_choice", "a tool_choice of type 'tool' needs a name");
    } else if (type != "auto" && type != "any") {
      fields.fail("tool_choice", "'tool_choice' type must be auto, any, tool or none");
    }
    if ((type == "any" || type == "tool") && (!tools || tools->empty()))
      fields.fail("tool_choice", fmt::format("a tool_choice of type '{}' needs 'tools'", type));
  }
  json openai_tools = json::array();
  bool chosen_found = false;
  if (tools) {
    // custom tools only, each name its own (a call names the tool it calls)
    std::map<std::string, size_t> names;  // name -> index of the tool that has it
    for (size_t i = 0; i < tools->size() && fields.ok(); ++i) {
      const json& t = (*tools)[i];
      const std::string at = fmt::format("tools[{}]", i);
      if (!t.is_object()) {
        fields.fail(at, fmt::format("'{}' must be an object", at));
        break;
      }
      RequestFields f(t, at);
      std::string type = "custom", name, description;
      f.string("type", type);
      if (type != "custom")
        f.fail(at + ".type", fmt::format("'{}.type' '{}' is not supported: kiln serves custom tools only", at, type));
      f.string("name", name, /*required=*/true);
      f.string("description", description);
      const json* schema = f.object("input_schema", /*required=*/true);
      if (f.ok() && !valid_tool_name(name, 128))
        f.fail(at + ".name",
               fmt::format("'{}.name' must be 1 to 128 letters, digits, '_' or '-', got {}", at, json(name).dump()));
      if (f.ok())
        if (auto [it, added] = names.emplace(name, i); !added)
          f.fail(at + ".name", fmt::format("'{}.name' repeats the name of tools[{}], '{}'", at, it->second, name));
      if (!f.ok()) {
        fields.fail(f.error()->param, f.error()->message);
        break;
      }
      if (!chosen.empty() && name != chosen) continue;
      chosen_found = true;
      openai_tools.push_back({{"type", "function"},
                              {"function", {{"name", name}, {"description", description}, {"parameters", *schema}}}});
    }
  }
  if (!chosen.empty() && tools && !chosen_found)
    fields.fail("tool_choice", fmt::format("'tool_choice' names the tool '{}', which is not among 'tools'", chosen));
  if (!fields.ok()) return fail(*fields.error());
  auto converted = to_openai_messages(body.contains("system") ? body["system"] : json(), *messages);
  if (auto* e = std::get_if<ApiError>(&converted)) return fail(*e);
  // a last assistant message is a prefill: the answer continues it
  auto prompt = service.chat_prompt(std::get<json>(converted), tools ? &openai_tools : nullptr, kwargs,
                                    /*continue_final_message=*/true);
  if (auto* e = std::get_if<ApiError>(&prompt)) return fail(*e);
  if (count_only) {
    service.metrics().request(endpoint, 200);
    return respond_json(res, 200, {{"input_tokens", std::get<Prompt>(prompt).ids.size()}});
  }
  request.prompt = std::move(std::get<Prompt>(prompt));
  request.call_name = chosen;

  const auto t0 = Clock::now();
  auto started = service.start(std::move(request));
  if (auto* e = std::get_if<ApiError>(&started)) return fail(*e);
  std::shared_ptr<TextGeneration> gen = std::move(std::get<std::unique_ptr<TextGeneration>>(started));
  // a streamed answer's status goes out with its first bytes; a whole one's when it is ready
  if (stream) service.metrics().request(endpoint, 200);
  const std::string id = random_id("msg_");
  const std::string model_name = service.model_name();

  if (!stream) {
    OutputDelta all;
    std::vector<int32_t> ids;
    double ttft = -1;
    const ClientConnection client(req);
    for (bool more = true; more;) {
      more = gen->next(all, ids, kPoll);
      if (ttft < 0 && !ids.empty()) ttft = std::chrono::duration<double>(Clock::now() - t0).count();
      if (more &&
          client.closed()) {  // nobody is waiting for the answer (an HTTP/1.0 client that half-closed counts as gone)
        gen->cancel();
        service.metrics().request(endpoint, 499);
        return respond_json(res, 499,
                            anthropic_error(ApiError{.status = 499, .message = "the client closed the request"}));
      }
    }
    if (gen->finish_reason() == "error") {
      service.metrics().request(endpoint, 500);
      return respond_json(res, 500, anthropic_error(ApiError{.status = 500, .message = gen->error()}));
    }
    service.metrics().latency(std::max(ttft, 0.0), std::chrono::duration<double>(Clock::now() - t0).count());
    json content = json::array();
    if (!all.reasoning.empty())
      content.push_back({{"type", "thinking"}, {"thinking", all.reasoning}, {"signature", ""}});
    // an empty text block only where it would be the only block, as the stream sends it
    if (!all.content.empty() || (all.tool_calls.empty() && all.reasoning.empty()))
      content.push_back({{"type", "text"}, {"text", all.content}});
    for (const auto& call : all.tool_calls) content.push_back(tool_use_block(call));
    service.metrics().request(endpoint, 200);
    return respond_json(res, 200,
                        {{"id", id},
                         {"type", "message"},
                         {"role", "assistant"},
                         {"model", model_name},
                         {"content", content},
                         {"stop_reason", stop_reason(*gen)},
                         {"stop_sequence", gen->matched_stop().empty() ? json() : json(gen->matched_stop())},
                         {"usage", usage_json(*gen)}});
  }

  auto event = [](const char* name, const json& data) {
    return fmt::format("event: {}\ndata: {}\n\n", name, data.dump(-1, ' ', false, json::error_handler_t::replace));
  };
  struct StreamState {
    bool started = false, done = false;
    int index = -1;
    std::string open;  // the type of the block being streamed ("" when none)
    double ttft = -1;
  };
  auto state = std::make_shared<StreamState>();
  respond_events(res, service, [=, &service](const Send& send) {
    if (state->done) return false;
    if (!state->started) {
      state->started = true;
      json usage = usage_json(*gen);
      usage["output_tokens"] = 0;
      json message = {{"id", id},
                      {"type", "message"},
                      {"role", "assistant"},
                      {"model", model_name},
                      {"content", json::array()},
                      {"stop_reason", nullptr},
                      {"stop_sequence", nullptr},
                      {"usage", usage}};
      if (!send(event("message_start", {{"type", "message_start"}, {"message", message}}))) return gen->cancel(), false;
    }
    OutputDelta delta;
    std::vector<int32_t> ids;
    const bool more = gen->next(delta, ids, kPoll);
    if (state->ttft < 0 && !ids.empty()) state->ttft = std::chrono::duration<double>(Clock::now() - t0).count();
    std::string out;
    auto close_block = [&] {
      if (state->open.empty()) return;
      out += event("content_block_stop", {{"type", "content_block_stop"}, {"index", state->index}});
      state->open.clear();
    };
    auto open_block = [&](const std::string& type, const json& block) {
      if (state->open == type) return;
      close_block();
      state->open = type;
      ++state->index;
      out += event("content_block_start",
                   {{"type", "content_block_start"}, {"index", state->index}, {"content_block", block}});
    };
    if (!delta.reasoning.empty()) {
      open_block("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
      out += event("content_block_delta", {{"type", "content_block_delta"},
                                           {"index", state->index},
                                           {"delta", {{"type", "thinking_delta"}, {"thinking", delta.reasoning}}}});
    }
    if (!delta.content.empty()) {
      open_block("text", {{"type", "text"}, {"text", ""}});
      out += event("content_block_delta", {{"type", "content_block_delta"},
                                           {"index", state->index},
                                           {"delta", {{"type", "text_delta"}, {"text", delta.content}}}});
    }
    for (const auto& call : delta.tool_calls) {
      close_block();
      json block = tool_use_block(call);
      const std::string input = block["input"].dump();
      block["input"] = json::object();
      open_block("tool_use", block);
      out += event("content_block_delta", {{"type", "content_block_delta"},
                                           {"index", state->index},
                                           {"delta", {{"type", "input_json_delta"}, {"partial_json", input}}}});
      close_block();
    }
    if (!more) {
      state->done = true;
      if (gen->finish_reason() == "error") {
        out += event("error", anthropic_error(ApiError{.status = 500, .message = gen->error()}));
        send(out);
        return false;
      }
      if (state->index < 0) open_block("text", {{"type", "text"}, {"text", ""}});
      close_block();
      service.metrics().latency(std::max(state->ttft, 0.0), std::chrono::duration<double>(Clock::now() - t0).count());
      out += event("message_delta",
                   {{"type", "message_delta"},
                    {"delta",
                     {{"stop_reason", stop_reason(*gen)},
                      {"stop_sequence", gen->matched_stop().empty() ? json() : json(gen->matched_stop())}}},
                    {"usage", usage_json(*gen)}});
      out += event("message_stop", {{"type", "message_stop"}});
    }
    if (!send(out)) return gen->cancel(), false;
    return more;
  });
}

}  // namespace

void handle_messages(Service& service, const httplib::Request& req, httplib::Response& res) {
  messages(service, req, res, /*count_only=*/false);
}

void handle_count_tokens(Service& service, const httplib::Request& req, httplib::Response& res) {
  messages(service, req, res, /*count_only=*/true);
}

}  // namespace kiln::server
