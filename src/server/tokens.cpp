// /tokenize and /detokenize as vLLM serves them (and with llama.cpp's field names): a prompt's
// token ids, its text (or a conversation through the chat template), and ids back to text.
#include <httplib.h>

#include "server/handlers.h"

namespace kiln::server {

using nlohmann::json;

namespace {

void respond_error(Service& service, httplib::Response& res, const std::string& endpoint, const ApiError& e) {
  service.metrics().request(endpoint, e.status);
  respond_json(res, e.status, openai_error(e));
}

}  // namespace

void handle_tokenize(Service& service, const httplib::Request& req, httplib::Response& res) {
  const std::string endpoint = "/tokenize";
  auto fail = [&](const ApiError& e) { respond_error(service, res, endpoint, e); };
  auto parsed = read_request(service, req);
  if (auto* e = std::get_if<ApiError>(&parsed)) return fail(*e);
  const json& body = std::get<json>(parsed);
  RequestFields fields(body);
  if (!service.model().tokenizer) return fail(ApiError{.message = "this model has no tokenizer", .param = "prompt"});
  std::vector<int32_t> ids;
  if (const json* messages = fields.array("messages")) {
    // a conversation, rendered by the chat template as /v1/chat/completions renders it
    bool generation_prompt = true, continue_final = false;
    fields.boolean("add_generation_prompt", generation_prompt);
    fields.boolean("continue_final_message", continue_final);
    const json* tools = fields.array("tools");
    json kwargs = json::object();
    if (const json* k = fields.object("chat_template_kwargs")) kwargs = *k;
    if (!generation_prompt && !continue_final)
      fields.fail("add_generation_prompt",
                  "'add_generation_prompt': false is not supported (the prompt a chat request runs)");
    if (!fields.ok()) return fail(*fields.error());
    auto prompt = service.chat_prompt(*messages, tools, kwargs, continue_final);
    if (auto* e = std::get_if<ApiError>(&prompt)) return fail(*e);
    ids = std::move(std::get<Prompt>(prompt).ids);
  } else {
    // vLLM's "prompt" and add_special_tokens (default true), llama.cpp's "content" and add_special
    std::string text;
    bool special = true;
    const char* key = body.contains("content") && !body.contains("prompt") ? "content" : "prompt";
    fields.string(key, text, /*required=*/true);
    fields.boolean(body.contains("add_special") ? "add_special" : "add_special_tokens", special);
    if (!fields.ok()) return fail(*fields.error());
    auto encoded = service.model().tokenizer->encode(text, special);
    if (!encoded.ok()) return fail(ApiError{.message = encoded.error().message, .param = key});
    ids = std::move(encoded).value();
  }
  service.metrics().request(endpoint, 200);
  respond_json(res, 200, {{"count", ids.size()}, {"max_model_len", service.context()}, {"tokens", ids}});
}

void handle_detokenize(Service& service, const httplib::Request& req, httplib::Response& res) {
  const std::string endpoint = "/detokenize";
  auto fail = [&](const ApiError& e) { respond_error(service, res, endpoint, e); };
  auto parsed = read_request(service, req);
  if (auto* e = std::get_if<ApiError>(&parsed)) return fail(*e);
  const json& body = std::get<json>(parsed);
  RequestFields fields(body);
  const json* tokens = fields.array("tokens", /*required=*/true);
  if (!fields.ok()) return fail(*fields.error());
  if (!service.model().tokenizer) return fail(ApiError{.message = "this model has no tokenizer", .param = "tokens"});
  const int64_t vocab = service.model().tokenizer->vocab_size();
  std::vector<int32_t> ids;
  for (const json& t : *tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
      return fail(ApiError{.message = fmt::format("'tokens' must be integers in [0, {})", vocab), .param = "tokens"});
    ids.push_back(int32_t(t.get<int64_t>()));
  }
  auto text = service.model().tokenizer->decode(ids);
  if (!text.ok()) return fail(ApiError{.message = text.error().message, .param = "tokens"});
  service.metrics().request(endpoint, 200);
  // vLLM answers "prompt", llama.cpp "content"
  respond_json(res, 200, {{"prompt", *text}, {"content", *text}});
}

}  // namespace kiln::server
