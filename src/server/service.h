// What the HTTP endpoints share, independent of protocol: the served model (scheduler,
// tokenizer, chat template), turning messages or prompts into token ids, starting generations,
// and the counters /metrics reports.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "engine/output_parser.h"
#include "engine/text_generation.h"
#include "runtime/prompt_images.h"
#include "runtime/scheduler.h"
#include "server/image_sources.h"
#include "server/request_fields.h"
#include "text/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace kiln::server {

// The text layer under the endpoints (detokenizing, stop strings, reasoning and tool calls).
using engine::OutputDelta;
using engine::OutputFormat;
using engine::TextGeneration;
using engine::TextGenerationOptions;
using engine::ToolCall;
using engine::ToolFormat;

struct ServedModel {
  Scheduler* scheduler = nullptr;
  std::shared_ptr<const Tokenizer> tokenizer;  // null: the model directory has no tokenizer files
  std::optional<ChatTemplate> chat_template;
  std::string name;  // the id clients pass as "model"
  // What a request's sampling starts from: kiln's defaults with the model's generation_config.json
  // sampling applied (unless the server was told to ignore it).
  SamplingParams sampling;
  const ImageInput* images = nullptr;  // null: the model takes no images
  ImageFetchOptions image_fetch;
};

// Images one request may hold.
constexpr size_t kMaxImages = 32;

struct Prompt {
  std::vector<int32_t> ids;
  OutputFormat format;                        // how to read the output (chat); plain text otherwise
  bool continues_answer = false;              // it ends in a final assistant message's text, left open
  std::shared_ptr<const ImageLayout> images;  // the images its ids hold (null: none)
};

struct GenerationRequest {
  Prompt prompt;
  SamplingParams sampling;
  int64_t max_tokens = 0;  // 0: up to the context
  std::vector<std::string> stops;
  int logprobs = -1;                      // -1: none; else each token's log-probability and this many alternatives
  std::string prompt_field = "messages";  // what a context error names
  // tool_choice "required" (Anthropic's "any") or a named function: the answer opens a tool call
  // (of call_name when set), forced where the answer begins
  bool call_required = false;
  std::string call_name;
  // OpenAI's parallel_tool_calls: false (Anthropic's disable_parallel_tool_use): the answer ends
  // with its first tool call
  bool one_tool_call = false;
  // Anthropic's thinking.budget_tokens (vLLM's thinking_token_budget): the reasoning is closed
  // after this many tokens (-1: no cap; nothing to cap for a model without reasoning markup)
  int64_t reasoning_budget = -1;
};

// Request and latency counters for /metrics.
class Metrics {
 public:
  void request(const std::string& endpoint, int status);
  void latency(double first_token_seconds, double total_seconds);
  std::string prometheus(const SchedulerStats& stats) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  double ttft_sum_ = 0, e2e_sum_ = 0;
  int64_t latency_count_ = 0;
  // bucketed time to first token, seconds
  static constexpr double kBuckets[] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  int64_t ttft_buckets_[std::size(kBuckets)] = {};
};

class Service {
 public:
  explicit Service(ServedModel model);

  const std::string& model_name() const { return model_.name; }
  const ServedModel& model() const { return model_; }
  Scheduler& scheduler() { return *model_.scheduler; }
  Metrics& metrics() { return metrics_; }
  int64_t context() const { return model_.scheduler->options().context; }

  // Renders OpenAI-style messages (and tools) with the chat template and tokenizes the result.
  // With continue_final_message a last assistant message is left open for the model to continue.
  std::variant<Prompt, ApiError> chat_prompt(const nlohmann::json& messages, const nlohmann::json* tools,
                                             const nlohmann::json& template_kwargs,
                                             bool continue_final_message = false) const;
  // A completion prompt: text, or token ids (an array of integers).
  std::variant<Prompt, ApiError> text_prompt(const nlohmann::json& prompt) const;

  // Queues a generation; 503 when `max_waiting` requests already wait for a batch slot.
  std::variant<std::unique_ptr<TextGeneration>, ApiError> start(GenerationRequest request);
  void set_max_waiting(int64_t n) { max_waiting_ = n; }

  // Checks the request's "model" field against the served model.
  std::optional<ApiError> check_model(const std::string& requested) const;

  // Streamed responses still being written: stopping the HTTP server would cut them off, so a
  // graceful stop waits for them after the scheduler has finished their generations.
  void stream_opened();
  void stream_closed();
  void wait_for_streams();

 private:
  // 503 when `max_waiting` requests already wait for a batch slot.
  std::optional<ApiError> busy() const;
  // A context error for a text too long to fit without encoding it (none when it may fit).
  std::optional<ApiError> too_long_to_encode(size_t text_bytes, const char* param) const;

  ServedModel model_;
  OutputFormat format_;
  Metrics metrics_;
  std::mutex streams_mutex_;
  std::condition_variable streams_closed_;
  int open_streams_ = 0;
  int64_t max_waiting_ = INT64_MAX;
};

}  // namespace kiln::server
