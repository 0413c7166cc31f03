// kiln generate MODEL_DIR --prompt TEXT [--image PATH]... [--raw] [--max-tokens N] [--temp T] [--top-p P]
//                         [--top-k K] [--min-p M] [--seed S] [--stop S]... [--ids 1,2,3]
// Streams the completion to stdout (the model's chat template applied unless --raw) and reports
// prompt and decode speed on stderr. With --ids the prompt is token ids and the output is the
// generated ids (a JSON array), which needs no tokenizer. --image shows the model an image (before
// the prompt in the user message; with --raw at each image placeholder of the text; with --ids at
// each run of image tokens, as the Hugging Face processor expands them). A client of the engine API: one request
// through the scheduler, with the server's stop strings, limits and output parsing; Ctrl-C stops it.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdio>

#include "cli/generation.h"
#include "cli/model_source.h"

namespace kiln::cli {

namespace {

struct GenerateOptions {
  std::string model_dir;
  std::string prompt;
  std::string ids;
  bool raw = false;
  std::vector<std::string> images;
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

// The prompt: token ids (--ids), the text as it is (--raw), or a user message in the chat template.
Result<Request> make_request(const GenerateOptions& o) {
  Request request{
      .sampling = o.generation.requested(), .max_tokens = o.generation.max_tokens, .stop = o.generation.stops};
  if (!o.ids.empty()) {
    KILN_ASSIGN(request.ids, parse_id_list(o.ids));
  } else if (o.prompt.empty()) {
    return make_error("the prompt is empty");
  } else if (o.raw) {
    request.text = o.prompt;
  } else {
    request.messages = {Message{.role = "user", .content = o.prompt}};
  }
  std::vector<Image> images;
  for (const std::string& path : o.images) images.push_back(Image{.path = path});
  if (request.messages.empty())
    request.images = std::move(images);
  else
    request.messages.front().images = std::move(images);
  return request;
}

Status run_generate(const GenerateOptions& o) {
  KILN_ASSIGN(Request request, make_request(o));
  // a batch of one, its context --ctx or enough for the request
  KILN_ASSIGN(auto engine, open_engine(o.model_dir, o.run, o.generation, LoadOptions{.context = o.generation.context}));
  KILN_TRY(check_logit_bias(request.sampling, engine->summary().vocab_size));
  KILN_ASSIGN(auto stream, engine->submit(request));
  catch_interrupts();
  // with --ids the output is the generated ids, which needs no tokenizer
  const Printed out = print_stream(*stream, /*print=*/o.ids.empty());
  if (out.finish == Finish::error) return make_error("{}", out.error);
  if (!o.ids.empty()) {
    std::string json = "[";
    for (size_t i = 0; i < out.tokens.size(); ++i) json += (i ? "," : "") + std::to_string(out.tokens[i]);
    fmt::print("{}]\n", json);
    std::fflush(stdout);
  }
  const Usage& u = out.usage;
  const int64_t prefilled = u.prompt_tokens - u.cached_tokens;
  fmt::print(stderr, "prompt: {} tokens, {:.1f} tok/s; generated: {} tokens, {:.1f} tok/s ({})\n", prefilled,
             double(prefilled) / std::max(u.prompt_seconds, 1e-9), u.completion_tokens,
             double(u.completion_tokens) / std::max(u.decode_seconds, 1e-9),
             out.finish == Finish::cancelled ? "interrupted" : finish_name(out.finish));
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
  cmd->add_option("--image", options->images,
                  "An image to show the model (repeatable): before the prompt; with --raw or --ids at its placeholder")
      ->check(CLI::ExistingFile);
  add_sampling_options(*cmd, options->generation);
  add_run_options(*cmd, options->run);
  cmd->callback([options, &action, &env] {
    action = [options, &env]() -> Status {
      KILN_ASSIGN(const ModelSource model, resolve_model(options->model_dir, env));
      options->model_dir = model.dir;
      return run_generate(*options);
    };
  });
}

}  // namespace kiln::cli
