// Continuous batching: many generations share one model through one step loop.
//
// A Scheduler owns a thread that repeatedly builds one Model::forward batch from
//  - one decode token of every running generation, and
//  - a bounded chunk of the prompts still being prefilled (so that a long prompt arriving never
//    stalls the streams already running),
// samples each generation's next token from its logits row and hands it to the generation's
// stream. Requests that arrive while others run join the batch at the next step. Prompts start
// from the longest cached prefix (PrefixCache, and with a cache directory the PromptStore's files
// on disk); states are snapshotted at block boundaries of each prompt, at its end and when a
// generation finishes.
//
// The scheduler knows tokens only: text, templates and protocols belong to its clients.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "models/model.h"
#include "runtime/decode_loop.h"
#include "runtime/forced_tokens.h"
#include "runtime/prefix_cache.h"
#include "runtime/prompt_images.h"
#include "runtime/prompt_store.h"
#include "runtime/sampler.h"

namespace kiln {

struct SchedulerOptions {
  int64_t max_batch = 16;         // generations running at once; more wait in the queue
  int64_t context = 4096;         // tokens per generation (prompt plus output)
  int64_t prefill_chunk = 256;    // most prompt tokens one step runs, over all generations
  size_t prompt_cache_bytes = 0;  // budget of the prefix cache (0: no cache)
  int64_t cache_block = 256;      // prompts are snapshotted every this many tokens
  // Batch-invariant steps: a generation's tokens do not depend on what else runs. Decode rows go
  // through the model in forward calls of at most invariant_rows sequences (the GPU backend's
  // streaming product kernels compute each row the same way for 1 to 32 rows; larger products
  // may choose other kernels by row count), and each prompt chunk runs in a forward call of its
  // own, at positions fixed by prefill_chunk. Costs more forward calls per step beyond 32 rows.
  // On by default (kiln serve's --no-batch-invariant turns it off).
  bool batch_invariant = true;
  int64_t invariant_rows = 32;
  // The prefix cache's entries kept on disk too, under cache_dir (none when empty; needs the prefix
  // cache), within cache_dir_bytes; fingerprint names what the states depend on (PromptStore).
  std::string cache_dir;
  size_t cache_dir_bytes = size_t(32) << 30;
  std::string fingerprint;
};

struct GenerationParams {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = 0;         // 0: up to the context
  std::vector<int32_t> stop_ids;  // end-of-sequence tokens (not emitted)
  int logprobs = -1;              // -1: none; else each token's log-probability and this many alternatives
  ForcedTokens forced;            // tokens emitted in place of sampled ones (none when empty)
  // With a prefix cache: the state after this many prompt tokens is kept too (a conversation up to
  // the new turn's header, which the next turn's prompt starts with). 0: none.
  int64_t keep_prefix = 0;
  // The prompt's images, laid out for this model (null: none). They are encoded when the generation
  // is admitted, those the prefix cache already holds excepted; the cache keys each image's run by
  // the image's content.
  std::shared_ptr<const ImageLayout> images;
};

enum class FinishReason { running, stop, length, cancelled, error };
const char* finish_reason_name(FinishReason reason);

// One generation's stream of tokens, shared by the scheduler (producer) and a client (consumer).
class Generation {
 public:
  struct Update {
    std::vector<int32_t> tokens;            // new since the previous update
    std::vector<SampledLogprobs> logprobs;  // one per token, when the generation asked for them
    FinishReason finish = FinishReason::running;
    std::string error;  // when finish == error
  };
  // Waits up to `timeout` for new tokens or the end.
  Update wait(std::chrono::milliseconds timeout);
  // Asks the scheduler to stop this generation; its slot is freed at the next step.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  int64_t prompt_tokens() const { return prompt_tokens_; }
  // Prompt tokens taken from the prefix cache (known once the generation was admitted).
  int64_t cached_tokens() const { return cached_tokens_; }
  // Seconds from admission until the prompt was prefilled (0 before that).
  double prompt_seconds() const { return prompt_seconds_; }

 private:
  friend class Scheduler;
  void push(int32_t token, SampledLogprobs* logprobs);
  void finish(FinishReason reason, std::string error = {});

  std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<int32_t> pending_;
  std::vector<SampledLogprobs> pending_logprobs_;
  FinishReason finish_ = FinishReason::running;
  bool finish_delivered_ = false;
  std::string error_;
  std::atomic<bool> cancelled_{false};
  std::atomic<int64_t> prompt_tokens_{0};
  std::atomic<int64_t> cached_tokens_{-1};
  std::atomic<double> prompt_seconds_{0};
};

// Counters for monitoring; a consistent-enough snapshot taken without stopping the loop.
struct SchedulerStats {
  int64_t queued = 0;   // waiting for a slot
  int64_t running = 0;  // in the batch
  int64_t requests_finished = 0;
  int64_t prompt_tokens = 0;     // prompt tokens submitted
  int64_t prefilled_tokens = 0;  // prompt tokens actually run (the rest came from the cache)
  int64_t cached_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t cache_hits = 0;
  int64_t cache_misses = 0;
  size_t cache_bytes = 0;
  int64_t cache_entries = 0;
  int64_t steps = 0;
  int64_t step_rows = 0;    // sum over steps of the sequences in the batch
  int64_t last_batch = 0;   // sequences in the most recent step
  double step_seconds = 0;  // time spent in steps
};

class Scheduler {
 public:
  // Takes the model for its lifetime; allocates max_batch sequence states of `context` tokens.
  static Result<std::unique_ptr<Scheduler>> create(Model& model, const SchedulerOptions& options);
  ~Scheduler();

  // Queues a generation. Errors (an empty prompt, a prompt or max_tokens beyond the context, a
  // token outside the vocabulary, a scheduler shutting down) come back at once.
  Result<std::shared_ptr<Generation>> submit(GenerationParams params);

  // Stops taking requests; with `finish_running` lets the queued and running ones complete,
  // otherwise cancels them. Returns when the loop has ended.
  void shutdown(bool finish_running);

  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return options_; }
  const Model& model() const { return model_; }

 private:
  struct Slot;
  struct Waiting {
    GenerationParams params;
    std::shared_ptr<Generation> generation;
  };
  Scheduler(Model& model, const SchedulerOptions& options);

  // Sequences that run through one Model::forward call.
  struct Group {
    std::vector<SeqChunk> batch;
    std::vector<Slot*> owners;
  };
  void loop();
  void admit();
  Status step();
  // A group's forward call issued on the device, its results not yet read.
  struct Launched {
    const Group* group = nullptr;
    Tensor logits;  // [sequences, vocab] on the device
    Tensor ids;     // the argmax of each row on the device, when every sampling row is greedy
    bool device_argmax = false;
    // When every sampling row is greedy or draws from its top_k (and one is not greedy): each row's
    // best top_k candidates on the device ([sequences, top_k]; greedy rows take the first).
    Tensor top_values, top_ids;
    int top_k = 0;
  };
  Result<Launched> launch(const Group& group);
  // A decode group's step through the recorded step of the same sequences (see replayed_), or
  // false where it does not replay.
  Result<bool> replay(const Group& group, bool greedy, int top_k, Launched& l);
  Status collect(const Launched& launched);
  void finish(Slot& slot, FinishReason reason, const std::string& error = {});
  // Keeps a snapshot of `state`, which holds exactly `tokens`, in the prefix cache and the store.
  void remember(std::span<const int32_t> tokens, const SequenceState& state);

  Model& model_;
  SchedulerOptions options_;
  PrefixCache cache_;
  std::unique_ptr<PromptStore> store_;  // null: no cache directory
  std::vector<std::unique_ptr<Slot>> slots_;

  // The decode step of a few sequences, recorded (a CUDA graph) once the same sequences decoded
  // two steps running, and replayed while they go on: a step then costs one launch instead of one
  // an op, which bounds a lone stream's speed when the host issues ops no faster than the GPU runs
  // them. Slots keep their sequence states for the scheduler's life, so the recording stays valid
  // as requests come and go in them. One at a time: its workspace holds the step's temporaries.
  struct ReplayKey {
    std::vector<SequenceState*> states;
    int top_k = 0;  // 0: greedy choices on the device
    bool operator==(const ReplayKey&) const = default;
  };
  ReplayKey last_decode_;  // the previous step's decode group
  ReplayKey replayed_key_;
  std::unique_ptr<DecodeLoop> replayed_;
  bool replay_failed_ = false;  // a recording failed once: every step is issued op by op

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Waiting> queue_;
  bool stopping_ = false;
  bool drain_ = false;
  std::thread thread_;
  std::once_flag joined_;

  mutable std::mutex stats_mutex_;
  SchedulerStats stats_;
};

}  // namespace kiln
