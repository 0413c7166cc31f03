// kiln synth-model CONFIG_JSON OUT_DIR [--dtype bf16|f32] [--seed N]
// Writes a random-weight model directory of the geometry a config.json describes.
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>

#include "cli/commands.h"
#include "cli/validators.h"
#include "io/synthetic.h"
#include "models/family.h"
#include "models/model.h"

namespace kiln::cli {

namespace {

namespace fs = std::filesystem;

struct SynthOptions {
  std::string config;
  std::string out_dir;
  std::string dtype = "bf16";
  uint64_t seed = 0;
};

Status run_synth(const SynthOptions& o) {
  KILN_ASSIGN(ModelConfigFile config, read_model_config_file(o.config));
  KILN_ASSIGN(auto tensors, checkpoint_tensors(config));
  KILN_ASSIGN(const ModelFamily* family, family_of(config));
  const ModelTypeEntry* outer = family->entry(config.outer_model_type);
  nlohmann::json written;
  if (outer && outer->wrapper) {
    // a release-form config: the wrapper as given, the language model under
    // "model.language_model." and the towers and heads it describes beside it
    written = config.root;
    for (auto& t : tensors)
      if (t.name.rfind("model.", 0) == 0) t.name = "model.language_model." + t.name.substr(6);
    KILN_ASSIGN(auto parts, checkpoint_part_tensors(config));
    tensors.insert(tensors.end(), parts.begin(), parts.end());
  } else {
    // the tensors are named as a text-only checkpoint: write the language model's config flat
    written = config.text;
    std::string type = config.model_type;
    for (const auto& e : family->model_types)
      if (e.model_type == type && e.wrapper && !e.text_model_types.empty()) type = e.text_model_types.front();
    written["model_type"] = type;
  }
  for (auto* j : {&written, written.contains("text_config") ? &written["text_config"] : nullptr}) {
    if (!j) continue;
    j->erase("quantization");
    j->erase("quantization_config");
  }
  written["dtype"] = o.dtype == "bf16" ? "bfloat16" : "float32";
  // counted in double: an absurd geometry must be refused, not overflow into a plausible size
  double params = 0;
  for (const auto& t : tensors) {
    double n = 1;
    for (int i = 0; i < t.shape.rank(); ++i) n *= double(t.shape[i]);
    params += n;
  }
  const double bytes = params * (o.dtype == "bf16" ? 2.0 : 4.0);
  std::error_code error;
  fs::path existing = fs::absolute(o.out_dir, error);
  while (!existing.empty() && !fs::exists(existing, error) && existing.has_parent_path() &&
         existing.parent_path() != existing)
    existing = existing.parent_path();
  const fs::space_info space = fs::space(existing, error);
  if (!error && bytes > double(space.available))
    return make_error("{}: the model would take {:.1f} GB, but {} has {:.1f} GB free", o.config, bytes / 1e9,
                      existing.string(), double(space.available) / 1e9);
  spdlog::info("writing {} tensors, {:.2f} B parameters, to {}", tensors.size(), params / 1e9, o.out_dir);
  const auto start = std::chrono::steady_clock::now();
  KILN_TRY(write_synthetic_checkpoint(
      o.out_dir, written, tensors,
      SyntheticOptions{.dtype = o.dtype == "bf16" ? DType::bf16 : DType::f32, .seed = o.seed}));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print(stderr, "wrote {} ({:.2f} B parameters, {}) in {:.1f} s\n", o.out_dir, params / 1e9, o.dtype, seconds);
  return ok_status();
}

}  // namespace

void add_synth_model_command(CLI::App& app, Action& action) {
  auto options = std::make_shared<SynthOptions>();
  auto* cmd = app.add_subcommand("synth-model", "Write a random-weight model directory of any geometry");
  cmd->add_option("config_json", options->config, "config.json describing the geometry")->required();
  cmd->add_option("out_dir", options->out_dir, "Directory to write")->required();
  cmd->add_option("--dtype", options->dtype, "Weight type")->check(CLI::IsMember({"bf16", "f32"}));
  cmd->add_option("--seed", options->seed, "Random seed")->check(unsigned_64());
  cmd->callback([options, &action] { action = [options] { return run_synth(*options); }; });
}

}  // namespace kiln::cli
