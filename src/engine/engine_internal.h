// What kiln's own clients (the server, the CLI) see of an Engine beyond the public API: the loaded
// model, tokenizer, chat template and scheduler, and loading on a backend they chose.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "engine/output_parser.h"
#include "engine/text_generation.h"
#include "kiln/engine.h"
#include "models/model.h"
#include "ops/backend.h"
#include "runtime/prompt_images.h"
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
  std::unique_ptr<ImageInput> images;                // null: the model takes no images
  std::string images_error;                          // why it takes none
  // What the prompt cache's files depend on (with a cache directory): the weights, the backend,
  // the caches' format.
  std::string fingerprint;

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

// A generation as every client starts it (Engine::submit, the server's endpoints): a prompt already
// in ids, how its output is read, and its limits.
struct GenerationStart {
  std::vector<int32_t> ids;
  OutputFormat format;      // plain text unless a chat is parsed
  int64_t keep_prefix = 0;  // the prompt's settled part, kept in the prefix cache
  SamplingParams sampling;
  int64_t max_tokens = 0;  // 0: up to the context
  // A max_tokens beyond the context: cut to what fits (the engine API's promise) or refused (the
  // HTTP APIs', where a client asked for a length it cannot get).
  bool refuse_beyond_context = false;
  std::vector<std::string> stops;
  int logprobs = -1;
  ForcedTokens forced;
  bool one_tool_call = false;
  std::shared_ptr<const ImageLayout> images;  // the prompt's images (null: none)
};

// What is wrong with a generation that cannot start, for clients that answer each differently.
enum class StartFault { empty_prompt, context, max_tokens, logit_bias, images, unavailable };
struct StartError {
  StartFault fault;
  std::string message;
};

// Checks the prompt and limits against the scheduler's context and the model's vocabulary, then
// queues the generation and reads it as text: the one place a generation starts.
std::variant<std::unique_ptr<TextGeneration>, StartError> start_generation(Scheduler& scheduler,
                                                                           std::shared_ptr<const Tokenizer> tokenizer,
                                                                           GenerationStart start);

// A message's images (the engine API's, the CLI's), read by the model's image front end; an error
// names the image when it cannot be read or the model takes no images.
Result<ProcessedImage> read_image_input(const Engine::Impl& e, const Image& image, const std::string& name);

// Why a model takes no images, for a request that brings some.
std::string no_images_reason(const Engine::Impl& e);

}  // namespace engine
}  // namespace kiln
