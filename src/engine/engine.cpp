// The engine API (include/kiln/engine.h): requests become token ids (chat template, tokenizer),
// go through the scheduler, and come back through TextGeneration (detokenizing, stop strings,
// output parsing) as events.
#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_internal.h"
#include "engine/json_text.h"
#include "engine/text_generation.h"
#include "runtime/prompt_store.h"
#ifdef KILN_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;

Result<std::unique_ptr<Backend>> open_backend(const LoadOptions& options) {
  if (!options.device.empty() && options.device != "cpu" && options.device != "cuda")
    return make_error("unknown device '{}' (cpu or cuda)", options.device);
#ifdef KILN_HAS_CUDA
  if (options.device == "cuda" || (options.device.empty() && cuda_device_present())) return make_cuda_backend(0);
#else
  if (options.device == "cuda") return make_error("this kiln was built without CUDA; use the cpu device");
#endif
  return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(options.threads));
}

Finish finish_of(const std::string& reason) {
  if (reason == "stop") return Finish::stop;
  if (reason == "length") return Finish::length;
  if (reason == "tool_calls") return Finish::tool_calls;
  if (reason == "cancelled") return Finish::cancelled;
  return Finish::error;
}

// A request's output, read from its TextGeneration.
class TextStream final : public Stream {
 public:
  explicit TextStream(std::unique_ptr<engine::TextGeneration> text) : text_(std::move(text)), start_(Clock::now()) {}

  bool next(Event& event, std::chrono::milliseconds timeout) override {
    event = Event{};
    if (ended_) return false;
    engine::OutputDelta delta;
    ended_ = !text_->next(delta, event.tokens, timeout);
    event.content = std::move(delta.content);
    event.reasoning = std::move(delta.reasoning);
    for (auto& call : delta.tool_calls)
      event.tool_calls.push_back(ToolCall{.name = std::move(call.name), .arguments = std::move(call.arguments)});
    if (!ended_) return true;
    event.finish = finish_of(text_->finish_reason());
    event.error = text_->error();
    const Generation& g = text_->generation();
    const double total = std::chrono::duration<double>(Clock::now() - start_).count();
    event.usage = Usage{.prompt_tokens = g.prompt_tokens(),
                        .cached_tokens = std::max<int64_t>(g.cached_tokens(), 0),
                        .completion_tokens = text_->completion_tokens(),
                        .prompt_seconds = g.prompt_seconds(),
                        .decode_seconds = std::max(total - g.prompt_seconds(), 0.0)};
    return true;
  }

  void cancel() override { text_->cancel(); }

 private:
  std::unique_ptr<engine::TextGeneration> text_;  // cancels the generation when it goes
  Clock::time_point start_;
  bool ended_ = false;
};

// A request's prompt as ids, with what the output is read as and how much of it to keep cached.
struct PreparedPrompt {
  std::vector<int32_t> ids;
  engine::OutputFormat format;  // plain text unless a chat is parsed
  int64_t keep_prefix = 0;
  std::shared_ptr<const ImageLayout> images;
};

Result<std::vector<ProcessedImage>> read_images(const Engine::Impl& e, const std::vector<Image>& images,
                                                size_t& count) {
  std::vector<ProcessedImage> out;
  for (const Image& image : images) {
    KILN_ASSIGN(ProcessedImage p, engine::read_image_input(e, image, fmt::format("image {}", ++count)));
    out.push_back(std::move(p));
  }
  return out;
}

Result<PreparedPrompt> prepare(const Engine::Impl& e, const Request& r) {
  PreparedPrompt out;
  std::vector<ProcessedImage> images;
  size_t count = 0;
  if (!r.messages.empty()) {
    if (!e.tokenizer) return make_error("{} has no tokenizer: the prompt must be token ids", e.model_dir);
    if (!e.chat_template) return make_error("{} has no chat template ({})", e.model_dir, e.chat_template_error);
    if (!r.images.empty()) return make_error("a chat's images belong to its messages (Message::images)");
    ChatRequest chat;
    for (const Message& m : r.messages) {
      nlohmann::ordered_json message = {{"role", m.role}, {"content", m.content}};
      if (!m.images.empty()) {
        // content parts, as transformers' processors hand a chat template an image
        KILN_ASSIGN(auto read, read_images(e, m.images, count));
        nlohmann::ordered_json parts = nlohmann::ordered_json::array();
        for (size_t i = 0; i < read.size(); ++i) parts.push_back({{"type", "image"}});
        if (!m.content.empty()) parts.push_back({{"type", "text"}, {"text", m.content}});
        message["content"] = std::move(parts);
        for (auto& p : read) images.push_back(std::move(p));
      }
      if (!m.reasoning.empty()) message["reasoning_content"] = m.reasoning;
      chat.messages.push_back(std::move(message));
    }
    if (r.enable_thinking) chat.extra_variables["enable_thinking"] = *r.enable_thinking;
    nlohmann::json tools;
    if (!r.tools_json.empty()) {
      if (engine::nesting_depth(r.tools_json) > engine::kMaxNesting)
        return make_error("the tools nest deeper than {} levels", engine::kMaxNesting);
      tools = nlohmann::json::parse(r.tools_json, nullptr, false);
      if (tools.is_discarded() || !tools.is_array()) return make_error("the tools are not a JSON array");
      if (!tools.empty()) chat.tools = nlohmann::ordered_json(tools);
    }
    KILN_ASSIGN(std::string text, e.chat_template->render(chat));
    if (!images.empty()) {
      auto expanded = e.images->expand(text, images);
      if (!expanded.ok()) return make_error("the chat template's rendering: {}", expanded.error().message);
      text = std::move(expanded).value();
    }
    KILN_ASSIGN(out.ids, e.tokenizer->encode(text, /*add_special_tokens=*/false));  // the template writes them
    if (r.parse_output) out.format = engine::chat_output_format(e.format, text, chat.tools ? &tools : nullptr);
    // the conversation without the new turn's header: the next turn's prompt starts with it
    chat.add_generation_prompt = false;
    auto settled = e.chat_template->render(chat);
    if (settled.ok() && !images.empty()) settled = e.images->expand(*settled, images);
    if (settled.ok()) {
      auto settled_ids = e.tokenizer->encode(*settled, false);
      if (settled_ids.ok() && settled_ids->size() < out.ids.size() &&
          std::equal(settled_ids->begin(), settled_ids->end(), out.ids.begin()))
        out.keep_prefix = int64_t(settled_ids->size());
    }
  } else if (!r.text.empty()) {
    if (!e.tokenizer) return make_error("{} has no tokenizer: the prompt must be token ids", e.model_dir);
    KILN_ASSIGN(images, read_images(e, r.images, count));
    std::string text = r.text;
    if (!images.empty()) {
      KILN_ASSIGN(text, e.images->expand(text, images));
    }
    KILN_ASSIGN(out.ids, e.tokenizer->encode(text, /*add_special_tokens=*/true));
  } else {
    out.ids = r.ids;
    KILN_ASSIGN(images, read_images(e, r.images, count));
  }
  if (out.ids.empty()) return make_error("the prompt is empty");
  if (!images.empty()) {
    KILN_ASSIGN(ImageLayout layout, e.images->lay_out(out.ids, std::move(images)));
    out.images = std::make_shared<const ImageLayout>(std::move(layout));
  }
  return out;
}

}  // namespace

const char* finish_name(Finish finish) {
  switch (finish) {
    case Finish::none:
      return "running";
    case Finish::stop:
      return "stop";
    case Finish::length:
      return "length";
    case Finish::tool_calls:
      return "tool_calls";
    case Finish::cancelled:
      return "cancelled";
    case Finish::error:
      return "error";
  }
  return "error";
}

std::string engine::no_images_reason(const Engine::Impl& e) {
  if (e.images_error.empty()) return "this model takes no images";
  if (e.images_error.find("takes no images") != std::string::npos) return e.images_error;
  return "this model takes no images: " + e.images_error;
}

Result<ProcessedImage> engine::read_image_input(const Engine::Impl& e, const Image& image, const std::string& name) {
  if (!e.images) return make_error("{}", no_images_reason(e));
  if (!image.path.empty()) return e.images->read_file(image.path);
  const auto* bytes = reinterpret_cast<const uint8_t*>(image.bytes.data());
  return e.images->read(std::span<const uint8_t>(bytes, image.bytes.size()), name);
}

SamplingParams engine::sampling_params(const Sampling& s, const SamplingDefaults& defaults) {
  SamplingParams p;
  defaults.apply(p);
  if (s.temperature) p.temperature = *s.temperature;
  if (s.top_k) p.top_k = *s.top_k;
  if (s.top_p) p.top_p = *s.top_p;
  if (s.min_p) p.min_p = *s.min_p;
  if (s.repetition_penalty) p.repetition_penalty = *s.repetition_penalty;
  p.presence_penalty = s.presence_penalty;
  p.frequency_penalty = s.frequency_penalty;
  p.logit_bias = s.logit_bias;
  p.seed = s.seed;
  return p;
}

Result<Scheduler*> Engine::Impl::scheduler_for(int64_t tokens_needed) {
  std::lock_guard lock(mutex);
  if (scheduler) return scheduler.get();
  SchedulerOptions s{.max_batch = options.max_batch,
                     .context = options.context > 0 ? options.context : tokens_needed,
                     .prefill_chunk = options.prefill_chunk,
                     .prompt_cache_bytes = options.prompt_cache_bytes,
                     .batch_invariant = options.batch_invariant,
                     .cache_dir = options.cache_dir,
                     .cache_dir_bytes = options.cache_dir_bytes,
                     .fingerprint = fingerprint};
  const int64_t limit = model->info().max_position_embeddings;
  if (limit > 0) s.context = std::min(s.context, limit);
  s.context = std::max<int64_t>(s.context, 2);
  if (options.prompt_cache_snapshots > 0) {
    // a snapshot is a whole sequence state at the full context
    KILN_ASSIGN(auto probe, model->new_sequence(s.context));
    s.prompt_cache_bytes = std::max(s.prompt_cache_bytes, size_t(options.prompt_cache_snapshots) * probe->bytes());
  }
  KILN_ASSIGN(scheduler, Scheduler::create(*model, s));
  return scheduler.get();
}

Result<std::unique_ptr<Engine>> engine::load_engine(const std::string& model_dir, const LoadOptions& options,
                                                    std::unique_ptr<Backend> backend) {
  auto impl = std::make_unique<Engine::Impl>();
  impl->model_dir = model_dir;
  impl->options = options;
  impl->backend = std::move(backend);
  if (auto tokenizer = Tokenizer::load(model_dir); tokenizer.ok()) {
    impl->tokenizer = std::move(tokenizer).value();
    if (auto tmpl = ChatTemplate::load(model_dir); tmpl.ok())
      impl->chat_template = std::move(tmpl).value();
    else
      impl->chat_template_error = tmpl.error().message;
  } else {
    impl->tokenizer_error = tokenizer.error().message;
    impl->chat_template_error = "no tokenizer";
  }
  if (options.use_generation_config) {
    KILN_ASSIGN(impl->defaults, load_sampling_defaults(model_dir));
  }
  // a forward call takes a prefill chunk, and at least the default (an image that runs whole may be
  // longer than the chunk: --prefill-chunk raises both)
  ModelOptions model_options;
  model_options.max_chunk_tokens = std::max<int64_t>(model_options.max_chunk_tokens, options.prefill_chunk);
  if (options.kv_bits != 0 && options.kv_bits != 4 && options.kv_bits != 8 && options.kv_bits != 16)
    return make_error("kv_bits {} is not one of 4, 8 or 16", options.kv_bits);
  if (options.kv_bits)
    model_options.kv_quant =
        KvQuant{.bits = options.kv_bits == 16 ? 0 : options.kv_bits, .group_size = options.kv_group_size};
  KILN_ASSIGN(impl->model, load_model(model_dir, *impl->backend, model_options));
  if (!options.cache_dir.empty()) {
    // files of another checkpoint, device, activation type or cache format are never read (the
    // device's kind, not its name: a thread count or a GPU's index does not change a state)
    KILN_ASSIGN(const std::string weights, model_fingerprint(model_dir));
    const Backend& b = *impl->backend;
    impl->fingerprint = fmt::format("{} on {} with {} activations, kv_bits {} in groups of {}", weights,
                                    b.device() == Device::cuda ? "cuda" : "cpu", dtype_name(b.activation_dtype()),
                                    options.kv_bits, options.kv_group_size);
  }
  // the image front end: a model without a vision tower has none; a broken processor config is
  // reported to the requests that bring images, not to every request
  if (auto config = read_model_config_file(model_dir + "/config.json"); config.ok()) {
    if (auto family = family_of(*config); family.ok()) {
      ImageLimits limits;
      limits.max_pixels = options.max_image_pixels;
      auto input = ImageInput::load(model_dir, *config, **family, impl->model->batch_needs(), limits);
      if (input.ok())
        impl->images = std::move(input).value();
      else
        impl->images_error = input.error().message;
    }
  }
  impl->format = output_format(impl->model->info().family, impl->tokenizer.get(),
                               impl->chat_template ? &*impl->chat_template : nullptr);
  if (options.context > 0) KILN_TRY(impl->scheduler_for(options.context));
  return std::make_unique<Engine>(std::move(impl));
}

Result<std::unique_ptr<Engine>> Engine::load(const std::string& model_dir, const LoadOptions& options) {
  KILN_ASSIGN(auto backend, open_backend(options));
  return engine::load_engine(model_dir, options, std::move(backend));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  // the scheduler goes first: its thread uses the model, which uses the backend
  if (impl_) impl_->scheduler.reset();
}

Result<std::vector<int32_t>> Engine::prompt_ids(const Request& request) const {
  KILN_ASSIGN(PreparedPrompt prompt, prepare(*impl_, request));
  return std::move(prompt.ids);
}

std::string Engine::sampling_defaults(const Sampling& s) const {
  SamplingDefaults d = impl_->defaults;
  if (s.temperature) d.temperature.reset();
  if (s.top_k) d.top_k.reset();
  if (s.top_p) d.top_p.reset();
  if (s.min_p) d.min_p.reset();
  if (s.repetition_penalty) d.repetition_penalty.reset();
  return d.empty() ? std::string() : d.describe();
}

ModelSummary Engine::summary() const {
  const ModelInfo& info = impl_->model->info();
  std::lock_guard lock(impl_->mutex);
  return ModelSummary{.model_dir = impl_->model_dir,
                      .model_type = info.model_type,
                      .vocab_size = info.vocab_size,
                      .max_positions = info.max_position_embeddings,
                      .context = impl_->scheduler ? impl_->scheduler->options().context : 0,
                      .has_tokenizer = impl_->tokenizer != nullptr,
                      .has_chat_template = impl_->chat_template.has_value(),
                      .device = impl_->backend->name()};
}

std::variant<std::unique_ptr<engine::TextGeneration>, engine::StartError> engine::start_generation(
    Scheduler& scheduler, std::shared_ptr<const Tokenizer> tokenizer, GenerationStart start) {
  auto fail = [](StartFault fault, std::string message) { return StartError{fault, std::move(message)}; };
  const int64_t n = int64_t(start.ids.size());
  const int64_t context = scheduler.options().context;
  if (n == 0) return fail(StartFault::empty_prompt, "the prompt is empty");
  if (n >= context)
    return fail(
        StartFault::context,
        fmt::format("the prompt ({} tokens) and a token to generate do not fit the context of {} tokens", n, context));
  if (start.max_tokens > 0 && n + start.max_tokens > context) {
    if (start.refuse_beyond_context)
      return fail(StartFault::max_tokens,
                  fmt::format("the prompt ({} tokens) plus max_tokens ({}) exceed the context of {} tokens", n,
                              start.max_tokens, context));
    start.max_tokens = context - n;
  }
  const int64_t vocab = scheduler.model().info().vocab_size;
  if (auto id = biased_token_outside(start.sampling, vocab))
    return fail(StartFault::logit_bias,
                fmt::format("logit_bias names token {}, outside the vocabulary of {} tokens", *id, vocab));
  if (const ImageLayout* images = start.images.get(); images && images->whole) {
    // attended bidirectionally, an image runs in one forward call
    const int64_t most = scheduler.model().max_chunk_tokens();
    for (size_t i = 0; i < images->images.size(); ++i)
      if (images->images[i].soft_tokens > most)
        return fail(StartFault::images,
                    fmt::format("image {} fills {} tokens; this model runs at most {} in one step (raise "
                                "--prefill-chunk, or send a smaller image)",
                                i + 1, images->images[i].soft_tokens, most));
  }
  GenerationParams params{.prompt = std::move(start.ids),
                          .sampling = std::move(start.sampling),
                          .max_tokens = start.max_tokens > 0 ? start.max_tokens : context - n,
                          .logprobs = start.logprobs,
                          .forced = std::move(start.forced),
                          .keep_prefix = start.keep_prefix,
                          .images = std::move(start.images)};
  if (tokenizer) params.stop_ids = tokenizer->eos_ids();
  auto generation = scheduler.submit(std::move(params));
  if (!generation.ok()) return fail(StartFault::unavailable, generation.error().message);
  return std::make_unique<TextGeneration>(
      std::move(generation).value(), std::move(tokenizer),
      TextGenerationOptions{
          .stops = std::move(start.stops), .format = std::move(start.format), .one_tool_call = start.one_tool_call});
}

Result<std::unique_ptr<Stream>> Engine::submit(const Request& request) {
  Impl& e = *impl_;
  KILN_ASSIGN(PreparedPrompt prompt, prepare(e, request));
  const int64_t n = int64_t(prompt.ids.size());
  KILN_ASSIGN(Scheduler * scheduler, e.scheduler_for(n + (request.max_tokens > 0 ? request.max_tokens : 4096)));
  auto started = engine::start_generation(
      *scheduler, e.tokenizer,
      engine::GenerationStart{.ids = std::move(prompt.ids),
                              .format = std::move(prompt.format),
                              .keep_prefix = prompt.keep_prefix,
                              .sampling = engine::sampling_params(request.sampling, e.defaults),
                              .max_tokens = request.max_tokens,
                              .stops = request.stop,
                              .images = std::move(prompt.images)});
  if (auto* error = std::get_if<engine::StartError>(&started)) return Error{std::move(error->message)};
  return std::unique_ptr<Stream>(
      std::make_unique<TextStream>(std::move(std::get<std::unique_ptr<engine::TextGeneration>>(started))));
}

}  // namespace kiln
