// The kiln command line: each subcommand registers itself on the app and runs as a thin client of
// the engine library.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "cli/environment.h"
#include "core/status.h"
#include "ops/backend.h"

namespace kiln::cli {

// Options every command that runs a model shares.
struct RunOptions {
  std::string device;  // "", "cpu" or "cuda" ("" picks CUDA when a GPU is present)
  int threads = 0;     // CPU threads (0: all cores)
  // attention caches: 4 or 8 (quantized), 16 (the activations' type), 0 (the checkpoint's
  // kv_config.json, else 16); the group size of quantized ones
  int kv_bits = 0;
  int kv_group_size = 64;
};

void add_run_options(CLI::App& command, RunOptions& options);
Result<std::unique_ptr<Backend>> make_backend(const RunOptions& options);
// The cache format --kv-bits asks for every layer, or none (the checkpoint's kv_config.json).
std::optional<KvQuant> kv_quant_option(const RunOptions& options);

// A subcommand's action; its Status becomes the exit code and one error line.
using Action = std::function<Status()>;

// Commands that take a model resolve it through `env` (see model_source.h); `env` outlives them.
void add_logits_command(CLI::App& app, Action& action, const Environment& env);
void add_synth_model_command(CLI::App& app, Action& action);
void add_quantize_command(CLI::App& app, Action& action, const Environment& env);
void add_bench_command(CLI::App& app, Action& action, const Environment& env);
void add_tokenize_command(CLI::App& app, Action& action, const Environment& env);
void add_generate_command(CLI::App& app, Action& action, const Environment& env);
void add_chat_command(CLI::App& app, Action& action, const Environment& env);
void add_template_command(CLI::App& app, Action& action, const Environment& env);
void add_serve_command(CLI::App& app, Action& action, const Environment& env);
void add_pull_command(CLI::App& app, Action& action, const Environment& env);
void add_ls_command(CLI::App& app, Action& action, const Environment& env);
void add_fit_command(CLI::App& app, Action& action, const Environment& env);

}  // namespace kiln::cli
