// kiln template MODEL_DIR --messages FILE.json [--tools FILE.json] [--no-generation-prompt]
//                         [--enable-thinking | --disable-thinking]
// Prints the prompt that transformers' tokenizer.apply_chat_template(messages, tools=tools,
// add_generation_prompt=..., tokenize=False[, enable_thinking=...]) produces, byte for byte, with
// nothing added. A template that raises (e.g. "Conversation roles must alternate") makes the
// command fail with the template's message.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "text/chat_template.h"

namespace kiln::cli {

namespace {

struct TemplateOptions {
  std::string model_dir;
  std::string messages_file;
  std::string tools_file;
  bool no_generation_prompt = false;
  bool enable_thinking = false;
  bool disable_thinking = false;
};

// A JSON file holding a list, or an object with that list under `key`.
Result<nlohmann::ordered_json> read_list(const std::string& path, const char* key) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("cannot read {}", path);
  std::ostringstream text;
  text << in.rdbuf();
  auto json = nlohmann::ordered_json::parse(text.str(), nullptr, false);
  if (json.is_discarded()) return make_error("{} is not valid JSON", path);
  // moved out, not copied: a copy recurses as deep as the JSON nests
  if (json.is_object() && json.contains(key)) json = std::move(json[key]);
  if (!json.is_array()) return make_error("{}: expected a JSON list of {}", path, key);
  return json;
}

Status run_template(const TemplateOptions& o) {
  KILN_ASSIGN(ChatTemplate chat, ChatTemplate::load(o.model_dir));
  ChatRequest request;
  KILN_ASSIGN(request.messages, read_list(o.messages_file, "messages"));
  if (!o.tools_file.empty()) {
    KILN_ASSIGN(request.tools, read_list(o.tools_file, "tools"));
  }
  request.add_generation_prompt = !o.no_generation_prompt;
  if (o.enable_thinking || o.disable_thinking) request.extra_variables["enable_thinking"] = o.enable_thinking;
  KILN_ASSIGN(std::string prompt, chat.render(request));
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  return ok_status();
}

}  // namespace

void add_template_command(CLI::App& app, Action& action, const Environment& env) {
  auto options = std::make_shared<TemplateOptions>();
  auto* cmd = app.add_subcommand("template", "Print the prompt a model's chat template makes of a conversation");
  cmd->add_option("model_dir", options->model_dir,
                  "Model directory (tokenizer_config.json, chat_template.jinja) or Hugging Face id ORG/NAME[@REV]")
      ->required();
  cmd->add_option("--messages", options->messages_file, "JSON file with the list of messages")->required();
  cmd->add_option("--tools", options->tools_file, "JSON file with the list of tool definitions");
  cmd->add_flag("--no-generation-prompt", options->no_generation_prompt,
                "Do not append the assistant's generation prompt (add_generation_prompt=False)");
  auto* enable = cmd->add_flag("--enable-thinking", options->enable_thinking, "Pass enable_thinking=True");
  auto* disable = cmd->add_flag("--disable-thinking", options->disable_thinking, "Pass enable_thinking=False");
  enable->excludes(disable);
  cmd->callback([options, &action, &env] {
    action = [options, &env]() -> Status {
      KILN_ASSIGN(const ModelSource model, resolve_model(options->model_dir, env));
      options->model_dir = model.dir;
      return run_template(*options);
    };
  });
}

}  // namespace kiln::cli
