// The OpenAI API: /v1/chat/completions and /v1/completions, streamed and not.
#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <random>
#include <set>

#include "server/handlers.h"

namespace kiln::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kPoll = std::chrono::milliseconds(50);

json usage_json(const TextGeneration& gen) {
  const int64_t prompt = gen.generation().prompt_tokens();
  const int64_t cached = std::max<int64_t>(0, gen.generation().cached_tokens());
  return {{"prompt_tokens", prompt},
          {"completion_tokens", gen.completion_tokens()},
          {"total_tokens", prompt + gen.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json tool_call_json(const ToolCall& call, size_t index, bool with_index) {
  json j = {{"id", random_id("call_")},
            {"type", "function"},
            {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
  if (with_index) j["index"] = index;
  return j;
}

json utf8_bytes(const std::string& text) {
  json bytes = json::array();
  for (unsigned char c : text) bytes.push_back(int(c));
  return bytes;
}

// Chat's choice.logprobs: an entry per token with its text, bytes and the top alternatives.
json chat_logprobs(const TextGeneration& gen, const std::vector<int32_t>& ids,
                   const std::vector<SampledLogprobs>& lps) {
  auto entry = [&](int32_t id, float logprob) {
    const std::string text = gen.token_text(id);
    return json{{"token", text}, {"logprob", logprob}, {"bytes", utf8_bytes(text)}};
  };
  json content = json::array();
  for (size_t i = 0; i < lps.size() && i < ids.size(); ++i) {
    json e = entry(ids[i], lps[i].logprob);
    e["top_logprobs"] = json::array();
    for (const auto& alt : lps[i].top) e["top_logprobs"].push_back(entry(alt.token, alt.logprob));
    content.push_back(std::move(e));
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

// The completions endpoint's choice.logprobs (the legacy form). `offset`: characters of output
// before these tokens (code points, as OpenAI counts them), advanced past them.
json text_logprobs(const TextGeneration& gen, const std::vector<int32_t>& ids, const std::vector<SampledLogprobs>& lps,
                   size_t& offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  for (size_t i = 0; i < lps.size() && i < ids.size(); ++i) {
    const std::string text = gen.token_text(ids[i]);
    tokens.push_back(text);
    token_logprobs.push_back(lps[i].logprob);
    offsets.push_back(offset);
    offset += size_t(std::count_if(text.begin(), text.end(), [](char c) { return (c & 0xC0) != 0x80; }));  // characters
    // the sampled token first and always among them, as vLLM does; a text already there (two
    // tokens decoding alike) keeps its first, higher value
    json alternatives = {{text, lps[i].logprob}};
    for (const auto& alt : lps[i].top) alternatives.emplace(gen.token_text(alt.token), alt.logprob);
    top.push_back(std::move(alternatives));
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

// What the chat and text endpoints have in common once the prompt is known.
struct Exchange {
  std::string id;
  int64_t created = 0;
  bool stream = false;
  bool include_usage = false;
  bool return_token_ids = false;
  int logprobs = -1;  // as GenerationRequest::logprobs
  bool chat = true;
  std::string endpoint;
};

void run(Service& service, GenerationRequest request, Exchange ex, const httplib::Request& req,
         httplib::Response& res) {
  const auto t0 = Clock::now();
  const std::vector<int32_t> prompt_ids = request.prompt.ids;
  auto started = service.start(std::move(request));
  if (auto* e = std::get_if<ApiError>(&started)) {
    service.metrics().request(ex.endpoint, e->status);
    return respond_json(res, e->status, openai_error(*e));
  }
  std::shared_ptr<TextGeneration> gen = std::move(std::get<std::unique_ptr<TextGeneration>>(started));
  // a streamed answer's status goes out with its first bytes; a whole one's when it is ready
  if (ex.stream) service.metrics().request(ex.endpoint, 200);
  const std::string model = service.model_name();
  const char* object = ex.chat ? "chat.completion" : "text_completion";

  if (!ex.stream) {
    OutputDelta all;
    std::vector<int32_t> ids;
    std::vector<SampledLogprobs> logprobs;
    double ttft = -1;
    const ClientConnection client(req);
    for (bool more = true; more;) {
      more = gen->next(all, ids, kPoll, ex.logprobs >= 0 ? &logprobs : nullptr);
      if (ttft < 0 && !ids.empty()) ttft = std::chrono::duration<double>(Clock::now() - t0).count();
      if (more &&
          client.closed()) {  // nobody is waiting for the answer (an HTTP/1.0 client that half-closed counts as gone)
        gen->cancel();
        service.metrics().request(ex.endpoint, 499);
        return respond_json(res, 499,
                            openai_error(ApiError{.status = 499, .message = "the client closed the request"}));
      }
    }
    if (gen->finish_reason() == "error") {
      service.metrics().request(ex.endpoint, 500);
      return respond_json(res, 500,
                          openai_error(ApiError{.status = 500, .type = "server_error", .message = gen->error()}));
    }
    service.metrics().latency(std::max(ttft, 0.0), std::chrono::duration<double>(Clock::now() - t0).count());
    json choice = {{"index", 0}, {"finish_reason", gen->finish_reason()}, {"logprobs", nullptr}};
    if (ex.chat) {
      json message = {{"role", "assistant"},
                      {"content", all.content.empty() && !all.tool_calls.empty() ? json() : json(all.content)}};
      if (!all.reasoning.empty()) message["reasoning_content"] = all.reasoning;
      if (!all.tool_calls.empty()) {
        message["tool_calls"] = json::array();
        for (size_t i = 0; i < all.tool_calls.size(); ++i)
          message["tool_calls"].push_back(tool_call_json(all.tool_calls[i], i, false));
      }
      choice["message"] = message;
    } else {
      choice["text"] = all.content;
    }
    if (ex.return_token_ids) choice["token_ids"] = ids;
    size_t offset = 0;
    if (ex.logprobs >= 0)
      choice["logprobs"] = ex.chat ? chat_logprobs(*gen, ids, logprobs) : text_logprobs(*gen, ids, logprobs, offset);
    json body = {{"id", ex.id},         {"object", object},          {"created", ex.created},        {"model", model},
                 {"choices", {choice}}, {"usage", usage_json(*gen)}, {"system_fingerprint", nullptr}};
    if (ex.return_token_ids) body["prompt_token_ids"] = prompt_ids;
    service.metrics().request(ex.endpoint, 200);
    return respond_json(res, 200, body);
  }

  // streamed: one chunk per batch of new output
  const char* chunk_object = ex.chat ? "chat.completion.chunk" : "text_completion";
  auto chunk = [=](json choice) {
    return json{{"id", ex.id},    {"object", chunk_object},        {"created", ex.created},
                {"model", model}, {"system_fingerprint", nullptr}, {"choices", json::array({std::move(choice)})}};
  };
  auto event = [](const json& j) { return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"; };
  struct StreamState {
    bool started = false, done = false;
    size_t tool_index = 0;
    size_t text_offset = 0;  // for the completions endpoint's logprobs
    double ttft = -1;
  };
  auto state = std::make_shared<StreamState>();
  respond_events(res, service, [=, &service](const Send& send) {
    if (state->done) return false;
    if (!state->started && ex.chat) {
      state->started = true;
      json first = chunk({{"index", 0},
                          {"delta", {{"role", "assistant"}, {"content", ""}}},
                          {"logprobs", nullptr},
                          {"finish_reason", nullptr}});
      if (ex.return_token_ids) first["prompt_token_ids"] = prompt_ids;
      if (!send(event(first))) return gen->cancel(), false;
    }
    OutputDelta delta;
    std::vector<int32_t> ids;
    std::vector<SampledLogprobs> logprobs;
    const bool more = gen->next(delta, ids, kPoll, ex.logprobs >= 0 ? &logprobs : nullptr);
    if (state->ttft < 0 && !ids.empty()) state->ttft = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!delta.empty() || ((ex.return_token_ids || ex.logprobs >= 0) && !ids.empty())) {
      json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
      if (ex.logprobs >= 0)
        choice["logprobs"] =
            ex.chat ? chat_logprobs(*gen, ids, logprobs) : text_logprobs(*gen, ids, logprobs, state->text_offset);
      if (ex.chat) {
        json d = json::object();
        if (!delta.content.empty()) d["content"] = delta.content;
        if (!delta.reasoning.empty()) d["reasoning_content"] = delta.reasoning;
        if (!delta.tool_calls.empty()) {
          d["tool_calls"] = json::array();
          for (const auto& call : delta.tool_calls)
            d["tool_calls"].push_back(tool_call_json(call, state->tool_index++, true));
        }
        choice["delta"] = d;
      } else {
        choice["text"] = delta.content;
      }
      if (ex.return_token_ids) choice["token_ids"] = ids;
      if (!send(event(chunk(choice)))) return gen->cancel(), false;
    } else if (more && !send("")) {
      // nothing new: an empty write checks that the client is still there
      return gen->cancel(), false;
    }
    if (more) return true;
    state->done = true;
    if (gen->finish_reason() == "error") {
      send(event(openai_error(ApiError{.status = 500, .type = "server_error", .message = gen->error()})));
      send("data: [DONE]\n\n");
      return false;
    }
    service.metrics().latency(std::max(state->ttft, 0.0), std::chrono::duration<double>(Clock::now() - t0).count());
    json last = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", gen->finish_reason()}};
    if (ex.chat)
      last["delta"] = json::object();
    else
      last["text"] = "";
    send(event(chunk(last)));
    if (ex.include_usage) {
      json usage = chunk(json());
      usage["choices"] = json::array();
      usage["usage"] = usage_json(*gen);
      send(event(usage));
    }
    send("data: [DONE]\n\n");
    return false;
  });
}

// OpenAI's logit_bias: {"token id": bias between -100 and 100}. The ids are checked against the
// model's vocabulary when the generation starts.
void read_logit_bias(RequestFields& fields, std::vector<std::pair<int32_t, float>>& out) {
  const json* biases = fields.object("logit_bias");
  if (!biases) return;
  for (const auto& [key, value] : biases->items()) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (key.empty() || ec != std::errc() || end != key.data() + key.size() || id < 0 || id > INT32_MAX)
      return fields.fail("logit_bias", "'logit_bias' keys must be token ids (non-negative integers)");
    const double bias = value.is_number() ? value.get<double>() : NAN;
    if (!std::isfinite(bias) || std::abs(bias) > kMaxLogitBias)
      return fields.fail("logit_bias",
                         fmt::format("'logit_bias' of token {} must be a number between -100 and 100", id));
    out.emplace_back(int32_t(id), float(bias));
  }
}

// Fields both endpoints read: stream, stream_options, n, stop, max_tokens, sampling.
void read_common(RequestFields& fields, Exchange& ex, GenerationRequest& request, int64_t default_max_tokens,
                 const SamplingParams& sampling_defaults) {
  fields.boolean("stream", ex.stream);
  if (const json* options = fields.object("stream_options")) {
    RequestFields o(*options, "stream_options");
    o.boolean("include_usage", ex.include_usage);
    if (!o.ok()) fields.fail(o.error()->param, o.error()->message);
    if (!ex.stream) fields.fail("stream_options", "'stream_options' is only allowed with 'stream': true");
  }
  // no constrained decoding: a JSON format is refused rather than promised and not kept
  if (const json* format = fields.object("response_format")) {
    const json type = format->value("type", json());
    if (type != "text")
      fields.fail("response_format", type == "json_object" || type == "json_schema"
                                         ? fmt::format("'response_format' {} is not supported", type.dump())
                                         : "'response_format' must be {\"type\": \"text\"}");
  }
  fields.boolean("return_token_ids", ex.return_token_ids);
  std::string user;  // an end user's id, for the provider's abuse monitoring: kiln has none
  fields.string("user", user);
  int64_t n = 1;
  fields.integer("n", 1, 1, n);
  fields.strings("stop", request.stops, 16);
  request.max_tokens = default_max_tokens;
  fields.integer("max_tokens", 1, INT32_MAX, request.max_tokens);
  if (ex.chat) fields.integer("max_completion_tokens", 1, INT32_MAX, request.max_tokens);
  request.sampling = read_sampling(fields, sampling_defaults);
  read_logit_bias(fields, request.sampling.logit_bias);
  // chat: logprobs a boolean, top_logprobs the alternatives; completions: logprobs the alternatives
  if (ex.chat) {
    bool wanted = false;
    int64_t top = -1;
    fields.boolean("logprobs", wanted);
    fields.integer("top_logprobs", 0, 20, top);
    if (top > 0 && !wanted) fields.fail("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    ex.logprobs = wanted ? int(std::max<int64_t>(top, 0)) : -1;
  } else {
    int64_t top = -1;
    fields.integer("logprobs", 0, 20, top);
    ex.logprobs = int(top);
  }
  request.logprobs = ex.logprobs;
}

// OpenAI's tools: [{"type": "function", "function": {"name", "description", "parameters"}}], each
// name its own (a call names the function it calls). A missing type is taken for "function".
void read_tools(RequestFields& fields, const json& tools) {
  std::map<std::string, size_t> names;  // name -> index of the tool that has it
  for (size_t i = 0; i < tools.size() && fields.ok(); ++i) {
    const std::string at = fmt::format("tools[{}]", i);
    if (!tools[i].is_object()) return fields.fail(at, fmt::format("'{}' must be an object", at));
    RequestFields tool(tools[i], at);
    std::string type = "function";
    tool.string("type", type);
    if (type != "function") tool.fail(at + ".type", fmt::format("'{}.type' must be \"function\"", at));
    const json* function = tool.object("function", /*required=*/true);
    if (!tool.ok()) return fields.fail(tool.error()->param, tool.error()->message);
    RequestFields f(*function, at + ".function");
    std::string name, description;
    f.string("name", name, /*required=*/true);
    f.string("description", description);
    f.object("parameters");
    if (f.ok() && !valid_tool_name(name, 64))
      f.fail(
          at + ".function.name",
          fmt::format("'{}.function.name' must be 1 to 64 letters, digits, '_' or '-', got {}", at, json(name).dump()));
    if (f.ok())
      if (auto [it, added] = names.emplace(name, i); !added)
        f.fail(at + ".function.name",
               fmt::format("'{}.function.name' repeats the name of tools[{}], '{}'", at, it->second, name));
    if (!f.ok()) return fields.fail(f.error()->param, f.error()->message);
  }
}

}  // namespace

bool known_reasoning_effort(const std::string& effort) {
  static const std::set<std::string> efforts{"none", "minimal", "low", "medium", "high", "xhigh"};
  return efforts.count(effort) > 0;
}

SamplingParams read_sampling(RequestFields& fields, const SamplingParams& defaults) {
  SamplingParams s = defaults;
  fields.number("temperature", 0, 2, s.temperature);
  fields.number("top_p", 0, 1, s.top_p);
  if (s.top_p <= 0) s.top_p = 1e-6f;  // keeps the most likely token only
  int64_t top_k = s.top_k;
  fields.integer("top_k", -1, 1 << 30, top_k);
  s.top_k = top_k < 0 ? 0 : int(top_k);
  fields.number("min_p", 0, 1, s.min_p);
  fields.number("presence_penalty", -2, 2, s.presence_penalty);
  fields.number("frequency_penalty", -2, 2, s.frequency_penalty);
  fields.number("repetition_penalty", 0.01, 100, s.repetition_penalty);
  int64_t seed = -1;
  fields.integer("seed", INT64_MIN, INT64_MAX, seed);
  s.seed = seed == -1 ? std::random_device{}() : uint64_t(seed);
  return s;
}

void handle_chat_completions(Service& service, const httplib::Request& req, httplib::Response& res) {
  const std::string endpoint = "/v1/chat/completions";
  auto fail = [&](const ApiError& e) {
    service.metrics().request(endpoint, e.status);
    respond_json(res, e.status, openai_error(e));
  };
  auto parsed = read_request(service, req);
  if (auto* e = std::get_if<ApiError>(&parsed)) return fail(*e);
  const json& body = std::get<json>(parsed);
  RequestFields fields(body);
  Exchange ex{.id = random_id("chatcmpl-"), .created = int64_t(std::time(nullptr)), .chat = true, .endpoint = endpoint};
  GenerationRequest request;
  read_common(fields, ex, request, 0, service.model().sampling);
  const json* messages = fields.array("messages", true);
  const json* tools = fields.array("tools");
  std::string tool_choice = "auto";
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    if (body["tool_choice"].is_string()) {
      tool_choice = body["tool_choice"].get<std::string>();
      if (tool_choice != "none" && tool_choice != "auto" && tool_choice != "required")
        fields.fail("tool_choice", "'tool_choice' must be none, auto, required or a function");
    } else if (!body["tool_choice"].is_object()) {
      fields.fail("tool_choice", "'tool_choice' must be a string or an object");
    }
  }
  if (tools) read_tools(fields, *tools);
  // OpenAI's deprecated forms of tools: ignored, the model would never see the functions
  for (const char* legacy : {"functions", "function_call"})
    if (body.contains(legacy) && !body[legacy].is_null())
      fields.fail(legacy, fmt::format("'{}' is not supported: use 'tools' and 'tool_choice'", legacy));
  bool parallel_tool_calls = true;
  fields.boolean("parallel_tool_calls", parallel_tool_calls);
  request.one_tool_call = !parallel_tool_calls;
  // a function named by tool_choice must be among the tools; the model is then shown that one
  json chosen_tools;
  if (const json* choice =
          body.contains("tool_choice") && body["tool_choice"].is_object() ? &body["tool_choice"] : nullptr) {
    const json* function = choice->contains("function") ? &(*choice)["function"] : nullptr;
    if (choice->value("type", json()) != "function" || !function || !function->is_object() ||
        !function->contains("name") || !(*function)["name"].is_string()) {
      fields.fail("tool_choice", "'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    } else {
      const std::string name = (*function)["name"].get<std::string>();
      const auto named = [&](const json& tool) {
        return tool.is_object() && tool.contains("function") && tool["function"].is_object() &&
               tool["function"].value("name", json()) == name;
      };
      if (tools)
        if (auto it = std::find_if(tools->begin(), tools->end(), named); it != tools->end())
          chosen_tools = json::array({*it});
      if (chosen_tools.is_null())
        fields.fail("tool_choice",
                    fmt::format("'tool_choice' names the function '{}', which is not among 'tools'", name));
    }
  }
  if (tool_choice == "required" && (!tools || tools->empty()))
    fields.fail("tool_choice", "'tool_choice' required needs 'tools'");
  json kwargs = json::object();
  if (const json* k = fields.object("chat_template_kwargs")) kwargs = *k;
  for (const char* reserved : {"messages", "tools", "add_generation_prompt"})
    if (kwargs.contains(reserved))
      fields.fail("chat_template_kwargs",
                  fmt::format("'chat_template_kwargs' may not set '{}' (a field of the request)", reserved));
  // reasoning_effort goes to the chat template, as vLLM and SGLang pass it (a template that does
  // not read it ignores it); vLLM's thinking_token_budget closes the reasoning after that many tokens
  std::string reasoning_effort;
  fields.string("reasoning_effort", reasoning_effort);
  if (fields.ok() && body.contains("reasoning_effort") && !body["reasoning_effort"].is_null() &&
      !known_reasoning_effort(reasoning_effort))
    fields.fail("reasoning_effort", "'reasoning_effort' must be none, minimal, low, medium, high or xhigh");
  else if (!reasoning_effort.empty())
    kwargs["reasoning_effort"] = reasoning_effort;
  // the same field set through chat_template_kwargs is held to the same values
  if (const auto it = kwargs.find("reasoning_effort");
      fields.ok() && it != kwargs.end() && !(it->is_string() && known_reasoning_effort(it->get<std::string>())))
    fields.fail("chat_template_kwargs",
                "'chat_template_kwargs.reasoning_effort' must be none, minimal, low, medium, high or xhigh");
  fields.integer("thinking_token_budget", 0, INT32_MAX, request.reasoning_budget);
  bool continue_final_message = false;  // vLLM's: the last assistant message is continued
  fields.boolean("continue_final_message", continue_final_message);
  if (continue_final_message && messages && !messages->empty() && string_field(messages->back(), "role") != "assistant")
    fields.fail("continue_final_message", "'continue_final_message' needs the last message to be an assistant message");
  if (!fields.ok()) return fail(*fields.error());
  if (tool_choice == "none") tools = nullptr;
  if (!chosen_tools.is_null()) tools = &chosen_tools;
  request.call_required = tool_choice == "required" || !chosen_tools.is_null();
  if (!chosen_tools.is_null()) request.call_name = chosen_tools[0]["function"]["name"].get<std::string>();
  auto prompt = service.chat_prompt(*messages, tools, kwargs, continue_final_message);
  if (auto* e = std::get_if<ApiError>(&prompt)) return fail(*e);
  request.prompt = std::move(std::get<Prompt>(prompt));
  run(service, std::move(request), ex, req, res);
}

void handle_completions(Service& service, const httplib::Request& req, httplib::Response& res) {
  const std::string endpoint = "/v1/completions";
  auto fail = [&](const ApiError& e) {
    service.metrics().request(endpoint, e.status);
    respond_json(res, e.status, openai_error(e));
  };
  auto parsed = read_request(service, req);
  if (auto* e = std::get_if<ApiError>(&parsed)) return fail(*e);
  const json& body = std::get<json>(parsed);
  RequestFields fields(body);
  Exchange ex{.id = random_id("cmpl-"), .created = int64_t(std::time(nullptr)), .chat = false, .endpoint = endpoint};
  GenerationRequest request;
  read_common(fields, ex, request, 16, service.model().sampling);
  bool echo = false;
  fields.boolean("echo", echo);
  if (echo) fields.fail("echo", "'echo' is not supported");
  int64_t best_of = 1;
  fields.integer("best_of", INT64_MIN, INT64_MAX, best_of);
  if (best_of != 1) fields.fail("best_of", "'best_of' other than 1 is not supported");
  std::string suffix;
  fields.string("suffix", suffix);
  if (!suffix.empty()) fields.fail("suffix", "'suffix' is not supported");
  if (!body.contains("prompt") || body["prompt"].is_null()) fields.fail("prompt", "'prompt' is required");
  if (!fields.ok()) return fail(*fields.error());
  auto prompt = service.text_prompt(body["prompt"]);
  if (auto* e = std::get_if<ApiError>(&prompt)) return fail(*e);
  request.prompt = std::move(std::get<Prompt>(prompt));
  request.prompt_field = "prompt";
  run(service, std::move(request), ex, req, res);
}

}  // namespace kiln::server
