#include "server/service.h"

#include "engine/engine_internal.h"

#include <fmt/format.h>

#include <cctype>

namespace kiln::server {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

ApiError bad_request(std::string message, std::string param = {}) {
  return ApiError{.status = 400, .message = std::move(message), .param = std::move(param)};
}

// A message's content: its text (a string, null, or text parts) and, when it holds images, the
// parts in order as a chat template takes them from transformers' processors ({"type": "text",
// "text": ...} and {"type": "image"}) with each image's URL and where it is in the request.
struct Content {
  std::string text;
  ordered_json parts;  // null: text only
  struct ImagePart {
    std::string url;
    std::string param;
  };
  std::vector<ImagePart> images;
};

std::variant<Content, ApiError> message_content(const json& content, size_t index) {
  const std::string param = fmt::format("messages[{}].content", index);
  Content out;
  if (content.is_null()) return out;
  if (content.is_string()) {
    out.text = content.get<std::string>();
    return out;
  }
  if (!content.is_array()) return bad_request("content must be a string or an array of content parts", param);
  ordered_json parts = ordered_json::array();
  for (size_t j = 0; j < content.size(); ++j) {
    const json& part = content[j];
    if (part.is_string()) {
      out.text += part.get<std::string>();
      parts.push_back({{"type", "text"}, {"text", part}});
      continue;
    }
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      return bad_request("each content part must be an object with a type", param);
    const std::string type = part["type"].get<std::string>();
    const std::string at = fmt::format("{}[{}]", param, j);
    if (type == "image_url" || type == "input_image") {
      // {"image_url": {"url": ...}} (chat completions), {"image_url": "..."} (Responses, some clients)
      const json* url = part.contains("image_url") ? &part["image_url"] : nullptr;
      if (url && url->is_object()) url = url->contains("url") ? &(*url)["url"] : nullptr;
      if (!url || !url->is_string())
        return bad_request("an image part needs image_url.url: a data: URL or an http(s) URL", at + ".image_url");
      out.images.push_back(Content::ImagePart{.url = url->get<std::string>(), .param = at + ".image_url"});
      parts.push_back({{"type", "image"}});
      continue;
    }
    if (type != "text" && type != "input_text")
      return bad_request(fmt::format("content parts of type '{}' are not supported (text and image_url)", type), param);
    if (!part.contains("text") || !part["text"].is_string())
      return bad_request("a text part needs a text string", param);
    out.text += part["text"].get<std::string>();
    parts.push_back({{"type", "text"}, {"text", part["text"]}});
  }
  if (!out.images.empty()) out.parts = std::move(parts);
  return out;
}

}  // namespace

Service::Service(ServedModel model) : model_(std::move(model)) {
  format_ = engine::output_format(model_.scheduler ? model_.scheduler->model().info().family : std::string(),
                                  model_.tokenizer.get(), model_.chat_template ? &*model_.chat_template : nullptr);
}

void Service::stream_opened() {
  std::lock_guard<std::mutex> lock(streams_mutex_);
  ++open_streams_;
}

void Service::stream_closed() {
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    --open_streams_;
  }
  streams_closed_.notify_all();
}

void Service::wait_for_streams() {
  std::unique_lock<std::mutex> lock(streams_mutex_);
  streams_closed_.wait(lock, [this] { return open_streams_ == 0; });
}

std::optional<ApiError> Service::check_model(const std::string& requested) const {
  if (requested.empty() || requested == model_.name) return std::nullopt;
  return ApiError{
      .status = 404,
      .message = fmt::format("The model '{}' does not exist; this server serves '{}'", requested, model_.name),
      .param = "model",
      .code = "model_not_found"};
}

std::variant<Prompt, ApiError> Service::chat_prompt(const json& messages, const json* tools,
                                                    const json& template_kwargs, bool continue_final_message) const {
  if (!messages.is_array() || messages.empty()) return bad_request("'messages' must be a non-empty array", "messages");
  ChatRequest request;
  std::vector<ProcessedImage> images;
  int64_t soft_tokens = 0;  // the images'
  // a request's image URLs share one time limit
  const auto fetch_deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(model_.image_fetch.timeout_seconds);
  std::map<std::string, std::string> call_names;  // tool call id -> function name
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string param = fmt::format("messages[{}]", i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return bad_request("each message must be an object with a role", param);
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      return bad_request(fmt::format("unknown role '{}'", role), param + ".role");
    // only an assistant message may go without content (it holds tool calls, or nothing)
    const bool has_content = m.contains("content") && !m["content"].is_null();
    if (!has_content && role != "assistant")
      return bad_request(fmt::format("'{}.content' is required for a {} message", param, m["role"].get<std::string>()),
                         param + ".content");
    auto read = message_content(has_content ? m["content"] : json(), i);
    if (auto* e = std::get_if<ApiError>(&read)) return *e;
    Content& content = std::get<Content>(read);
    if (m.contains("name") && !m["name"].is_null() && !m["name"].is_string())
      return bad_request(fmt::format("'{}.name' must be a string", param), param + ".name");
    ordered_json out = {{"role", role}, {"content", content.text}};
    if (!content.images.empty()) {
      if (role != "user" && role != "system")
        return bad_request(fmt::format("images are taken in user messages, not in a {} message", role),
                           content.images.front().param);
      if (!model_.images)
        return bad_request(fmt::format("the model '{}' takes no images", model_.name), content.images.front().param);
      // images cost time and memory to read: none is read for a request that would wait for a place
      if (images.empty()) {
        if (auto e = busy()) return *e;
      }
      for (const auto& part : content.images) {
        if (images.size() >= kMaxImages)
          return bad_request(fmt::format("a request may hold at most {} images", kMaxImages), part.param);
        auto bytes = image_url_bytes(part.url, model_.image_fetch, part.param, fetch_deadline);
        if (auto* e = std::get_if<ApiError>(&bytes)) return *e;
        const std::string& data = std::get<std::string>(bytes);
        auto image = model_.images->read(
            std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size()), part.param);
        if (!image.ok()) return bad_request(image.error().message, part.param);
        soft_tokens += image->soft_tokens;
        images.push_back(std::move(image).value());
        if (model_.scheduler && soft_tokens >= context())
          return ApiError{.message = fmt::format("This model's context holds {} tokens; the request's images alone "
                                                 "fill {}",
                                                 context(), soft_tokens),
                          .param = part.param,
                          .code = "context_length_exceeded"};
      }
      out["content"] = std::move(content.parts);
    }
    // a participant's name reaches the template, as transformers passes it (most templates ignore it)
    if (role != "tool" && m.contains("name") && m["name"].is_string()) out["name"] = m["name"];
    if (role == "assistant" && m.contains("reasoning_content") && m["reasoning_content"].is_string())
      out["reasoning_content"] = m["reasoning_content"];
    if (role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (!m["tool_calls"].is_array()) return bad_request("tool_calls must be an array", param + ".tool_calls");
      ordered_json calls = ordered_json::array();
      for (size_t j = 0; j < m["tool_calls"].size(); ++j) {
        const json& call = m["tool_calls"][j];
        const std::string arguments_at = fmt::format("{}.tool_calls[{}].function.arguments", param, j);
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
            !call["function"].contains("name") || !call["function"]["name"].is_string())
          return bad_request("each tool call needs a function with a name", param + ".tool_calls");
        const json& f = call["function"];
        ordered_json args = ordered_json::object();
        if (f.contains("arguments") && f["arguments"].is_string()) {
          const std::string& text = f["arguments"].get_ref<const std::string&>();
          // refused unparsed: the arguments are copied below, and a copy recurses as deep as they nest
          if (nesting_depth(text) > kMaxNesting)
            return bad_request(fmt::format("tool call arguments nest deeper than {} levels", kMaxNesting),
                               param + ".tool_calls");
          args = ordered_json::parse(text, nullptr, false);
          if (args.is_discarded()) return bad_request("tool call arguments must be JSON", param + ".tool_calls");
          if (!args.is_object())
            return bad_request(fmt::format("'{}' must hold a JSON object", arguments_at), arguments_at);
        } else if (f.contains("arguments") && f["arguments"].is_object()) {
          args = f["arguments"];
        } else if (f.contains("arguments") && !f["arguments"].is_null()) {
          return bad_request(fmt::format("'{}' must be a JSON string", arguments_at), arguments_at);
        }
        const std::string id = string_field(call, "id");
        call_names[id] = f["name"].get<std::string>();
        calls.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", f["name"]}, {"arguments", args}}}});
      }
      out["tool_calls"] = calls;
    }
    if (role == "tool") {
      if (!m.contains("tool_call_id") || !m["tool_call_id"].is_string())
        return bad_request(
            fmt::format("'{}.tool_call_id' must be a string: the id of the call the message answers", param),
            param + ".tool_call_id");
      const std::string id = m["tool_call_id"].get<std::string>();
      out["tool_call_id"] = id;
      if (m.contains("name") && m["name"].is_string())
        out["name"] = m["name"];
      else if (call_names.count(id))
        out["name"] = call_names[id];
    }
    request.messages.push_back(std::move(out));
  }
  // its text is continued where the rendering cuts it, so calls after the text would be dropped
  if (continue_final_message && !request.messages.empty() && request.messages.back().contains("tool_calls") &&
      !request.messages.back()["tool_calls"].empty())
    return bad_request("a final assistant message with tool_calls cannot be continued",
                       fmt::format("messages[{}].tool_calls", messages.size() - 1));
  // (the messages' own errors first, whatever the model)
  if (!model_.tokenizer || !model_.chat_template)
    return bad_request("this model has no tokenizer and chat template; use /v1/completions with token ids");
  if (tools && !tools->empty()) request.tools = ordered_json(*tools);
  if (template_kwargs.is_object())
    for (const auto& [k, v] : template_kwargs.items()) request.extra_variables[k] = v;
  // continuing the last assistant message (a prefill): its turn is left open, as transformers'
  // continue_final_message does, by cutting the rendering after the message's text
  // (stripped at both ends, as transformers does; an empty one is dropped and a new turn opened)
  std::string prefill;
  if (continue_final_message && !request.messages.empty() && request.messages.back()["role"] == "assistant") {
    prefill = request.messages.back()["content"].get<std::string>();  // an assistant's content is text
    while (!prefill.empty() && std::isspace(static_cast<unsigned char>(prefill.back()))) prefill.pop_back();
    size_t lead = 0;
    while (lead < prefill.size() && std::isspace(static_cast<unsigned char>(prefill[lead]))) ++lead;
    prefill.erase(0, lead);
    if (!prefill.empty())
      request.add_generation_prompt = false;
    else if (!request.messages.back().contains("tool_calls"))
      request.messages.erase(request.messages.size() - 1);
  }
  auto rendered = model_.chat_template->render(request);
  if (!rendered.ok()) return bad_request("the chat template failed: " + rendered.error().message, "messages");
  if (!prefill.empty()) {
    const size_t at = rendered->rfind(prefill);
    if (at == std::string::npos)
      return bad_request(
          "the chat template does not show the final assistant message's text, so it cannot be continued", "messages");
    rendered->resize(at + prefill.size());
  }
  std::string text = *rendered;
  if (!images.empty()) {
    auto expanded = model_.images->expand(text, images);
    if (!expanded.ok()) return bad_request("the chat template's rendering: " + expanded.error().message, "messages");
    text = std::move(expanded).value();
  }
  if (auto e = too_long_to_encode(text.size(), "messages")) return *e;
  auto ids = model_.tokenizer->encode(text, /*add_special_tokens=*/false);
  if (!ids.ok()) return bad_request(ids.error().message, "messages");
  Prompt prompt{.ids = std::move(ids).value(),
                .format = engine::chat_output_format(format_, *rendered, request.tools ? tools : nullptr),
                .continues_answer = !prefill.empty()};
  if (!images.empty()) {
    auto layout = model_.images->lay_out(prompt.ids, std::move(images));
    if (!layout.ok()) return bad_request(layout.error().message, "messages");
    prompt.images = std::make_shared<const ImageLayout>(std::move(layout).value());
  }
  return prompt;
}

std::optional<ApiError> Service::too_long_to_encode(size_t text_bytes, const char* param) const {
  if (!model_.scheduler) return std::nullopt;  // no context to hold it to (prompt rendering alone)
  // encoding costs tens of bytes of memory per byte of text: a text that cannot fit is refused first
  const size_t fewest_tokens = text_bytes / (4 * model_.tokenizer->longest_token_bytes());
  if (fewest_tokens < size_t(context())) return std::nullopt;
  return ApiError{.message = fmt::format("This model's context holds {} tokens; the prompt ({} bytes) has at least {}",
                                         context(), text_bytes, fewest_tokens),
                  .param = param,
                  .code = "context_length_exceeded"};
}

std::variant<Prompt, ApiError> Service::text_prompt(const json& p) const {
  const json* prompt = &p;
  if (prompt->is_array() && prompt->size() == 1 && ((*prompt)[0].is_string() || (*prompt)[0].is_array()))
    prompt = &(*prompt)[0];
  Prompt out;
  if (prompt->is_string()) {
    if (!model_.tokenizer) return bad_request("this model has no tokenizer; send the prompt as token ids", "prompt");
    if (auto e = too_long_to_encode(prompt->get_ref<const std::string&>().size(), "prompt")) return *e;
    auto ids = model_.tokenizer->encode(prompt->get<std::string>(), /*add_special_tokens=*/true);
    if (!ids.ok()) return bad_request(ids.error().message, "prompt");
    out.ids = std::move(ids).value();
  } else if (prompt->is_array() && !prompt->empty() && ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
    return bad_request("one prompt per request: an array of several prompts is not supported", "prompt");
  } else if (prompt->is_array()) {
    const int64_t vocab = model_.scheduler->model().info().vocab_size;
    for (const auto& id : *prompt) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab)
        return bad_request(fmt::format("prompt token ids must be integers in [0, {})", vocab), "prompt");
      out.ids.push_back(int32_t(id.get<int64_t>()));
    }
  } else {
    return bad_request("'prompt' must be a string or an array of token ids (one prompt per request)", "prompt");
  }
  if (out.ids.empty()) return bad_request("the prompt is empty", "prompt");
  return out;
}

std::optional<ApiError> Service::busy() const {
  if (!model_.scheduler) return std::nullopt;
  // waiting: the requests in the system beyond the batch's slots (a queued one may be about to
  // take a free slot)
  const SchedulerStats load = model_.scheduler->stats();
  if (const int64_t waiting = load.running + load.queued - model_.scheduler->options().max_batch;
      waiting >= max_waiting_)
    return ApiError{.status = 503,
                    .type = "server_error",
                    .message = fmt::format("the server is busy: {} requests are waiting; retry later", waiting),
                    .code = "server_busy"};
  return std::nullopt;
}

std::variant<std::unique_ptr<TextGeneration>, ApiError> Service::start(GenerationRequest request) {
  if (auto e = busy()) return *e;
  engine::GenerationStart params{.ids = std::move(request.prompt.ids),
                                 .format = request.prompt.format,
                                 .sampling = std::move(request.sampling),
                                 .max_tokens = request.max_tokens,
                                 .refuse_beyond_context = true,
                                 .stops = std::move(request.stops),
                                 .logprobs = request.logprobs,
                                 .one_tool_call = request.one_tool_call,
                                 .images = std::move(request.prompt.images)};
  if (request.call_required) {
    const OutputFormat& format = request.prompt.format;
    const std::string opening = format.call_opening(request.call_name);
    if (opening.empty() || format.call_open.empty() || !model_.tokenizer)
      return bad_request("this model writes no tool calls kiln can read, so none can be required", "tool_choice");
    // where a continued answer stands (inside a call, the reasoning or text) is not known here
    if (request.prompt.continues_answer)
      return bad_request("a required tool call cannot continue a prefilled assistant message", "tool_choice");
    // after the reasoning the prompt opened, or the one the model opens with its first token (the
    // opener: the reasoning marker's first token); at once without reasoning markup
    const bool reasons = !format.think_open.empty() && !format.think_close.empty();
    auto encode = [&](const std::string& text) { return model_.tokenizer->encode(text, false); };
    auto after = encode(reasons ? format.think_close : "");
    auto tokens = encode((reasons ? format.answer_separator() : "") + opening);
    auto at_once = encode(opening);
    auto opener = encode(reasons && !format.starts_in_reasoning ? format.think_open : "");
    if (!after.ok() || !tokens.ok() || !at_once.ok() || !opener.ok())
      return bad_request("the tool-call opening does not encode", "tool_choice");
    params.forced = ForcedTokens{.after = std::move(after).value(),
                                 .tokens = std::move(tokens).value(),
                                 .opener = opener->empty() ? -1 : opener->front(),
                                 .at_once = std::move(at_once).value()};
  }
  if (const OutputFormat& format = request.prompt.format;
      request.reasoning_budget >= 0 && !format.think_open.empty() && !format.think_close.empty() && model_.tokenizer) {
    // the reasoning opens where the model writes the marker's first token, or at once when the
    // prompt opened it
    auto close = model_.tokenizer->encode(format.think_close, false);
    auto open = model_.tokenizer->encode(format.think_open, false);
    if (!close.ok() || !open.ok() || close->empty() || open->empty())
      return bad_request("the reasoning markers do not encode", "thinking");
    params.forced.reasoning_budget = request.reasoning_budget;
    params.forced.reasoning_opener = format.starts_in_reasoning ? -1 : open->front();
    params.forced.reasoning_close = std::move(close).value();
  }
  auto started = engine::start_generation(*model_.scheduler, model_.tokenizer, std::move(params));
  auto* error = std::get_if<engine::StartError>(&started);
  if (!error) return std::move(std::get<std::unique_ptr<TextGeneration>>(started));
  switch (error->fault) {
    case engine::StartFault::empty_prompt:
      return bad_request(error->message, request.prompt_field);
    case engine::StartFault::context:
      return ApiError{.message = error->message, .param = request.prompt_field, .code = "context_length_exceeded"};
    case engine::StartFault::max_tokens:
      return ApiError{.message = error->message, .param = "max_tokens", .code = "context_length_exceeded"};
    case engine::StartFault::logit_bias:
      return bad_request(error->message, "logit_bias");
    case engine::StartFault::images:
      return bad_request(error->message, request.prompt_field);
    case engine::StartFault::unavailable:
      break;
  }
  return ApiError{.status = 503, .type = "server_error", .message = error->message};
}

void Metrics::request(const std::string& endpoint, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{endpoint, status}];
}

void Metrics::latency(double ttft, double total) {
  std::lock_guard lock(mutex_);
  ttft_sum_ += ttft;
  e2e_sum_ += total;
  ++latency_count_;
  for (size_t i = 0; i < std::size(kBuckets); ++i)
    if (ttft <= kBuckets[i]) ++ttft_buckets_[i];
}

std::string Metrics::prometheus(const SchedulerStats& s) const {
  std::lock_guard lock(mutex_);
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, auto value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
  };
  out += "# HELP kiln_http_requests_total HTTP requests by endpoint and status.\n";
  out += "# TYPE kiln_http_requests_total counter\n";
  for (const auto& [key, count] : requests_)
    out += fmt::format("kiln_http_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, count);
  metric("kiln_requests_finished_total", "counter", "Generations finished (any reason).", s.requests_finished);
  metric("kiln_queue_depth", "gauge", "Generations waiting for a batch slot.", s.queued);
  metric("kiln_running_sequences", "gauge", "Generations in the running batch.", s.running);
  metric("kiln_batch_size", "gauge", "Sequences in the most recent step.", s.last_batch);
  metric("kiln_batch_size_mean", "gauge", "Mean sequences per step since start.",
         s.steps ? double(s.step_rows) / double(s.steps) : 0.0);
  metric("kiln_steps_total", "counter", "Batched forward steps.", s.steps);
  metric("kiln_step_seconds_total", "counter", "Time spent in forward steps.", s.step_seconds);
  metric("kiln_prompt_tokens_total", "counter", "Prompt tokens submitted.", s.prompt_tokens);
  metric("kiln_prefill_tokens_total", "counter", "Prompt tokens run through the model.", s.prefilled_tokens);
  metric("kiln_cached_prompt_tokens_total", "counter", "Prompt tokens reused from the prefix cache.", s.cached_tokens);
  metric("kiln_generation_tokens_total", "counter", "Tokens generated.", s.generated_tokens);
  metric("kiln_prefix_cache_hits_total", "counter", "Generations that started from a cached prefix.", s.cache_hits);
  metric("kiln_prefix_cache_misses_total", "counter", "Generations that found no cached prefix.", s.cache_misses);
  metric("kiln_prefix_cache_bytes", "gauge", "Bytes held by the prefix cache.", s.cache_bytes);
  metric("kiln_prefix_cache_entries", "gauge", "Snapshots held by the prefix cache.", s.cache_entries);
  out += "# HELP kiln_time_to_first_token_seconds Time from request to first token.\n";
  out += "# TYPE kiln_time_to_first_token_seconds histogram\n";
  for (size_t i = 0; i < std::size(kBuckets); ++i)
    out += fmt::format("kiln_time_to_first_token_seconds_bucket{{le=\"{}\"}} {}\n", kBuckets[i], ttft_buckets_[i]);
  out += fmt::format("kiln_time_to_first_token_seconds_bucket{{le=\"+Inf\"}} {}\n", latency_count_);
  out += fmt::format("kiln_time_to_first_token_seconds_sum {}\nkiln_time_to_first_token_seconds_count {}\n", ttft_sum_,
                     latency_count_);
  metric("kiln_request_duration_seconds_sum", "counter", "Total time of finished generations.", e2e_sum_);
  metric("kiln_request_duration_seconds_count", "counter", "Finished generations timed.", latency_count_);
  return out;
}

}  // namespace kiln::server
