#include "runtime/scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

namespace kiln {

using Clock = std::chrono::steady_clock;

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::running:
      return "running";
    case FinishReason::stop:
      return "stop";
    case FinishReason::length:
      return "length";
    case FinishReason::cancelled:
      return "cancelled";
    case FinishReason::error:
      return "error";
  }
  return "error";
}

Generation::Update Generation::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  ready_.wait_for(lock, timeout,
                  [&] { return !pending_.empty() || (finish_ != FinishReason::running && !finish_delivered_); });
  Update update;
  update.tokens.swap(pending_);
  update.logprobs.swap(pending_logprobs_);
  if (finish_ != FinishReason::running) {
    update.finish = finish_;
    update.error = error_;
    finish_delivered_ = true;
  }
  return update;
}

void Generation::push(int32_t token, SampledLogprobs* logprobs) {
  {
    std::lock_guard lock(mutex_);
    pending_.push_back(token);
    if (logprobs) pending_logprobs_.push_back(std::move(*logprobs));
  }
  ready_.notify_all();
}

void Generation::finish(FinishReason reason, std::string error) {
  {
    std::lock_guard lock(mutex_);
    if (finish_ != FinishReason::running) return;
    finish_ = reason;
    error_ = std::move(error);
  }
  ready_.notify_all();
}

// A running generation and the sequence state it owns while it runs.
struct Scheduler::Slot {
  std::unique_ptr<SequenceState> state;
  std::shared_ptr<Generation> generation;  // null: free
  GenerationParams params;
  std::unique_ptr<Sampler> sampler;
  std::vector<int32_t> history;  // prompt, then generated tokens (penalties look at all)
  std::vector<int32_t> key;      // the prompt as the prefix cache knows it (image runs by content)
  PromptImages images;           // the prompt's encoded images, until it is prefilled
  ChunkInputs chunk;             // what this step's prompt chunk carries (its images, positions)
  int64_t prefilled = 0;         // prompt tokens in the state
  int64_t generated = 0;
  int32_t next = 0;  // the token the next decode step feeds
  ForcedContinuation forcing;
  Clock::time_point admitted;
  bool prefilling() const { return prefilled < int64_t(params.prompt.size()); }
};

Scheduler::Scheduler(Model& model, const SchedulerOptions& options)
    : model_(model), options_(options), cache_(options.prompt_cache_bytes) {}

Result<std::unique_ptr<Scheduler>> Scheduler::create(Model& model, const SchedulerOptions& options) {
  if (options.max_batch < 1) return make_error("max_batch must be at least 1");
  if (options.context < 2) return make_error("the context must hold at least 2 tokens");
  std::unique_ptr<Scheduler> s(new Scheduler(model, options));
  const int64_t limit = model.info().max_position_embeddings;
  if (limit > 0 && s->options_.context > limit) s->options_.context = limit;
  s->options_.prefill_chunk = std::clamp<int64_t>(options.prefill_chunk, 1, model.max_chunk_tokens());
  s->options_.cache_block = std::max<int64_t>(options.cache_block, 1);
  s->options_.invariant_rows = std::max<int64_t>(options.invariant_rows, 1);
  if (!options.cache_dir.empty()) {
    // the store keeps what the prefix cache snapshots (a prompt's blocks, its end)
    if (options.prompt_cache_bytes == 0)
      return make_error("a cache directory needs the prefix cache, whose budget (prompt_cache_bytes) is 0");
    KILN_ASSIGN(s->store_, PromptStore::open(PromptStoreOptions{
                               .dir = options.cache_dir,
                               .fingerprint = options.fingerprint,
                               .budget_bytes = options.cache_dir_bytes,
                           }));
  }
  for (int64_t i = 0; i < options.max_batch; ++i) {
    auto slot = std::make_unique<Slot>();
    KILN_ASSIGN(slot->state, model.new_sequence(s->options_.context));
    s->slots_.push_back(std::move(slot));
  }
  KILN_TRY(model.backend().status());
  s->thread_ = std::thread([p = s.get()] { p->loop(); });
  return s;
}

Scheduler::~Scheduler() {
  shutdown(false);
}

Result<std::shared_ptr<Generation>> Scheduler::submit(GenerationParams params) {
  const int64_t n = int64_t(params.prompt.size());
  if (n == 0) return make_error("the prompt is empty");
  if (n >= options_.context)
    return make_error("the prompt has {} tokens; the context holds {} (prompt and output)", n, options_.context);
  if (params.max_tokens <= 0) params.max_tokens = options_.context - n;
  if (n + params.max_tokens > options_.context)
    return make_error("the prompt ({} tokens) plus max_tokens ({}) exceed the context of {} tokens", n,
                      params.max_tokens, options_.context);
  const int64_t vocab = model_.info().vocab_size;
  for (const std::vector<int32_t>* ids : {&params.prompt, &params.forced.after, &params.forced.tokens,
                                          &params.forced.at_once, &params.forced.reasoning_close})
    for (int32_t id : *ids)
      if (id < 0 || id >= vocab) return make_error("token id {} is outside the vocabulary [0, {})", id, vocab);
  for (int32_t opener : {params.forced.opener, params.forced.reasoning_opener})
    if (opener >= vocab) return make_error("token id {} is outside the vocabulary [0, {})", opener, vocab);
  if (const ImageLayout* images = params.images.get()) {
    if (images->prompt_tokens != n || images->offsets.size() != images->images.size() ||
        images->hashes.size() != images->images.size() || images->positions.size() != size_t(images->rope_axes * n))
      return make_error("the prompt's images were laid out for another prompt");
    for (size_t i = 0; i < images->images.size(); ++i) {
      const int64_t tokens = images->images[i].soft_tokens;
      const int64_t previous_end = i == 0 ? 0 : images->offsets[i - 1] + images->images[i - 1].soft_tokens;
      if (images->offsets[i] < previous_end || images->offsets[i] + tokens > n)
        return make_error("image {} lies outside the prompt or overlaps the one before", i + 1);
      // attended bidirectionally, an image runs in one forward call
      if (images->whole && tokens > model_.max_chunk_tokens())
        return make_error("image {} fills {} tokens; one forward call of this model takes at most {}", i + 1, tokens,
                          model_.max_chunk_tokens());
    }
  }
  auto generation = std::make_shared<Generation>();
  generation->prompt_tokens_ = n;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return make_error("the server is shutting down");
    queue_.push_back(Waiting{.params = std::move(params), .generation = generation});
  }
  {
    std::lock_guard lock(stats_mutex_);
    stats_.prompt_tokens += n;
  }
  wake_.notify_all();
  return generation;
}

void Scheduler::shutdown(bool finish_running) {
  {
    std::lock_guard lock(mutex_);
    // a later call may turn finishing into cancelling, never the reverse
    drain_ = stopping_ ? drain_ && finish_running : finish_running;
    stopping_ = true;
  }
  wake_.notify_all();
  std::call_once(joined_, [&] {
    if (thread_.joinable()) thread_.join();
  });
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(stats_mutex_);
  SchedulerStats s = stats_;
  {
    std::lock_guard queue_lock(mutex_);
    // requests whose clients have gone wait only to be dropped at the next admission
    s.queued = std::count_if(queue_.begin(), queue_.end(), [](const Waiting& w) { return !w.generation->cancelled(); });
  }
  return s;
}

void Scheduler::finish(Slot& slot, FinishReason reason, const std::string& error) {
  if (reason == FinishReason::stop || reason == FinishReason::length) {
    // the state holds the prompt and every generated token but the last: a client that sends the
    // conversation back continues from here
    const int64_t held = slot.state->length();
    if (held >= int64_t(slot.key.size()) && held <= int64_t(slot.history.size())) {
      std::vector<int32_t> key = slot.key;
      key.insert(key.end(), slot.history.begin() + int64_t(slot.key.size()), slot.history.begin() + held);
      remember(key, *slot.state);
    }
  }
  slot.generation->finish(reason, error);
  slot.generation.reset();
  slot.sampler.reset();
  slot.images = {};
  slot.chunk = {};
  slot.params.images.reset();
  std::lock_guard lock(stats_mutex_);
  ++stats_.requests_finished;
}

void Scheduler::remember(std::span<const int32_t> tokens, const SequenceState& state) {
  cache_.insert(tokens, state, model_.backend());
  if (store_) store_->save(tokens, state, model_.backend());
}

void Scheduler::admit() {
  {
    // requests cancelled while queued leave now, not when a slot frees
    std::lock_guard lock(mutex_);
    std::erase_if(queue_, [](const Waiting& w) {
      if (!w.generation->cancelled()) return false;
      w.generation->finish(FinishReason::cancelled);
      return true;
    });
  }
  for (auto& slot : slots_) {
    if (slot->generation) continue;
    Waiting next;
    {
      std::lock_guard lock(mutex_);
      if (queue_.empty()) return;
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    if (next.generation->cancelled()) {
      next.generation->finish(FinishReason::cancelled);
      continue;
    }
    Slot& s = *slot;
    s.generation = std::move(next.generation);
    s.params = std::move(next.params);
    s.sampler = std::make_unique<Sampler>(s.params.sampling);
    s.forcing = ForcedContinuation(s.params.forced, s.params.stop_ids);
    s.history = s.params.prompt;
    s.generated = 0;
    s.admitted = Clock::now();
    const ImageLayout* images = s.params.images.get();
    s.key = images ? image_cache_key(s.params.prompt, *images) : s.params.prompt;
    // a prompt resumes only between images: never inside one that runs whole (the cache's entries
    // never split one), nor a few key values into any other
    const auto usable = [&](int64_t tokens) {
      if (!images) return true;
      for (size_t i = 0; i < images->images.size(); ++i)
        if (images->offsets[i] < tokens && tokens < images->offsets[i] + images->images[i].soft_tokens) return false;
      return true;
    };
    const PrefixCache::Hit hit = cache_.lookup(s.key, usable);
    // a longer prefix on disk (kept by an earlier run) is loaded into the slot, and kept in memory
    // too; an entry that fails to load is dropped from the store's index, and the next is tried
    int64_t cached = 0;
    if (store_) {
      while (auto entry = store_->find(s.key, usable, hit.tokens)) {
        if (!store_->load(*entry, *s.state, model_.backend())) continue;
        cached = entry->tokens;
        cache_.insert(std::span<const int32_t>(s.key).first(size_t(cached)), *s.state, model_.backend());
        break;
      }
    }
    if (cached == 0 && hit.tokens > 0) {
      s.state->restore(model_.backend(), *hit.state);
      cached = hit.tokens;
    } else if (cached == 0) {
      s.state->reset(model_.backend());
    }
    s.prefilled = cached;
    // the images are encoded as the prompt's chunks reach them (step), so that a prompt with many
    // images does not hold up the running streams all at once
    s.images = images ? images_to_encode(*images) : PromptImages{};
    s.generation->cached_tokens_ = cached;
    std::lock_guard lock(stats_mutex_);
    stats_.cached_tokens += cached;
    ++(cached > 0 ? stats_.cache_hits : stats_.cache_misses);
  }
}

Status Scheduler::step() {
  // decode rows first, then prompt chunks within the step's prefill budget; a chunk ends at the
  // next cache block boundary so the state there can be snapshotted
  std::vector<Group> groups(1);
  const bool invariant = options_.batch_invariant;
  for (auto& slot : slots_) {
    if (!slot->generation || slot->prefilling()) continue;
    if (invariant && int64_t(groups.back().batch.size()) >= options_.invariant_rows) groups.emplace_back();
    groups.back().batch.push_back(
        SeqChunk{.state = slot->state.get(), .tokens = std::span<const int32_t>(&slot->next, 1)});
    groups.back().owners.push_back(slot.get());
  }
  int64_t budget = options_.prefill_chunk;
  for (auto& slot : slots_) {
    if (!slot->generation || !slot->prefilling() || budget <= 0) continue;
    const int64_t remaining = int64_t(slot->params.prompt.size()) - slot->prefilled;
    // batch-invariant: whole chunks at fixed positions, each in a forward of its own, so a prompt
    // is computed the same way whatever else runs
    int64_t n = invariant ? std::min(remaining, options_.prefill_chunk - slot->prefilled % options_.prefill_chunk)
                          : std::min(remaining, budget);
    if (cache_.budget_bytes() > 0) {
      n = std::min(n, options_.cache_block - slot->prefilled % options_.cache_block);
      if (const int64_t keep = slot->params.keep_prefix; keep > slot->prefilled)
        n = std::min(n, keep - slot->prefilled);
    }
    if (!slot->images.empty()) {
      // an image that runs whole is not split: the chunk ends before it, or takes all of it when it
      // starts here (beyond the step's budget if need be; submit checked it fits a forward call)
      const int64_t begin = slot->prefilled;
      if (slot->images.whole)
        for (const auto& image : slot->images.images) {
          const int64_t end = image.offset + image.tokens;
          if (image.offset >= begin + n || end <= begin + n || end <= begin) continue;
          n = image.offset > begin ? image.offset - begin : end - begin;
          break;
        }
      // the images this chunk reaches are encoded now
      if (Status encoded = encode_range(model_, *slot->params.images, slot->images, begin, begin + n); !encoded) {
        spdlog::warn("a request's image could not be encoded: {}", encoded.error().message);
        finish(*slot, FinishReason::error, encoded.error().message);
        continue;
      }
      slot->chunk = chunk_inputs(slot->images, begin, begin + n);
    } else {
      slot->chunk = {};
    }
    if (invariant && !groups.back().batch.empty()) groups.emplace_back();
    groups.back().batch.push_back(
        SeqChunk{.state = slot->state.get(),
                 .tokens = std::span(slot->params.prompt).subspan(size_t(slot->prefilled), size_t(n)),
                 .soft = slot->chunk.soft,
                 .positions = slot->chunk.positions});
    groups.back().owners.push_back(slot.get());
    budget -= n;
  }
  const auto t0 = Clock::now();
  int64_t rows = 0;
  // every group's forward is issued before any result is read back, so the device runs them
  // back to back
  std::vector<Launched> launched;
  for (const Group& g : groups) {
    if (g.batch.empty()) continue;
    KILN_ASSIGN(Launched l, launch(g));
    launched.push_back(std::move(l));
    rows += int64_t(g.batch.size());
  }
  for (const Launched& l : launched) KILN_TRY(collect(l));
  std::lock_guard lock(stats_mutex_);
  ++stats_.steps;
  stats_.step_rows += rows;
  stats_.last_batch = rows;
  stats_.step_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  return ok_status();
}

Result<Scheduler::Launched> Scheduler::launch(const Group& group) {
  Launched l{.group = &group};
  // when every row that samples is plain greedy, the argmax runs on the device and only the ids
  // come back (a row of logits is vocab floats; a batch of them costs more to move than to reduce)
  // Rows drawing from their top_k candidates (most sampled requests, with a model's default top_k)
  // take them from the device the same way: k values and ids a row instead of the vocabulary.
  Backend& backend = model_.backend();
  const int64_t vocab = model_.info().vocab_size, rows = int64_t(group.batch.size());
  const bool candidates_pay = backend.device() != Device::cpu;  // on the CPU the logits are at hand
  bool all_greedy = true, all_from_top_k = candidates_pay;
  int top_k = 1;
  for (size_t i = 0; i < group.owners.size(); ++i) {
    const Slot& s = *group.owners[i];
    const bool samples = s.prefilled + int64_t(group.batch[i].tokens.size()) >= int64_t(s.params.prompt.size());
    if (!samples) continue;
    const SamplingParams& p = s.params.sampling;
    const bool greedy = plain_greedy(p) && s.params.logprobs < 0;
    all_greedy = all_greedy && greedy;
    if (greedy) continue;
    if (s.params.logprobs >= 0 || !draws_from_top_k(p, vocab)) all_from_top_k = false;
    top_k = std::max(top_k, p.top_k);
  }
  if (candidates_pay && (all_greedy || all_from_top_k)) {
    KILN_ASSIGN(const bool replayed, replay(group, all_greedy, top_k, l));
    if (replayed) return l;
  }
  KILN_ASSIGN(l.logits, model_.forward(group.batch, LogitRows::last));
  if (all_greedy) {
    l.device_argmax = true;
    l.ids = backend.alloc(DType::i32, Shape{rows});
    backend.argmax(l.logits, l.ids);
  } else if (all_from_top_k) {
    Tensor temperatures = host_tensor(DType::f32, Shape{rows});
    for (size_t i = 0; i < group.owners.size(); ++i) {
      const float t = group.owners[i]->params.sampling.temperature;
      temperatures.data_as<float>()[i] = t > 0.0f ? t : 1.0f;  // greedy rows: the first candidate
    }
    l.top_k = top_k;
    l.top_values = backend.alloc(DType::f32, Shape{rows, top_k});
    l.top_ids = backend.alloc(DType::i32, Shape{rows, top_k});
    backend.top_k(l.logits, backend.upload(temperatures, DType::f32), top_k, l.top_values, l.top_ids);
  }
  return l;
}

Result<bool> Scheduler::replay(const Group& group, bool greedy, int top_k, Launched& l) {
  // decode rows only (a prompt chunk runs op by op), and few: at more rows the GPU's step is long
  // enough that issuing it op by op costs nothing, and the workspace grows with the rows
  constexpr size_t kMostRows = 4;
  ReplayKey key{.top_k = greedy ? 0 : top_k};
  for (size_t i = 0; i < group.owners.size(); ++i) {
    if (group.owners[i]->prefilling() || group.batch[i].tokens.size() != 1) return false;
    key.states.push_back(group.batch[i].state);
  }
  const ReplayKey previous = std::exchange(last_decode_, key);
  if (replay_failed_ || key.states.size() > kMostRows) return false;
  std::vector<int32_t> tokens;
  std::vector<float> temperatures;
  for (const Slot* s : group.owners) {
    tokens.push_back(s->next);
    const float t = s->params.sampling.temperature;
    temperatures.push_back(greedy ? 1.0f : t > 0.0f ? t : 1.0f);  // greedy rows: the first candidate
  }
  if (!replayed_ || replayed_key_ != key) {
    if (previous != key) return false;  // record only what ran at least twice in a row
    replayed_.reset();                  // its workspace first
    auto loop = DecodeLoop::create(model_, key.states, tokens, key.top_k, temperatures);
    if (!loop.ok()) {
      spdlog::warn("decode steps are issued op by op: recording one failed: {}", loop.error().message);
      replay_failed_ = true;
      return false;
    }
    replayed_ = std::move(loop).value();
    replayed_key_ = key;
  } else {
    replayed_->set_tokens(tokens);
    if (key.top_k > 0) replayed_->set_temperatures(temperatures);
  }
  KILN_TRY(replayed_->step());
  if (key.top_k == 0) {
    l.device_argmax = true;
    l.ids = replayed_->ids();
  } else {
    l.top_k = key.top_k;
    l.top_values = replayed_->top_values();
    l.top_ids = replayed_->top_ids();
  }
  return true;
}

Status Scheduler::collect(const Launched& launched) {
  const auto& batch = launched.group->batch;
  const auto& owners = launched.group->owners;
  const bool device_argmax = launched.device_argmax, from_top_k = launched.top_k > 0;
  const Tensor ids = device_argmax ? model_.backend().to_host(launched.ids) : Tensor();
  const Tensor top_values = from_top_k ? model_.backend().to_host(launched.top_values) : Tensor();
  const Tensor top_ids = from_top_k ? model_.backend().to_host(launched.top_ids) : Tensor();
  const Tensor logits = device_argmax || from_top_k ? Tensor() : model_.backend().to_host(launched.logits);
  KILN_TRY(model_.backend().status());
  const int64_t vocab = model_.info().vocab_size;
  int64_t generated = 0, prefilled = 0;
  for (size_t i = 0; i < owners.size(); ++i) {
    Slot& s = *owners[i];
    if (s.prefilling()) {
      s.prefilled += int64_t(batch[i].tokens.size());
      prefilled += int64_t(batch[i].tokens.size());
      const auto prompt = std::span<const int32_t>(s.key).first(size_t(s.prefilled));
      const bool boundary = s.prefilled % options_.cache_block == 0 || s.prefilled == s.params.keep_prefix;
      if (s.prefilling()) {
        if (boundary) remember(prompt, *s.state);
        continue;
      }
      remember(prompt, *s.state);
      s.images = {};  // the encodings' device memory goes back, and the pixels
      s.chunk = {};
      s.params.images.reset();
      s.generation->prompt_seconds_ = std::chrono::duration<double>(Clock::now() - s.admitted).count();
    }
    if (s.generation->cancelled()) continue;  // freed at the next step
    int32_t token = 0;
    std::optional<SampledLogprobs> logprobs;
    if (device_argmax) {
      token = s.forcing.choose(ids.data_as<int32_t>()[i]);
    } else if (from_top_k) {
      const int k = launched.top_k;
      const int32_t* row_ids = top_ids.data_as<int32_t>() + int64_t(i) * k;
      const float* row_values = top_values.data_as<float>() + int64_t(i) * k;
      const SamplingParams& p = s.params.sampling;  // its own top_k: the first of the batch's largest
      token = s.forcing.choose(
          p.temperature <= 0.0f ? row_ids[0]
                                : s.sampler->sample_top_k(std::span<const float>(row_values, size_t(p.top_k)),
                                                          std::span<const int32_t>(row_ids, size_t(p.top_k)), vocab));
    } else {
      const std::span<const float> row(logits.data_as<float>() + int64_t(i) * vocab, size_t(vocab));
      token = s.forcing.choose(s.sampler->sample(row, s.history));
      if (s.params.logprobs >= 0) logprobs = logprobs_of(row, token, s.params.logprobs);
    }
    const auto& stops = s.params.stop_ids;
    if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
      finish(s, FinishReason::stop);
      continue;
    }
    ++generated;
    ++s.generated;
    s.history.push_back(token);
    s.next = token;
    s.generation->push(token, logprobs ? &*logprobs : nullptr);
    if (s.generated >= s.params.max_tokens || s.state->length() + 1 >= s.state->max_context()) {
      finish(s, FinishReason::length);
    }
  }
  std::lock_guard lock(stats_mutex_);
  stats_.generated_tokens += generated;
  stats_.prefilled_tokens += prefilled;
  return ok_status();
}

void Scheduler::loop() {
  for (;;) {
    bool stopping, drain;
    {
      std::lock_guard lock(mutex_);
      stopping = stopping_;
      drain = drain_;
    }
    if (stopping && !drain) {
      for (auto& slot : slots_)
        if (slot->generation) finish(*slot, FinishReason::cancelled);
      std::lock_guard lock(mutex_);
      for (auto& w : queue_) w.generation->finish(FinishReason::cancelled);
      queue_.clear();
      return;
    }
    for (auto& slot : slots_)
      if (slot->generation && slot->generation->cancelled()) finish(*slot, FinishReason::cancelled);
    admit();
    int64_t running = 0;
    for (auto& slot : slots_) running += slot->generation != nullptr;
    {
      std::lock_guard lock(stats_mutex_);
      stats_.running = running;
      stats_.cache_bytes = cache_.bytes();
      stats_.cache_entries = int64_t(cache_.entries());
    }
    if (running == 0) {
      std::unique_lock lock(mutex_);
      if (stopping_ && queue_.empty()) return;
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      continue;
    }
    Status status = step();
    if (!status) {
      // a failed forward leaves the batch's states undefined: fail every running generation
      spdlog::error("batch step failed: {}", status.error().message);
      for (auto& slot : slots_)
        if (slot->generation) finish(*slot, FinishReason::error, status.error().message);
    }
  }
}

}  // namespace kiln
