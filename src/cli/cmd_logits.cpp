// kiln logits MODEL_DIR --ids 1,2,3 [--image PATH]... --out FILE.npy [--prefill-chunk N] [--dump DIR]
// Writes f32 logits [len(ids), vocab] for every position: kiln's public parity check. With
// --image, the ids are the Hugging Face processor's input_ids (each image's placeholder already
// expanded to its run of soft tokens) and the images are the files the processor was given, in
// order: kiln decodes and preprocesses them itself. With --dump DIR, also each layer's named
// activations, to compare with the oracle's layer by layer.
#include <spdlog/spdlog.h>

#include <charconv>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "cli/validators.h"
#include "core/npy.h"
#include "image/image.h"
#include "models/activation_dump.h"
#include "models/family.h"
#include "models/image_processor.h"
#include "models/model.h"
#include "runtime/prefill.h"
#include "runtime/prompt_images.h"

namespace kiln::cli {

namespace {

Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(begin, end - begin);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    int64_t value = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size() || value < 0 || value > INT32_MAX)
      return make_error("--ids: '{}' is not a token id (expected comma-separated non-negative integers)", item);
    ids.push_back(int32_t(value));
    begin = end + 1;
  }
  if (ids.empty()) return make_error("--ids is empty");
  return ids;
}

struct LogitsOptions {
  std::string model_dir;
  std::string ids;
  std::string out;
  std::string dump_dir;
  std::vector<std::string> images;
  int64_t prefill_chunk = 0;
  RunOptions run;
};

Status run_logits(const LogitsOptions& o) {
  KILN_ASSIGN(auto ids, parse_ids(o.ids));
  KILN_ASSIGN(auto backend, make_backend(o.run));
  // one forward may take the whole prompt unless a chunk size is asked for
  ModelOptions model_options;
  model_options.max_chunk_tokens = o.prefill_chunk > 0 ? o.prefill_chunk : std::max<int64_t>(1, int64_t(ids.size()));
  // the parity check against transformers, which keeps caches unquantized: a checkpoint's
  // kv_config.json counts only with --kv-bits
  model_options.kv_quant = kv_quant_option(o.run).value_or(KvQuant{});
  KILN_ASSIGN(auto model, load_model(o.model_dir, *backend, model_options));
  // transformers computes such positions too, so this is a warning, not an error
  const int64_t trained = model->info().max_position_embeddings;
  if (trained > 0 && int64_t(ids.size()) > trained)
    spdlog::warn("{} ids run past the model's max_position_embeddings ({})", ids.size(), trained);
  KILN_ASSIGN(auto state, model->new_sequence(int64_t(ids.size())));
  ActivationRecorder recorder;
  if (!o.dump_dir.empty()) model->set_activation_dump(&recorder);
  PromptImages placed;
  if (!o.images.empty()) {
    KILN_ASSIGN(ModelConfigFile config, read_model_config_file(o.model_dir + "/config.json"));
    KILN_ASSIGN(const ModelFamily* family, family_of(config));
    KILN_ASSIGN(auto input, ImageInput::load(o.model_dir, config, *family, model->batch_needs()));
    if (!input) return make_error("this model takes no images (its family or checkpoint has no vision tower)");
    std::vector<ProcessedImage> processed;
    for (const std::string& path : o.images) {
      KILN_ASSIGN(ProcessedImage image, input->read_file(path));
      processed.push_back(std::move(image));
    }
    KILN_ASSIGN(const ImageLayout layout, input->lay_out(ids, std::move(processed)));
    KILN_ASSIGN(placed, encode_images(*model, layout));
  }
  KILN_ASSIGN(Tensor logits,
              placed.empty() ? run_tokens(*model, *state, ids, model_options.max_chunk_tokens, LogitRows::all)
                             : run_prompt(*model, *state, ids, placed, model_options.max_chunk_tokens, LogitRows::all));
  model->set_activation_dump(nullptr);
  if (!o.dump_dir.empty()) {
    KILN_TRY(recorder.write_npy_dir(o.dump_dir));
    spdlog::info("wrote {} activations to {}", recorder.arrays().size(), o.dump_dir);
  }
  KILN_TRY(write_npy_f32(o.out, logits.data_as<float>(), {logits.dim(0), logits.dim(1)}));
  spdlog::info("wrote {} x {} logits to {}", logits.dim(0), logits.dim(1), o.out);
  return ok_status();
}

}  // namespace

void add_logits_command(CLI::App& app, Action& action, const Environment& env) {
  auto options = std::make_shared<LogitsOptions>();
  auto* cmd = app.add_subcommand("logits", "Write the logits of every position of a token sequence to a .npy file");
  cmd->add_option("model_dir", options->model_dir,
                  "Model directory (config.json, *.safetensors) or Hugging Face id ORG/NAME[@REV] in the cache")
      ->required();
  cmd->add_option("--ids", options->ids, "Comma-separated token ids")->required();
  cmd->add_option("--out", options->out, "Output .npy file (float32 [ids, vocab])")->required();
  cmd->add_option("--image", options->images,
                  "An image of the prompt, in order (repeatable); --ids then holds each image's soft-token run");
  cmd->add_option("--dump", options->dump_dir,
                  "Also write each layer's named activations (layers.N.self_attn, layers.N, ...) as DIR/NAME.npy");
  cmd->add_option("--prefill-chunk", options->prefill_chunk,
                  "Feed the ids through the cache this many at a time (1: pure decode; default: all at once)")
      ->check(positive_number());
  add_run_options(*cmd, options->run);
  cmd->callback([options, &action, &env] {
    action = [options, &env]() -> Status {
      KILN_ASSIGN(const ModelSource model, resolve_model(options->model_dir, env));
      options->model_dir = model.dir;
      return run_logits(*options);
    };
  });
}

}  // namespace kiln::cli
