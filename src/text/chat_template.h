// A model directory's chat template, rendered as transformers' tokenizer.apply_chat_template(
// messages, tools=..., add_generation_prompt=..., tokenize=False, **kwargs) renders it (v5):
//  - the template is chat_template.jinja if present, else tokenizer_config.json's "chat_template"
//    (a string, or a list of {name, template}: "tool_use" when tools are given and it exists,
//    else "default");
//  - the template sees messages, tools (None without tools), documents (None),
//    add_generation_prompt, the named special tokens (bos_token, eos_token, unk_token, sep_token,
//    pad_token, cls_token, mask_token: those that are set, as strings), and the extra keyword
//    arguments, which override special tokens of the same name.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "text/jinja/jinja.h"

namespace kiln {

struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  std::optional<nlohmann::ordered_json> tools;  // nullopt: tools=None
  bool add_generation_prompt = true;
  nlohmann::ordered_json extra_variables = nlohmann::ordered_json::object();  // e.g. {"enable_thinking": false}
};

class ChatTemplate {
 public:
  // Reads chat_template.jinja / tokenizer_config.json (and special_tokens_map.json, whose entries
  // override tokenizer_config.json's as transformers' loader does) from `model_dir`.
  static Result<ChatTemplate> load(const std::string& model_dir);

  struct NamedSource {
    std::string name;
    std::string source;
  };
  // Builds a chat template from a template source, or from named ones (tokenizer_config's list
  // form), taking the special tokens from a tokenizer_config-like object.
  static ChatTemplate from_source(std::string source, const nlohmann::ordered_json& tokenizer_config);
  static ChatTemplate from_named_sources(std::vector<NamedSource> templates,
                                         const nlohmann::ordered_json& tokenizer_config);

  // The rendered prompt, or the template's error (raise_exception messages verbatim).
  Result<std::string> render(const ChatRequest& request, const jinja::RenderOptions& options = {},
                             jinja::TemplateFailure* failure = nullptr) const;

  // The variables a render passes to the template.
  nlohmann::ordered_json variables(const ChatRequest& request) const;

  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }

 private:
  // The template transformers' get_chat_template picks for a request.
  Result<const NamedSource*> select(const ChatRequest& request) const;

  std::vector<NamedSource> templates_;  // a single unnamed template is stored as "default"
  bool single_template_ = false;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

}  // namespace kiln
