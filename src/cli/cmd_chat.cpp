// kiln chat MODEL_DIR [--system TEXT] [sampling options]
// An interactive chat in the terminal. The conversation's state stays on the device between
// turns: each turn prefills only what follows the previous prompt (the last answer as the
// template renders it, and the new message). Ctrl-C stops the current answer; Ctrl-D or /exit
// ends the chat.
#include <fmt/format.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "cli/generation.h"
#include "cli/model_source.h"
#include "text/tokenizer/unicode.h"

namespace kiln::cli {

namespace {

// The one piece of process-wide state: what SIGINT sets, read by the generation loop.
std::atomic<bool> interrupted{false};
extern "C" void on_sigint(int) {
  interrupted.store(true);
}

struct ChatOptions {
  std::string model_dir;
  std::string system;
  bool enable_thinking = false;
  GenerationOptions generation;
  RunOptions run;
};

Status run_chat(const ChatOptions& o) {
  KILN_ASSIGN(auto backend, make_backend(o.run));
  const int64_t context = o.generation.context > 0 ? o.generation.context : 8192;
  KILN_ASSIGN(auto session, TextSession::open(o.model_dir, *backend, context));
  if (!session->chat_template()) return make_error("{} has no chat template", o.model_dir);
  // what would fail every turn fails here, once: a system message that is not text, a template
  // that does not render a conversation
  if (const size_t bad = tokenization::find_invalid_utf8(o.system); bad != tokenization::kNoPosition)
    return make_error("--system is not valid UTF-8 (byte {} of it)", bad);
  {
    ChatRequest probe;
    if (!o.system.empty()) probe.messages.push_back({{"role", "system"}, {"content", o.system}});
    probe.messages.push_back({{"role", "user"}, {"content", "Hello"}});
    probe.extra_variables["enable_thinking"] = o.enable_thinking;
    if (auto text = session->chat_template()->render(probe); !text.ok())
      return make_error("{}: the chat template does not render a conversation: {}", o.model_dir, text.error().message);
  }

  struct sigaction action {};
  action.sa_handler = on_sigint;  // no SA_RESTART: Ctrl-C at the prompt interrupts the read
  sigaction(SIGINT, &action, nullptr);

  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  std::unique_ptr<SequenceState> after_prompt;  // the state right after the last prompt
  size_t prompt_length = 0;                     // tokens in it
  fmt::print(stderr, "kiln chat: {} ({}). Ctrl-C stops an answer, Ctrl-D or /exit ends.\n", o.model_dir,
             session->model().info().model_type);
  for (;;) {
    fmt::print(stderr, "\n> ");
    std::string line;
    interrupted.store(false);
    if (!std::getline(std::cin, line)) {
      if (interrupted.load() && !std::cin.eof()) {
        std::cin.clear();
        continue;
      }
      break;
    }
    if (line == "/exit") break;
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    ChatRequest request;
    request.messages = messages;
    request.extra_variables["enable_thinking"] = o.enable_thinking;
    auto text = session->chat_template()->render(request);
    request.add_generation_prompt = false;
    auto settled_text = session->chat_template()->render(request);  // the conversation without the reply header
    auto tokens = text.ok() ? session->tokenizer().encode(*text) : Result<std::vector<int32_t>>(text.error());
    if (!tokens.ok()) {
      messages.erase(messages.size() - 1);
      fmt::print(stderr, "kiln: error: {}\n", tokens.error().message);
      continue;
    }
    // The settled part (every message so far) is what the next turn's prompt will start with:
    // the state is kept right after it, and the next turn prefills only what follows.
    size_t settled = tokens->size() - 1;
    if (settled_text.ok()) {
      auto settled_tokens = session->tokenizer().encode(*settled_text);
      if (settled_tokens.ok() && settled_tokens->size() < tokens->size() &&
          std::equal(settled_tokens->begin(), settled_tokens->end(), tokens->begin()))
        settled = settled_tokens->size();
    }
    size_t reuse = 0;
    const auto& history = session->history();
    if (after_prompt && prompt_length <= settled &&
        std::equal(history.begin(), history.begin() + prompt_length, tokens->begin())) {
      session->restore(*after_prompt, prompt_length);
      reuse = prompt_length;
    } else {
      session->reset();
    }
    std::vector<int32_t> head(tokens->begin() + reuse, tokens->begin() + settled);
    std::vector<int32_t> tail(tokens->begin() + settled, tokens->end());
    const auto prefill_start = std::chrono::steady_clock::now();
    if (Status s = session->prefill(head); !s.ok()) {
      messages.erase(messages.size() - 1);
      fmt::print(stderr, "kiln: error: {}\n", s.error().message);
      continue;
    }
    after_prompt = session->snapshot();
    prompt_length = session->history().size();
    const double head_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - prefill_start).count();
    std::string answer;
    interrupted.store(false);
    auto stats = session->generate(
        tail, o.generation,
        [&](const std::string& piece) {
          answer += piece;
          std::fwrite(piece.data(), 1, piece.size(), stdout);
          std::fflush(stdout);
        },
        &interrupted);
    std::fputc('\n', stdout);
    if (!stats.ok()) {
      messages.erase(messages.size() - 1);
      fmt::print(stderr, "kiln: error: {}\n", stats.error().message);
      continue;
    }
    stats->prompt_tokens += int64_t(head.size());
    stats->prompt_seconds += head_seconds;
    messages.push_back({{"role", "assistant"}, {"content", answer}});
    fmt::print(stderr, "[{} new prompt tokens at {:.1f} tok/s; {} generated at {:.1f} tok/s{}]\n", stats->prompt_tokens,
               double(stats->prompt_tokens) / std::max(stats->prompt_seconds, 1e-9), stats->generated_tokens,
               double(stats->generated_tokens) / std::max(stats->decode_seconds, 1e-9),
               stats->finish_reason == "interrupted" ? ", stopped" : "");
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
  add_sampling_options(*cmd, options->generation);
  add_run_options(*cmd, options->run);
  cmd->callback([options, &action, &env] {
    action = [options, &env]() -> Status {
      KILN_ASSIGN(const ModelSource model, resolve_model(options->model_dir, env));
      options->model_dir = model.dir;
      KILN_TRY(apply_sampling_defaults(options->model_dir, options->generation));
      return run_chat(*options);
    };
  });
}

}  // namespace kiln::cli
