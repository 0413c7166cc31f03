// kiln's public C++ API: load a model, submit requests, stream what they generate, cancel them.
//
//   auto engine = kiln::Engine::load("models/kiln-kjv-31m", {.device = "cpu"});
//   auto stream = (*engine)->submit({.messages = {{"user", "Hello"}}, .max_tokens = 64});
//   kiln::Event event;
//   while ((*stream)->next(event)) std::cout << event.content;
//
// An Engine owns a model with its tokenizer, chat template and sampling defaults
// (generation_config.json) on one device, and a scheduler that runs every submitted request in a
// continuous batch (a batch of one when one request runs). Each request's output comes back as
// events: its token ids, its text split into answer, reasoning and tool calls in the model's own
// markup, and at the end why it finished and what it cost. kiln's command line and server are
// clients of the same path. See docs/api.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/status.h"

namespace kiln {

struct LoadOptions {
  std::string device;  // "cpu" or "cuda"; empty: cuda when a GPU is present, else cpu
  int threads = 0;     // CPU threads (0: all cores)
  // Tokens one request holds (prompt plus output), within the model's positions. 0: sized by the
  // first request submitted (its prompt plus max_tokens), which suits one-shot use.
  int64_t context = 4096;
  int64_t max_batch = 1;        // requests generating at once; more wait their turn
  int64_t prefill_chunk = 256;  // most prompt tokens one step runs
  // Prefix cache: a request whose prompt starts with tokens seen before (a conversation's earlier
  // turns) prefills only the rest. Its budget in bytes, or at least room for this many snapshots of
  // a request's whole state (a conversation needs 4: see docs/api.md). 0 and 0: no cache.
  size_t prompt_cache_bytes = 0;
  int prompt_cache_snapshots = 0;
  // The prefix cache's entries kept on disk too, in files under cache_dir (none when empty; needs
  // the prefix cache), so that prompts seen before a restart start warm. The files are kept within
  // cache_dir_bytes, the least recently used removed first. See docs/serving.md.
  std::string cache_dir;
  size_t cache_dir_bytes = size_t(32) << 30;
  // Sampling a request leaves unset follows the model's generation_config.json (false: kiln's own
  // defaults, temperature 1 and no cuts).
  bool use_generation_config = true;
  // A request's greedy output does not depend on what else runs in the batch.
  bool batch_invariant = true;
  // The largest image a request may bring, in pixels (width × height as stored in its file).
  int64_t max_image_pixels = int64_t(8192) * 8192;
  // Attention caches: 4 or 8 (quantized, MLX's affine format in groups of kv_group_size), 16 (the
  // activations' type), 0 (as the checkpoint's kv_config.json sets, else 16).
  int kv_bits = 0;
  int kv_group_size = 64;
};

// An image: a file (JPEG, PNG, WebP or GIF), or such a file's bytes in memory.
struct Image {
  std::string path;
  std::string bytes;  // read when path is empty
};

struct Message {
  std::string role;  // system, user, assistant or tool
  std::string content;
  std::string reasoning;  // an assistant's reasoning (templates that show it read it)
  // Images the message shows, before its text (for models with a vision tower).
  std::vector<Image> images;
};

// Unset fields take the model's generation_config.json values, then kiln's defaults.
struct Sampling {
  std::optional<float> temperature;  // 0: greedy; default 1
  std::optional<int> top_k;          // 0: off
  std::optional<float> top_p;        // 1: off
  std::optional<float> min_p;        // 0: off
  std::optional<float> repetition_penalty;
  float presence_penalty = 0, frequency_penalty = 0;
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id, bias in [-100, 100]
  uint64_t seed = 0;                                  // same seed, same output
};

struct Request {
  // The prompt: chat messages (rendered with the model's chat template), else text (tokenized
  // as it is, with the tokenizer's special tokens such as a BOS), else token ids.
  std::vector<Message> messages;
  std::string text;
  std::vector<int32_t> ids;
  // Images of a text or ids prompt, in order: each at a placeholder the text writes (the model's
  // image token, e.g. "<|image|>" for Gemma 4, "<|image_pad|>" for Qwen 3.5, with the frame its
  // chat template would write), or at a run of image tokens the ids hold, as long as its soft
  // tokens (the Hugging Face processor's input_ids).
  std::vector<Image> images;
  // Chat only: the template's enable_thinking (unset: the template's default), and tools as an
  // OpenAI-style JSON array (empty: none), whose calls come back as events' tool_calls.
  std::optional<bool> enable_thinking;
  std::string tools_json;

  Sampling sampling;
  int64_t max_tokens = 0;         // 0, or more than the context holds: until the context is full
  std::vector<std::string> stop;  // the output ends before the first of these (not included)
  // Chat: split the output into answer, reasoning and tool calls in the model's markup. Off, and
  // for text and ids prompts, everything is content.
  bool parse_output = true;
};

enum class Finish {
  none,        // still running
  stop,        // end of sequence or a stop string
  length,      // max_tokens or the context reached
  tool_calls,  // stopped after calling tools
  cancelled,
  error,
};
const char* finish_name(Finish finish);  // "stop", "length", "tool_calls", "cancelled", "error"

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // of the prompt, taken from the prefix cache (not run again)
  int64_t completion_tokens = 0;
  double prompt_seconds = 0;  // from the request's turn to its first token
  double decode_seconds = 0;  // from its first token to its end
};

// What arrived since the previous event. Text is final: it never changes later (text that may
// still turn into a stop string or markup is held back until it cannot).
struct Event {
  std::vector<int32_t> tokens;  // generated token ids (with a tokenizer, the text below is theirs)
  std::string content;          // the answer
  std::string reasoning;        // the model's reasoning, apart from the answer
  std::vector<ToolCall> tool_calls;
  Finish finish = Finish::none;  // set on the last event
  std::string error;             // when finish is error
  Usage usage;                   // complete on the last event
};

// One request's output. Destroying it cancels the request if it still runs.
class Stream {
 public:
  virtual ~Stream() = default;
  // Waits up to `timeout` for more output and puts what arrived into `event` (replacing what it
  // held; an event may be empty when nothing arrived in time). Returns false once the stream has
  // ended, after the event whose finish is set.
  virtual bool next(Event& event, std::chrono::milliseconds timeout = std::chrono::milliseconds(100)) = 0;
  // Stops the request: the next events end with Finish::cancelled (or what came first).
  virtual void cancel() = 0;
};

struct ModelSummary {
  std::string model_dir;
  std::string model_type;  // config.json's
  int64_t vocab_size = 0;
  int64_t max_positions = 0;  // the model's own limit (0: none)
  int64_t context = 0;        // tokens a request holds (0 until the first request, for context 0)
  bool has_tokenizer = false;
  bool has_chat_template = false;
  std::string device;  // the backend, in words
};

class Engine {
 public:
  // Loads a Hugging Face model directory (config.json, safetensors; tokenizer.json and a chat
  // template when present: without them prompts are token ids and output is ids only).
  static Result<std::unique_ptr<Engine>> load(const std::string& model_dir, const LoadOptions& options = {});
  ~Engine();  // cancels what still runs

  // Starts a request. Errors (an empty prompt, one beyond the context, a chat without a template,
  // a token outside the vocabulary) come back at once.
  Result<std::unique_ptr<Stream>> submit(const Request& request);

  // The token ids a request's prompt becomes (the chat template applied), without running it.
  Result<std::vector<int32_t>> prompt_ids(const Request& request) const;
  // The generation_config.json settings a request with `sampling` takes (those it leaves unset),
  // described ("temperature 0.6, top_k 20"); empty when there are none.
  std::string sampling_defaults(const Sampling& sampling) const;

  ModelSummary summary() const;

  // kiln's own clients reach the loaded model through these (src/engine/engine_internal.h).
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
