// kiln chat MODEL_DIR [--system TEXT] [--image PATH]... [sampling options]
// An interactive chat in the terminal, a client of the engine API. The conversation's state stays
// on the device between turns (the scheduler's prefix cache): each turn prefills only what follows
// the previous turn's messages (the last answer as the template renders it, and the new message).
// Ctrl-C stops the current answer; Ctrl-D or /exit ends the chat. Images (--image, or /image PATH
// in the chat) go with the next message.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "cli/generation.h"
#include "cli/model_source.h"
#include "text/tokenizer/unicode.h"

namespace kiln::cli {

namespace {

struct ChatOptions {
  std::string model_dir;
  std::string system;
  bool enable_thinking = false;
  std::vector<std::string> images;
  GenerationOptions generation;
  RunOptions run;
};

Status run_chat(const ChatOptions& o) {
  if (const size_t bad = tokenization::find_invalid_utf8(o.system); bad != tokenization::kNoPosition)
    return make_error("--system is not valid UTF-8 (byte {} of it)", bad);
  // one conversation in a batch of one; the prefix cache keeps its state after each turn's
  // messages (and a few snapshots besides), so each turn prefills only what follows
  KILN_ASSIGN(auto engine, open_engine(o.model_dir, o.run, o.generation,
                                       LoadOptions{.context = o.generation.context > 0 ? o.generation.context : 8192,
                                                   .prompt_cache_snapshots = 4}));
  const ModelSummary model = engine->summary();
  if (!model.has_chat_template) return make_error("{} has no chat template", o.model_dir);
  KILN_TRY(check_logit_bias(o.generation.requested(), model.vocab_size));
  std::vector<Message> messages;
  if (!o.system.empty()) messages.push_back({.role = "system", .content = o.system});
  auto request = [&] {
    return Request{.messages = messages,
                   .enable_thinking = o.enable_thinking,
                   .sampling = o.generation.requested(),
                   .max_tokens = o.generation.max_tokens,
                   .stop = o.generation.stops};
  };
  // what would fail every turn fails here, once: a template that does not render a conversation
  {
    messages.push_back({.role = "user", .content = "Hello"});
    auto probe = engine->prompt_ids(request());
    messages.pop_back();
    if (!probe.ok())
      return make_error("{}: the chat template does not render a conversation: {}", o.model_dir, probe.error().message);
  }

  std::vector<Image> pending;  // images for the next message
  for (const std::string& path : o.images) pending.push_back(Image{.path = path});
  catch_interrupts();
  fmt::print(stderr, "kiln chat: {} ({}). Ctrl-C stops an answer, Ctrl-D or /exit ends.\n", o.model_dir,
             model.model_type);
  for (;;) {
    fmt::print(stderr, "\n> ");
    std::string line;
    interrupted().store(false);
    if (!std::getline(std::cin, line)) {
      if (interrupted().load() && !std::cin.eof()) {
        std::cin.clear();
        continue;
      }
      break;
    }
    if (line == "/exit") break;
    if (line.rfind("/image ", 0) == 0) {
      std::string path = line.substr(7);
      while (!path.empty() && path.back() == ' ') path.pop_back();
      if (!std::filesystem::is_regular_file(path)) {
        fmt::print(stderr, "kiln: error: {}: no such file\n", path);
      } else {
        pending.push_back(Image{.path = path});
        fmt::print(stderr, "[{} image{} for the next message]\n", pending.size(), pending.size() > 1 ? "s" : "");
      }
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({.role = "user", .content = line, .images = pending});
    auto stream = engine->submit(request());
    if (!stream.ok()) {
      messages.pop_back();
      fmt::print(stderr, "kiln: error: {}\n", one_line(stream.error().message));
      continue;
    }
    pending.clear();
    const Printed answer = print_stream(**stream);
    if (answer.finish == Finish::error) {
      messages.pop_back();
      fmt::print(stderr, "kiln: error: {}\n", one_line(answer.error));
      continue;
    }
    messages.push_back({.role = "assistant", .content = answer.content, .reasoning = answer.reasoning});
    const Usage& u = answer.usage;
    const int64_t prefilled = u.prompt_tokens - u.cached_tokens;
    fmt::print(stderr, "[{} new prompt tokens at {:.1f} tok/s; {} generated at {:.1f} tok/s{}]\n", prefilled,
               double(prefilled) / std::max(u.prompt_seconds, 1e-9), u.completion_tokens,
               double(u.completion_tokens) / std::max(u.decode_seconds, 1e-9),
               answer.finish == Finish::cancelled ? ", stopped" : "");
  }
  return ok_status();
}

}  // namespace

void add_chat_command(CLI::App& app, Action& action, const Environment& env) {
  auto options = std::make_shared<ChatOptions>();
  auto* cmd = app.add_subcommand("chat", "Chat with a model in the terminal");
  cmd->add_option("model_dir", options->model_dir,
                  "Model directory or Hugging Face id ORG/NAME[@REV] in the cache (default: the bundled demo model)");
  cmd->add_option("--system", options->system, "A system message");
  cmd->add_flag("--enable-thinking", options->enable_thinking, "Let the model think before answering");
  cmd->add_option("--image", options->images, "An image for the first message (repeatable; /image PATH adds more)")
      ->check(CLI::ExistingFile);
  add_sampling_options(*cmd, options->generation);
  add_run_options(*cmd, options->run);
  cmd->callback([options, &action, &env] {
    action = [options, &env]() -> Status {
      KILN_ASSIGN(const ModelSource model, resolve_model(options->model_dir, env));
      options->model_dir = model.dir;
      return run_chat(*options);
    };
  });
}

}  // namespace kiln::cli
