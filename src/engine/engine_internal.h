// What kiln's own clients (the server, the CLI) see of an Engine beyond the public API: the loaded
// model, tokenizer, chat template and scheduler, and loading on a backend they chose.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "engine/output_parser.h"
#include "kiln/engine.h"
#include "models/model.h"
#include "ops/backend.h"
#include "runtime/sampling_defaults.h"
#include "runtime/scheduler.h"
#include "text/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace kiln {

struct Engine::Impl {
  std::string model_dir;
  LoadOptions options;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::shared_ptr<const Tokenizer> tokenizer;  // null: no tokenizer files (prompts are ids)
  std::optional<ChatTemplate> chat_template;
  std::string tokenizer_error, chat_template_error;  // why there is none
  SamplingDefaults defaults;                         // generation_config.json's (none when not used)
  engine::OutputFormat format;                       // how the model writes reasoning and tool calls

  // Created by load, or by the first request when the context is sized by it.
  mutable std::mutex mutex;
  std::unique_ptr<Scheduler> scheduler;
  Result<Scheduler*> scheduler_for(int64_t tokens_needed);
};

namespace engine {

// Engine::load on a backend the caller made (the CLI's, chosen by its --device and environment).
Result<std::unique_ptr<Engine>> load_engine(const std::string& model_dir, const LoadOptions& options,
                                            std::unique_ptr<Backend> backend);

// The sampling a request runs with: its own settings, then the model's defaults, then kiln's.
SamplingParams sampling_params(const Sampling& sampling, const SamplingDefaults& defaults);

}  // namespace engine
}  // namespace kiln
