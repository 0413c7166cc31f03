// kiln generate MODEL_DIR --prompt TEXT [--raw] [--max-tokens N] [--temp T] [--top-p P] [--top-k K]
//                         [--min-p M] [--seed S] [--stop S]... [--ids 1,2,3]
// Streams the completion to stdout (the model's chat template applied unless --raw) and reports
// prompt and decode speed on stderr. With --ids the prompt is token ids and the output is the
// generated ids (a JSON array), which needs no tokenizer.
#include <fmt/format.h>

#include <charconv>
#include <cstdio>

#include "cli/generation.h"
#include "cli/model_source.h"
#include "runtime/decode_loop.h"
#include "runtime/prefill.h"

namespace kiln::cli {

namespace {

struct GenerateOptions {
  std::string model_dir;
  std::string prompt;
  std::string ids;
  bool raw = false;
  GenerationOptions generation;
  RunOptions run;
};

Result<std::vector<int32_t>> parse_id_list(const std::string& text) {
  std::vector<int32_t> ids;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    int64_t v = -1;
    auto [ptr, ec] = std::from_chars(text.data() + begin, text.data() + end, v);
    if (ec != std::errc() || ptr != text.data() + end || v < 0 || v > INT32_MAX)
      return make_error("--ids: '{}' is not a token id", text.substr(begin, end - begin));
    ids.push_back(int32_t(v));
    begin = end + 1;
  }
  return ids;
}

// Greedy or sampled continuation of raw ids, printed as ids: for models without tokenizer files.
Status generate_ids(const GenerateOptions& o, Backend& backend) {
  KILN_ASSIGN(auto ids, parse_id_list(o.ids));
  KILN_ASSIGN(auto model, load_model(o.model_dir, backend));
  KILN_TRY(check_logit_bias(o.generation.sampling, model->info().vocab_size));
  // the context as for text: --ctx or enough for the request, within the model's positions
  const int64_t limit = model->info().max_position_embeddings;
  int64_t context = o.generation.context > 0 ? o.generation.context : int64_t(ids.size()) + o.generation.max_tokens + 1;
  if (limit > 0) context = std::min(context, limit);
  if (int64_t(ids.size()) >= context)
    return make_error("the prompt ({} tokens) and a token to generate do not fit the context of {} tokens", ids.size(),
                      context);
  KILN_ASSIGN(auto state, model->new_sequence(context));
  Sampler sampler(o.generation.sampling);
  std::vector<int32_t> history = ids, out;
  KILN_ASSIGN(Tensor logits, run_tokens(*model, *state, ids, 0, LogitRows::last));  // on the host
  KILN_ASSIGN(int32_t next, draw_next(*model, logits, sampler, history, /*check_finite=*/false, 1));
  SequenceDecoder decoder(*model, *state, sampler);
  for (int64_t i = 0; i < o.generation.max_tokens; ++i) {
    out.push_back(next);
    history.push_back(next);
    if (i + 1 == o.generation.max_tokens || state->length() + 1 >= state->max_context()) break;
    KILN_ASSIGN(next, decoder.next(next, history, /*check_finite=*/false, i + 2));
  }
  std::string json = "[";
  for (size_t i = 0; i < out.size(); ++i) json += (i ? "," : "") + std::to_string(out[i]);
  fmt::print("{}]\n", json);
  return ok_status();
}

Status run_generate(const GenerateOptions& o) {
  KILN_ASSIGN(auto backend, make_backend(o.run));
  if (!o.ids.empty()) return generate_ids(o, *backend);
  if (o.prompt.empty()) return make_error("the prompt is empty");

  // the text (templated unless raw) and its tokens, before the model is loaded
  KILN_ASSIGN(auto tokenizer, Tokenizer::load(o.model_dir));
  std::string text = o.prompt;
  bool add_special = true;
  if (!o.raw) {
    KILN_ASSIGN(ChatTemplate tmpl, ChatTemplate::load(o.model_dir));
    ChatRequest request;
    request.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", o.prompt}}});
    KILN_ASSIGN(text, tmpl.render(request));
    add_special = false;  // the template writes the special tokens itself
  }
  KILN_ASSIGN(auto prompt, tokenizer->encode(text, add_special));
  const int64_t context =
      o.generation.context > 0 ? o.generation.context : int64_t(prompt.size()) + o.generation.max_tokens + 1;
  KILN_ASSIGN(auto session, TextSession::open(o.model_dir, *backend, context, tokenizer));
  KILN_ASSIGN(GenerationStats stats, session->generate(prompt, o.generation, [](const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  }));
  std::fputc('\n', stdout);
  fmt::print(stderr, "prompt: {} tokens, {:.1f} tok/s; generated: {} tokens, {:.1f} tok/s ({})\n", stats.prompt_tokens,
             double(stats.prompt_tokens) / std::max(stats.prompt_seconds, 1e-9), stats.generated_tokens,
             double(stats.generated_tokens) / std::max(stats.decode_seconds, 1e-9), stats.finish_reason);
  return ok_status();
}

}  // namespace

void add_generate_command(CLI::App& app, Action& action, const Environment& env) {
  auto options = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("generate", "Generate text from a prompt, streamed to stdout");
  cmd->add_option("model_dir", options->model_dir,
                  "Model directory or Hugging Face id ORG/NAME[@REV] in the cache (default: the bundled demo model)");
  auto* prompt = cmd->add_option("--prompt", options->prompt, "The prompt (a user message unless --raw)");
  cmd->add_flag("--raw", options->raw, "Feed the prompt as it is, without the chat template");
  cmd->add_option("--ids", options->ids, "Comma-separated prompt token ids; prints generated ids")->excludes(prompt);
  add_sampling_options(*cmd, options->generation);
  add_run_options(*cmd, options->run);
  cmd->callback([options, &action, &env] {
    action = [options, &env]() -> Status {
      KILN_ASSIGN(const ModelSource model, resolve_model(options->model_dir, env));
      options->model_dir = model.dir;
      KILN_TRY(apply_sampling_defaults(options->model_dir, options->generation));
      return run_generate(*options);
    };
  });
}

}  // namespace kiln::cli
