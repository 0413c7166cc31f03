// kiln tokenize MODEL_DIR (--text T | --file PATH) [--add-special]
// Prints the token ids of a text as a JSON array on one line. Needs only the directory's
// tokenizer files (tokenizer.json, tokenizer_config.json), no weights: others use it to check
// kiln's text handling, so its interface stays fixed.
#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/tokenizer_json.h"

namespace kiln::cli {

namespace {

struct TokenizeOptions {
  std::string model_dir;
  std::string text;
  std::string file;
  bool add_special = false;
  CLI::Option* text_option = nullptr;
  CLI::Option* file_option = nullptr;
};

Status run_tokenize(const TokenizeOptions& o) {
  // checked here rather than by CLI11 so that every misuse ends in one "kiln: error:" line
  if (o.model_dir.empty()) return make_error("tokenize: MODEL_DIR is required");
  const bool has_text = o.text_option->count() > 0;
  const bool has_file = o.file_option->count() > 0;
  if (has_text == has_file) return make_error("tokenize: give exactly one of --text and --file");
  std::string text = o.text;
  if (has_file) {
    KILN_ASSIGN(text, tokenization::read_file(o.file));
  }
  KILN_ASSIGN(auto tokenizer, Tokenizer::load(o.model_dir));
  auto ids = tokenizer->encode(text, o.add_special);
  if (!ids) return make_error("{}: {}", has_file ? o.file : "--text", ids.error().message);
  fmt::print("[{}]\n", fmt::join(*ids, ","));
  return ok_status();
}

}  // namespace

void add_tokenize_command(CLI::App& app, Action& action, const Environment& env) {
  auto options = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
  cmd->add_option("model_dir", options->model_dir,
                  "Model directory (tokenizer.json, tokenizer_config.json) or Hugging Face id ORG/NAME[@REV]");
  options->text_option = cmd->add_option("--text", options->text, "The text to tokenize");
  options->file_option = cmd->add_option("--file", options->file, "A UTF-8 file to tokenize");
  cmd->add_flag("--add-special", options->add_special, "Add the special tokens of the tokenizer's template (BOS)");
  cmd->callback([options, &action, &env] {
    action = [options, &env]() -> Status {
      if (!options->model_dir.empty()) {  // run_tokenize reports a missing one
        KILN_ASSIGN(const ModelSource model, resolve_model(options->model_dir, env));
        options->model_dir = model.dir;
      }
      return run_tokenize(*options);
    };
  });
}

}  // namespace kiln::cli
