#include "cli/generation.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>

#include "cli/validators.h"
#include "runtime/decode_loop.h"
#include "runtime/prefill.h"
#include "runtime/sampling_defaults.h"
#include "runtime/stop_strings.h"
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

Status apply_sampling_defaults(const std::string& model_dir, GenerationOptions& o) {
  if (o.generation_config != "auto") return ok_status();
  KILN_ASSIGN(SamplingDefaults defaults, load_sampling_defaults(model_dir));
  auto given = [](const CLI::Option* option) { return option && option->count() > 0; };
  if (given(o.given.temperature)) defaults.temperature.reset();
  if (given(o.given.top_k)) defaults.top_k.reset();
  if (given(o.given.top_p)) defaults.top_p.reset();
  if (given(o.given.min_p)) defaults.min_p.reset();
  if (given(o.given.repetition_penalty)) defaults.repetition_penalty.reset();
  if (defaults.empty()) return ok_status();
  defaults.apply(o.sampling);
  fmt::print(stderr, "sampling defaults from generation_config.json: {} (--generation-config none ignores them)\n",
             defaults.describe());
  return ok_status();
}

Status check_logit_bias(const SamplingParams& sampling, int64_t vocab_size) {
  if (auto id = biased_token_outside(sampling, vocab_size))
    return make_error("--logit-bias: token {} is outside the vocabulary of {} tokens", *id, vocab_size);
  return ok_status();
}

Result<std::unique_ptr<TextSession>> TextSession::open(const std::string& model_dir, Backend& backend, int64_t context,
                                                       std::shared_ptr<const Tokenizer> tokenizer) {
  auto session = std::make_unique<TextSession>();
  if (tokenizer) {
    session->tokenizer_ = std::move(tokenizer);
  } else {
    KILN_ASSIGN(session->tokenizer_, Tokenizer::load(model_dir));
  }
  auto tmpl = ChatTemplate::load(model_dir);
  if (tmpl.ok()) session->chat_template_ = std::move(tmpl).value();
  KILN_ASSIGN(session->model_, load_model(model_dir, backend));
  const int64_t limit = session->model_->info().max_position_embeddings;
  KILN_ASSIGN(session->state_, session->model_->new_sequence(std::min(context, limit > 0 ? limit : context)));
  return session;
}

std::unique_ptr<SequenceState> TextSession::snapshot() {
  return state_->clone(model_->backend());
}

Status TextSession::prefill(const std::vector<int32_t>& tokens) {
  if (tokens.empty()) return ok_status();
  if (state_->length() + int64_t(tokens.size()) >= state_->max_context())
    return make_error("the conversation ({} tokens) and a token to generate do not fit the context of {} tokens",
                      state_->length() + int64_t(tokens.size()), state_->max_context());
  KILN_TRY(run_tokens(*model_, *state_, tokens, 0, LogitRows::last));
  history_.insert(history_.end(), tokens.begin(), tokens.end());
  return ok_status();
}

void TextSession::reset() {
  state_->reset(model_->backend());
  history_.clear();
}

void TextSession::restore(const SequenceState& snapshot, size_t history_length) {
  state_->restore(model_->backend(), snapshot);
  history_.resize(history_length);
}

Result<GenerationStats> TextSession::generate(const std::vector<int32_t>& prompt, const GenerationOptions& options,
                                              const std::function<void(const std::string&)>& emit,
                                              const std::atomic<bool>* stop, const std::function<void()>& prefilled) {
  if (prompt.empty()) return make_error("the prompt is empty");
  if (state_->length() + int64_t(prompt.size()) >= state_->max_context())
    return make_error(
        "the prompt ({} tokens, {} already in context) and a token to generate do not fit the context of {} tokens",
        prompt.size(), state_->length(), state_->max_context());
  GenerationStats stats;
  stats.prompt_tokens = int64_t(prompt.size());
  const int64_t vocab = model_->info().vocab_size;
  KILN_TRY(check_logit_bias(options.sampling, vocab));
  const auto t0 = std::chrono::steady_clock::now();
  KILN_ASSIGN(Tensor logits, run_tokens(*model_, *state_, prompt, 0, LogitRows::last));
  history_.insert(history_.end(), prompt.begin(), prompt.end());
  if (prefilled) prefilled();
  const auto t1 = std::chrono::steady_clock::now();
  stats.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();

  const auto eos = tokenizer_->eos_ids();
  Sampler sampler(options.sampling);
  IncrementalDecoder decoder(tokenizer_, /*skip_special_tokens=*/true);
  StopMatcher stops(options.stops);
  stats.finish_reason = "length";
  // the first token from the prompt's logits, each next one as its predecessor runs through the state
  KILN_ASSIGN(int32_t next, draw_next(*model_, logits, sampler, history_, /*check_finite=*/true, 1));
  SequenceDecoder decode(*model_, *state_, sampler);
  for (int64_t i = 0; i < options.max_tokens; ++i) {
    if (stop && stop->load()) {
      stats.finish_reason = "interrupted";
      break;
    }
    if (std::find(eos.begin(), eos.end(), next) != eos.end()) {
      stats.finish_reason = "stop";
      break;
    }
    ++stats.generated_tokens;
    const std::string shown = stops.push(decoder.push(next));
    if (!shown.empty()) emit(shown);
    if (stops.stopped()) {
      stats.finish_reason = "stop";
      history_.push_back(next);
      break;
    }
    if (state_->length() + 1 >= state_->max_context()) {
      history_.push_back(next);
      break;
    }
    history_.push_back(next);
    if (i + 1 == options.max_tokens) {
      KILN_TRY(decode.feed(next));
      break;
    }
    KILN_ASSIGN(next, decode.next(next, history_, /*check_finite=*/true, i + 2));
  }
  if (!stops.stopped()) {
    const std::string rest = stops.push(decoder.flush());
    if (!rest.empty()) emit(rest);
    const std::string held = stops.flush();
    if (!held.empty()) emit(held);
  }
  stats.decode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return stats;
}

}  // namespace kiln::cli
