// What kiln generate and kiln chat share: their sampling options, the engine they run on (the
// model on the backend --device chose), and printing a request's stream to the terminal. The
// generation itself (stop strings, end of sequence, limits, output parsing) is the engine's.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "kiln/engine.h"
#include "runtime/sampler.h"

namespace kiln::cli {

struct GenerationOptions {
  int64_t max_tokens = 256;
  int64_t context = 0;  // 0: the command's default
  SamplingParams sampling;
  std::vector<std::string> stops;
  std::string generation_config = "auto";  // auto: unset sampling follows the model's generation_config.json
  // The sampling options as parsed, which tell what the command line set itself.
  struct {
    CLI::Option *temperature = nullptr, *top_k = nullptr, *top_p = nullptr, *min_p = nullptr,
                *repetition_penalty = nullptr;
  } given;

  // The request's sampling: what the command line set (the rest follows generation_config.json).
  Sampling requested() const;
};

// Options shared by generate and chat.
void add_sampling_options(CLI::App& command, GenerationOptions& options);

// The engine for generate and chat on `run`'s backend. With --generation-config auto, notes on
// stderr the model's sampling defaults that the command line left unset.
Result<std::unique_ptr<Engine>> open_engine(const std::string& model_dir, const RunOptions& run,
                                            const GenerationOptions& generation, LoadOptions load);

// Refuses a --logit-bias token outside the model's vocabulary (the sampler would skip it silently).
Status check_logit_bias(const Sampling& sampling, int64_t vocab_size);

// Ctrl-C sets the flag interrupted() returns (and does not end the process) from now on.
void catch_interrupts();
std::atomic<bool>& interrupted();

// A request's output as printed.
struct Printed {
  std::string content, reasoning;
  std::vector<int32_t> tokens;
  Finish finish = Finish::none;
  std::string error;
  Usage usage;
};

// Prints a stream's text to stdout as it arrives (reasoning, then a blank line, then the answer)
// and cancels it once interrupted() is set. Ends the text's line and flushes stdout, so that what
// goes to stderr next starts a line of its own.
Printed print_stream(Stream& stream, bool print = true);

}  // namespace kiln::cli
