// kiln bench MODEL_DIR [--device cuda|cpu] [--prompt-len N] [--gen N] [--batch N] [--runs N] [--json]
//                      [--image PATH]
//
// Prefill and decode speed measured with device timers, after a warm-up run, as the median of
// several runs; decode is set against the memory roofline (a device-to-device copy measured in
// the same run) and prefill against the rate a large bf16 matrix product reaches in the same run.
// With --image, also the image's way in: decoding and preprocessing it (CPU), encoding it (the
// vision tower), and the time to first token of the prompt with the image in its middle, beside
// the same text prompt without it.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "cli/validators.h"
#include "io/config.h"
#include "models/family.h"
#include "models/model.h"
#include "runtime/decode_loop.h"
#include "runtime/prefill.h"
#include "runtime/prompt_images.h"

namespace kiln::cli {

namespace {

struct BenchOptions {
  std::string model_dir;
  std::string model_name;  // as named on the command line
  int64_t prompt_len = 512;
  int64_t gen = 128;
  int64_t batch = 1;
  int64_t context = 0;  // each sequence's cache capacity; 0: prompt + gen + 1
  int runs = 3;
  bool json = false;
  bool matmul_peak = true;
  bool profile = false;
  std::string image;
  RunOptions run;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// FLOP/s of an n³ product in the backend's matrix type, on random data: n doubles from 1024 while
// one product takes under 50 ms, up to 8192 (a GPU's figure; a CPU stops at 1024–2048 instead of
// spending minutes on 8192³).
double matmul_peak(Backend& backend) {
  for (int64_t n = 1024;; n *= 2) {
    Tensor host = host_tensor(DType::f32, Shape{n, n});
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int64_t i = 0; i < host.numel(); ++i) host.data_as<float>()[i] = dist(rng);
    Tensor a = backend.upload(host, backend.matrix_dtype()), b = backend.upload(host, backend.matrix_dtype());
    Tensor c = backend.alloc(backend.activation_dtype(), Shape{n, n});
    auto timer = backend.timer();
    backend.matmul(a, b, c);  // a warm-up: the first product of a size may load kernels
    timer->start();
    backend.matmul(a, b, c);  // the size test
    if (timer->stop_ms() < 50.0 && n < 8192) continue;
    std::vector<double> ms;
    for (int i = 0; i < 7; ++i) {
      timer->start();
      backend.matmul(a, b, c);
      ms.push_back(timer->stop_ms());
    }
    ms.erase(ms.begin());
    return 2.0 * double(n) * double(n) * double(n) / (median(ms) * 1e-3);
  }
}

// FLOP/s as people read them: TFLOP/s, or GFLOP/s below one.
std::string flop_rate_text(double flop_s) {
  return flop_s >= 1e12 ? fmt::format("{:.1f} TFLOP/s", flop_s / 1e12) : fmt::format("{:.1f} GFLOP/s", flop_s / 1e9);
}

struct RunResult {
  double prefill_ms = 0, decode_ms = 0;
};

Result<RunResult> bench_once(Model& model, const std::vector<std::vector<int32_t>>& prompts, int64_t gen,
                             int64_t context) {  // each sequence's cache capacity
  Backend& backend = model.backend();
  std::vector<std::unique_ptr<SequenceState>> seqs;
  std::vector<SeqChunk> chunks;
  for (const auto& p : prompts) {
    KILN_ASSIGN(auto s, model.new_sequence(context));
    seqs.push_back(std::move(s));
    chunks.push_back({seqs.back().get(), p});
  }
  RunResult r;
  auto timer = backend.timer();
  backend.synchronize();
  timer->start();
  KILN_ASSIGN(Tensor logits, model.forward(chunks, LogitRows::last));
  Tensor first = backend.alloc(DType::i32, Shape{int64_t(prompts.size())});
  backend.argmax(logits, first);
  r.prefill_ms = timer->stop_ms();  // the first token is chosen: time to first token

  Tensor first_host = backend.to_host(first);
  std::vector<SequenceState*> states;
  for (auto& s : seqs) states.push_back(s.get());
  KILN_ASSIGN(auto loop, DecodeLoop::create(model, states,
                                            std::span<const int32_t>(first_host.data_as<int32_t>(), prompts.size())));
  KILN_TRY(loop->step());  // the first replay pays one-time costs
  backend.synchronize();
  timer->start();
  for (int64_t i = 1; i < gen; ++i) KILN_TRY(loop->step());
  r.decode_ms = timer->stop_ms() / double(std::max<int64_t>(1, gen - 1));
  return r;
}

Status run_bench(const BenchOptions& o) {
  if (o.prompt_len <= 0 || o.gen < 2 || o.batch <= 0) return make_error("bench needs --prompt-len > 0, --gen >= 2");
  const int64_t context = o.context > 0 ? o.context : o.prompt_len + o.gen + 1;
  if (context < o.prompt_len + o.gen + 1)
    return make_error("bench --ctx {} is less than the prompt and the tokens generated ({} + {} + 1)", o.context,
                      o.prompt_len, o.gen);
  KILN_ASSIGN(auto backend, make_backend(o.run));
  ModelOptions model_options;
  model_options.max_chunk_tokens = o.prompt_len;  // the prompt goes in as one forward
  model_options.kv_quant = kv_quant_option(o.run);
  // the image's soft tokens first: the prompt with the image goes in as one forward too
  std::vector<double> preprocess_ms;
  ProcessedImage processed;
  std::optional<ModelConfigFile> config;
  if (!o.image.empty()) {
    KILN_ASSIGN(config, read_model_config_file(o.model_dir + "/config.json"));
    KILN_ASSIGN(const ModelFamily* family, family_of(*config));
    if (!family->image_processor) return make_error("{} models take no images", family->name);
    KILN_ASSIGN(auto processor, family->image_processor(o.model_dir, *config));
    for (int run = 0; run <= o.runs; ++run) {
      const auto t0 = std::chrono::steady_clock::now();
      KILN_ASSIGN(RgbImage image, read_image(o.image));
      KILN_ASSIGN(processed, processor->process(image));
      if (run > 0)
        preprocess_ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    model_options.max_chunk_tokens = o.prompt_len + processed.soft_tokens;
  }
  const auto load_start = std::chrono::steady_clock::now();
  KILN_ASSIGN(auto model, load_model(o.model_dir, *backend, model_options));
  backend->synchronize();
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  const ModelInfo& info = model->info();
  if (o.context > 0 && info.max_position_embeddings > 0 && context > info.max_position_embeddings)
    return make_error("bench --ctx {} exceeds the model's {} positions (max_position_embeddings)", o.context,
                      info.max_position_embeddings);
  if (info.max_position_embeddings > 0 && context > info.max_position_embeddings)
    return make_error(
        "bench --prompt-len {} and --gen {} need {} positions; the model has {} (max_position_embeddings)",
        o.prompt_len, o.gen, context, info.max_position_embeddings);

  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> token(1, int32_t(std::min<int64_t>(info.vocab_size, 1 << 30)) - 1);
  std::vector<std::vector<int32_t>> prompts(size_t(o.batch), std::vector<int32_t>(size_t(o.prompt_len)));
  for (auto& p : prompts)
    for (auto& t : p) t = token(rng);

  const double copy_bw = backend->copy_bandwidth();
  const double peak_flops = o.matmul_peak ? matmul_peak(*backend) : 0.0;
  backend->reset_peak_memory();
  std::vector<double> prefill, decode;
  for (int run = 0; run <= o.runs; ++run) {  // run 0 warms up
    KILN_ASSIGN(RunResult r, bench_once(*model, prompts, o.gen, context));
    if (run == 0) continue;
    prefill.push_back(r.prefill_ms);
    decode.push_back(r.decode_ms);
  }
  const double prefill_ms = median(prefill), step_ms = median(decode);
  const double prefill_tps = double(o.batch * o.prompt_len) / (prefill_ms * 1e-3);
  const double decode_tps = double(o.batch) / (step_ms * 1e-3);
  // decode reads at the mean context of the generated span
  const size_t step_bytes = model->decode_bytes(o.prompt_len + o.gen / 2, o.batch);
  const double achieved_bw = double(step_bytes) / (step_ms * 1e-3);
  const double flops = double(o.batch) * model->prefill_flops(o.prompt_len);
  const double prefill_rate = flops / (prefill_ms * 1e-3);
  const size_t peak_memory = backend->peak_memory_bytes();

  // the image: encoded alone, and in a prompt of prompt_len text tokens around it
  double encode_ms = 0, image_ttft_ms = 0;
  if (!o.image.empty()) {
    KILN_ASSIGN(const ModelFamily* family, family_of(*config));
    KILN_ASSIGN(auto input, ImageInput::load(o.model_dir, *config, *family, model->batch_needs()));
    if (!input) return make_error("this checkpoint has no vision tower");
    std::vector<int32_t> ids(prompts[0].begin(), prompts[0].begin() + o.prompt_len / 2);
    ids.insert(ids.end(), size_t(processed.soft_tokens), input->placeholder().token_id);
    ids.insert(ids.end(), prompts[0].begin() + o.prompt_len / 2, prompts[0].end());
    KILN_ASSIGN(const ImageLayout layout, input->lay_out(ids, {processed}));
    auto timer = backend->timer();
    std::vector<double> encode, ttft;
    for (int run = 0; run <= o.runs; ++run) {
      backend->synchronize();
      timer->start();
      KILN_ASSIGN(Tensor rows, model->encode_image(processed));
      const double e = timer->stop_ms();
      KILN_ASSIGN(auto state, model->new_sequence(int64_t(ids.size()) + 1));
      backend->synchronize();
      timer->start();
      KILN_ASSIGN(const PromptImages placed, encode_images(*model, layout));
      KILN_ASSIGN(Tensor logits, run_prompt(*model, *state, ids, placed, 0, LogitRows::last));
      const double t = timer->stop_ms();  // run_prompt reads the last row back: the token is chosen
      if (run == 0) continue;
      encode.push_back(e);
      ttft.push_back(t);
    }
    encode_ms = median(encode);
    image_ttft_ms = median(ttft);
  }

  std::string profile_prefill, profile_decode;
  if (o.profile) {  // one prefill and a few decode steps issued op by op, each op timed
    std::vector<std::unique_ptr<SequenceState>> seqs;
    std::vector<SeqChunk> chunks;
    for (const auto& p : prompts) {
      KILN_ASSIGN(auto s, model->new_sequence(std::max(o.context, o.prompt_len + 8)));
      seqs.push_back(std::move(s));
      chunks.push_back({seqs.back().get(), p});
    }
    backend->set_profiling(true);
    KILN_TRY(model->forward(chunks, LogitRows::last).ok() ? ok_status()
                                                          : Status(make_error("profiled prefill failed")));
    profile_prefill = backend->profile_report();
    std::vector<int32_t> next(prompts.size(), 1);
    backend->set_profiling(true);
    for (int step = 0; step < 4; ++step) {
      std::vector<SeqChunk> one;
      for (size_t i = 0; i < seqs.size(); ++i) one.push_back({seqs[i].get(), std::span(&next[i], 1)});
      auto logits = model->forward(one, LogitRows::last);
      if (!logits.ok()) return logits.error();
    }
    profile_decode = backend->profile_report();
    backend->set_profiling(false);
  }

  nlohmann::ordered_json j;
  j["model"] = o.model_name;
  j["model_type"] = info.model_type;
  j["weight_bytes"] = info.weight_bytes;
  j["device"] = backend->name();
  j["prompt_len"] = o.prompt_len;
  j["gen"] = o.gen;
  j["batch"] = o.batch;
  j["context"] = context;
  j["runs"] = o.runs;
  j["load_s"] = load_s;
  j["prefill_ms"] = prefill_ms;
  j["prefill_tok_s"] = prefill_tps;
  j["time_to_first_token_ms"] = prefill_ms;
  j["prefill_flops"] = flops;
  j["prefill_tflop_s"] = prefill_rate / 1e12;
  j["matmul_peak_tflop_s"] = peak_flops / 1e12;
  j["prefill_share_of_matmul_peak"] = peak_flops > 0 ? prefill_rate / peak_flops : 0.0;
  j["decode_step_ms"] = step_ms;
  j["decode_tok_s"] = decode_tps;
  j["decode_bytes_per_step"] = step_bytes;
  j["decode_bandwidth_gb_s"] = achieved_bw / 1e9;
  j["copy_bandwidth_gb_s"] = copy_bw / 1e9;
  j["decode_share_of_roofline"] = achieved_bw / copy_bw;
  j["peak_memory_bytes"] = peak_memory;
  if (!o.image.empty()) {
    j["image"] = o.image;
    j["image_grid"] = processed.grid;
    j["image_soft_tokens"] = processed.soft_tokens;
    j["image_preprocess_ms"] = median(preprocess_ms);
    j["image_encode_ms"] = encode_ms;
    j["image_time_to_first_token_ms"] = image_ttft_ms;
  }
  if (o.json) {
    fmt::print("{}\n", j.dump(2));
    if (o.profile)
      fmt::print(stderr, "prefill by op:\n{}decode (4 steps, op by op) by op:\n{}", profile_prefill, profile_decode);
    return ok_status();
  }
  fmt::print("kiln bench: {} ({}, {:.2f} GB of weights) on {}\n", o.model_name, info.model_type,
             double(info.weight_bytes) / 1e9, backend->name());
  fmt::print("  prompt {} x batch {}, {} generated{}; median of {} runs after a warm-up; load {:.1f} s\n", o.prompt_len,
             o.batch, o.gen, o.context > 0 ? fmt::format(", caches of {} tokens", o.context) : "", o.runs, load_s);
  fmt::print("  prefill              {:10.1f} tok/s   {:8.2f} ms   {:>15}", prefill_tps, prefill_ms,
             flop_rate_text(prefill_rate));
  if (peak_flops > 0)
    fmt::print(" = {:.1f}% of a {} matmul", 100.0 * prefill_rate / peak_flops, flop_rate_text(peak_flops));
  fmt::print("\n  time to first token  {:10.2f} ms\n", prefill_ms);
  fmt::print("  decode               {:10.1f} tok/s   {:8.3f} ms/step\n", decode_tps, step_ms);
  fmt::print("  decode reads         {:10.2f} GB/step  {:.0f} GB/s = {:.1f}% of {:.0f} GB/s copy bandwidth\n",
             double(step_bytes) / 1e9, achieved_bw / 1e9, 100.0 * achieved_bw / copy_bw, copy_bw / 1e9);
  fmt::print("  peak device memory   {:10.2f} GiB\n", double(peak_memory) / double(1 << 30));
  if (!o.image.empty()) {
    fmt::print("  image                {} -> {} soft tokens\n", o.image, processed.soft_tokens);
    fmt::print("  image preprocess     {:10.2f} ms (CPU: decode, resize, normalise)\n", median(preprocess_ms));
    fmt::print("  image encode         {:10.2f} ms\n", encode_ms);
    fmt::print("  time to first token  {:10.2f} ms with the image amid the {} tokens ({:.2f} ms without)\n",
               image_ttft_ms, o.prompt_len, prefill_ms);
  }
  if (o.profile) fmt::print("prefill by op:\n{}decode (4 steps, op by op) by op:\n{}", profile_prefill, profile_decode);
  return ok_status();
}

}  // namespace

void add_bench_command(CLI::App& app, Action& action, const Environment& env) {
  auto options = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand("bench", "Measure prefill and decode speed on a model directory");
  cmd->add_option("model_dir", options->model_dir, "Model directory or Hugging Face id ORG/NAME[@REV] in the cache")
      ->required();
  cmd->add_option("--prompt-len", options->prompt_len, "Prompt tokens per sequence")->check(positive_number());
  cmd->add_option("--gen", options->gen, "Tokens generated per sequence")->check(number_in(2, 1 << 20));
  cmd->add_option("--batch", options->batch, "Sequences decoded together")->check(positive_number());
  cmd->add_option("--ctx", options->context,
                  "Cache capacity per sequence in tokens, as kiln serve --ctx allocates (default: prompt + gen + 1)")
      ->check(positive_number());
  cmd->add_option("--runs", options->runs, "Timed runs (after one warm-up)")->check(number_in(1, 100));
  cmd->add_flag("--json", options->json, "Print the figures as JSON");
  cmd->add_flag("!--no-matmul-peak", options->matmul_peak, "Skip measuring the matrix-product peak");
  cmd->add_flag("--profile", options->profile, "Also time every op of one prefill and a few decode steps");
  cmd->add_option("--image", options->image,
                  "Also time this image's preprocessing and encoding, and the first token of the prompt with it")
      ->check(CLI::ExistingFile);
  add_run_options(*cmd, options->run);
  cmd->callback([options, &action, &env] {
    action = [options, &env]() -> Status {
      options->model_name = options->model_dir;
      KILN_ASSIGN(const ModelSource model, resolve_model(options->model_dir, env));
      options->model_dir = model.dir;
      return run_bench(*options);
    };
  });
}

}  // namespace kiln::cli
