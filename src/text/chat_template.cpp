// Loading and rendering a model's chat template. See chat_template.h.
#include "text/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/files.h"

namespace kiln {

namespace {

namespace fs = std::filesystem;

// transformers' SPECIAL_TOKENS_ATTRIBUTES (v5: the named tokens only).
constexpr const char* kSpecialTokenNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                              "pad_token", "cls_token", "mask_token"};

Result<std::string> read_file(const fs::path& path) {
  KILN_TRY(require_regular_file_if_present(path.string()));
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("cannot read {}", path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

Result<nlohmann::ordered_json> read_json(const fs::path& path) {
  KILN_ASSIGN(std::string text, read_file(path));
  auto json = nlohmann::ordered_json::parse(text, nullptr, false);
  if (json.is_discarded()) return make_error("{} is not valid JSON", path.string());
  return json;
}

// A special token is a string or an AddedToken object {"content": ...}; null means unset.
void collect_special_tokens(const nlohmann::ordered_json& config, nlohmann::ordered_json& tokens) {
  if (!config.is_object()) return;
  for (const char* name : kSpecialTokenNames) {
    auto it = config.find(name);
    if (it == config.end()) continue;
    if (it->is_string()) {
      tokens[name] = *it;
    } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      tokens[name] = (*it)["content"];
    } else if (it->is_null()) {
      tokens.erase(name);
    }
  }
}

}  // namespace

ChatTemplate ChatTemplate::from_source(std::string source, const nlohmann::ordered_json& tokenizer_config) {
  ChatTemplate chat;
  chat.templates_.push_back({"default", std::move(source)});
  chat.single_template_ = true;
  collect_special_tokens(tokenizer_config, chat.special_tokens_);
  return chat;
}

ChatTemplate ChatTemplate::from_named_sources(std::vector<NamedSource> templates,
                                              const nlohmann::ordered_json& tokenizer_config) {
  ChatTemplate chat;
  chat.templates_ = std::move(templates);
  collect_special_tokens(tokenizer_config, chat.special_tokens_);
  return chat;
}

Result<ChatTemplate> ChatTemplate::load(const std::string& model_dir) {
  const fs::path dir(model_dir);
  if (!fs::is_directory(dir)) return make_error("{} is not a directory", model_dir);
  ChatTemplate chat;
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (fs::exists(dir / "tokenizer_config.json")) {
    KILN_ASSIGN(config, read_json(dir / "tokenizer_config.json"));
  }
  collect_special_tokens(config, chat.special_tokens_);
  if (fs::exists(dir / "special_tokens_map.json")) {
    KILN_ASSIGN(auto map, read_json(dir / "special_tokens_map.json"));
    collect_special_tokens(map, chat.special_tokens_);
  }

  if (fs::exists(dir / "chat_template.jinja")) {
    KILN_ASSIGN(std::string source, read_file(dir / "chat_template.jinja"));
    chat.templates_.push_back({"default", std::move(source)});
    chat.single_template_ = true;
    return chat;
  }
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return chat;  // no template: render() reports it
  if (it->is_string()) {
    chat.templates_.push_back({"default", it->get<std::string>()});
    chat.single_template_ = true;
  } else if (it->is_array()) {
    for (const auto& entry : *it) {
      if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") || !entry["name"].is_string() ||
          !entry["template"].is_string())
        return make_error("{}: chat_template entries must be {{\"name\", \"template\"}} objects",
                          (dir / "tokenizer_config.json").string());
      chat.templates_.push_back({entry["name"].get<std::string>(), entry["template"].get<std::string>()});
    }
  } else {
    return make_error("{}: chat_template must be a string or a list", (dir / "tokenizer_config.json").string());
  }
  return chat;
}

Result<const ChatTemplate::NamedSource*> ChatTemplate::select(const ChatRequest& request) const {
  if (templates_.empty())
    return make_error(
        "Cannot use chat template functions because tokenizer.chat_template is not set and no template argument was "
        "passed!");
  if (single_template_) return &templates_.front();
  auto find = [&](std::string_view name) -> const NamedSource* {
    for (const NamedSource& t : templates_)
      if (t.name == name) return &t;
    return nullptr;
  };
  if (request.tools) {
    if (const NamedSource* t = find("tool_use")) return t;
  }
  if (const NamedSource* t = find("default")) return t;
  std::string names;
  for (const NamedSource& t : templates_) names += (names.empty() ? "" : ", ") + t.name;
  return make_error(
      "This model has multiple chat templates with no default specified! Please either pass a chat template or the "
      "name of the template you wish to use to the `chat_template` argument. Available template names are [{}].",
      names);
}

nlohmann::ordered_json ChatTemplate::variables(const ChatRequest& request) const {
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  vars["messages"] = request.messages;
  vars["tools"] = request.tools ? *request.tools : nlohmann::ordered_json(nullptr);
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = request.add_generation_prompt;
  for (const auto& [name, value] : special_tokens_.items()) vars[name] = value;
  if (request.extra_variables.is_object())
    for (const auto& [name, value] : request.extra_variables.items()) vars[name] = value;
  return vars;
}

Result<std::string> ChatTemplate::render(const ChatRequest& request, const jinja::RenderOptions& options,
                                         jinja::TemplateFailure* failure) const {
  KILN_ASSIGN(const NamedSource* chosen, select(request));
  KILN_ASSIGN(jinja::Template compiled, jinja::Template::parse(chosen->source, failure));
  // variables() copies the request's JSON, and a copy recurses as deep as the JSON nests
  KILN_TRY(jinja::Template::check_depth(request.messages, failure));
  if (request.tools) KILN_TRY(jinja::Template::check_depth(*request.tools, failure));
  for (const auto& [name, value] : request.extra_variables.items())
    KILN_TRY(jinja::Template::check_depth(value, failure));
  return compiled.render(variables(request), options, failure);
}

}  // namespace kiln
