#include "cli/generation.h"

#include <signal.h>

#include <charconv>
#include <cmath>
#include <cstdio>

#include "cli/validators.h"
#include "engine/engine_internal.h"
#include "text/tokenizer/unicode.h"

namespace kiln::cli {

namespace {

// "ID=BIAS", as OpenAI's logit_bias takes it: a token id and a bias in [-100, 100].
std::optional<std::pair<int32_t, float>> parse_logit_bias(const std::string& item) {
  const size_t eq = item.find('=');
  if (eq == std::string::npos) return std::nullopt;
  const char* end = item.data() + item.size();
  int64_t id = -1;
  double bias = NAN;
  const auto id_read = std::from_chars(item.data(), item.data() + eq, id);
  const auto bias_read = std::from_chars(item.data() + eq + 1, end, bias);
  if (id_read.ec != std::errc() || id_read.ptr != item.data() + eq || id < 0 || id > INT32_MAX) return std::nullopt;
  if (bias_read.ec != std::errc() || bias_read.ptr != end || !std::isfinite(bias) || std::abs(bias) > kMaxLogitBias)
    return std::nullopt;
  return std::pair{int32_t(id), float(bias)};
}

}  // namespace

void add_sampling_options(CLI::App& cmd, GenerationOptions& o) {
  cmd.add_option("--max-tokens", o.max_tokens, "Most tokens to generate")->check(positive_number());
  o.given.temperature =
      cmd.add_option("--temp", o.sampling.temperature, "Temperature (0: greedy)")->check(non_negative_number());
  o.given.top_p = cmd.add_option("--top-p", o.sampling.top_p, "Nucleus sampling mass")->check(number_in(0.0, 1.0));
  o.given.top_k = cmd.add_option("--top-k", o.sampling.top_k, "Sample among the k most likely (0: all)")
                      ->check(non_negative_number());
  o.given.min_p = cmd.add_option("--min-p", o.sampling.min_p, "Drop tokens below this share of the best")
                      ->check(number_in(0.0, 1.0));
  o.given.repetition_penalty =
      cmd.add_option("--repetition-penalty", o.sampling.repetition_penalty, "transformers' repetition penalty")
          ->check(positive_number());
  cmd.add_option("--generation-config", o.generation_config,
                 "auto: sampling options not given follow the model's generation_config.json; none: kiln's "
                 "defaults (temperature 1, no cuts)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "none"}));
  cmd.add_option("--presence-penalty", o.sampling.presence_penalty, "OpenAI's presence penalty")
      ->check(number_in(-2.0, 2.0));
  cmd.add_option("--frequency-penalty", o.sampling.frequency_penalty, "OpenAI's frequency penalty")
      ->check(number_in(-2.0, 2.0));
  cmd.add_option_function<std::vector<std::string>>(
         "--logit-bias",
         [&o](const std::vector<std::string>& items) {
           for (const std::string& item : items) {
             auto bias = parse_logit_bias(item);
             if (!bias)
               throw CLI::ValidationError("--logit-bias", "'" + item + "' is not ID=BIAS, BIAS in [-100, 100]");
             o.sampling.logit_bias.push_back(*bias);
           }
         },
         "Add BIAS (-100 to 100) to token ID's logit before sampling (repeatable)")
      ->type_name("ID=BIAS");
  cmd.add_option("--seed", o.sampling.seed, "Random seed (same seed, same output)")->check(unsigned_64());
  cmd.add_option("--stop", o.stops, "Stop when the text contains this (repeatable)")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            // the output is UTF-8: a stop string that is not could never match
            if (const size_t bad = tokenization::find_invalid_utf8(text); bad != tokenization::kNoPosition)
              return fmt::format("is not valid UTF-8 (byte {})", bad);
            return "";
          },
          "", "UTF-8 text"));
  cmd.add_option("--ctx", o.context, "Context size in tokens (default: enough for the request)")
      ->check(non_negative_number());
}

Sampling GenerationOptions::requested() const {
  auto given = [](const CLI::Option* option) { return option && option->count() > 0; };
  Sampling s{.presence_penalty = sampling.presence_penalty,
             .frequency_penalty = sampling.frequency_penalty,
             .logit_bias = sampling.logit_bias,
             .seed = sampling.seed};
  if (given(this->given.temperature)) s.temperature = sampling.temperature;
  if (given(this->given.top_k)) s.top_k = sampling.top_k;
  if (given(this->given.top_p)) s.top_p = sampling.top_p;
  if (given(this->given.min_p)) s.min_p = sampling.min_p;
  if (given(this->given.repetition_penalty)) s.repetition_penalty = sampling.repetition_penalty;
  return s;
}

Result<std::unique_ptr<Engine>> open_engine(const std::string& model_dir, const RunOptions& run,
                                            const GenerationOptions& generation, LoadOptions load) {
  KILN_ASSIGN(auto backend, make_backend(run));
  load.use_generation_config = generation.generation_config == "auto";
  load.kv_bits = run.kv_bits;
  load.kv_group_size = run.kv_group_size;
  KILN_ASSIGN(auto engine, engine::load_engine(model_dir, load, std::move(backend)));
  if (const std::string defaults = engine->sampling_defaults(generation.requested()); !defaults.empty())
    fmt::print(stderr, "sampling defaults from generation_config.json: {} (--generation-config none ignores them)\n",
               defaults);
  return engine;
}

Status check_logit_bias(const Sampling& sampling, int64_t vocab_size) {
  for (const auto& [id, bias] : sampling.logit_bias)
    if (id >= vocab_size)
      return make_error("--logit-bias: token {} is outside the vocabulary of {} tokens", id, vocab_size);
  return ok_status();
}

namespace {

// The one piece of process-wide state: what SIGINT sets, read while a request streams.
std::atomic<bool> interrupt_flag{false};
extern "C" void on_sigint(int) {
  interrupt_flag.store(true);
}

}  // namespace

void catch_interrupts() {
  struct sigaction action {};
  action.sa_handler = on_sigint;  // no SA_RESTART: Ctrl-C at chat's prompt interrupts the read
  sigaction(SIGINT, &action, nullptr);
}

std::atomic<bool>& interrupted() {
  return interrupt_flag;
}

Printed print_stream(Stream& stream, bool print) {
  Printed out;
  char last = '\n';  // the last character printed
  auto show = [&](const std::string& text) {
    if (!print || text.empty()) return;
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    last = text.back();
  };
  Event event;
  bool cancelled = false;
  while (stream.next(event)) {
    if (interrupted().load() && !cancelled) {
      stream.cancel();
      cancelled = true;
    }
    out.tokens.insert(out.tokens.end(), event.tokens.begin(), event.tokens.end());
    show(event.reasoning);
    out.reasoning += event.reasoning;
    // the answer apart from the reasoning before it
    if (!event.content.empty() && out.content.empty() && !out.reasoning.empty()) show("\n\n");
    show(event.content);
    out.content += event.content;
    for (const ToolCall& call : event.tool_calls) show(fmt::format("[tool call] {}({})\n", call.name, call.arguments));
    if (event.finish != Finish::none) {
      out.finish = event.finish;
      out.error = event.error;
      out.usage = event.usage;
    }
  }
  if (print && last != '\n') show("\n");
  std::fflush(stdout);
  return out;
}

}  // namespace kiln::cli
