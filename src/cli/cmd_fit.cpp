// kiln fit MODEL [--ctx N] [--batch N] [--prefill-chunk N] [--prompt-cache-bytes B] [--kv-bits B]
//          [--memory BYTES|FRACTION] [--device D] [--json]
// The memory plan of a model on a device before anything is allocated: weights as the device keeps
// them, what each kind of layer state takes per token and per sequence, a step's workspace, and
// the largest context and concurrency that fit the memory (src/runtime/memory_plan.h).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backend/meta/plan_backend.h"
#include "cli/commands.h"
#include "cli/model_source.h"
#include "cli/validators.h"
#include "models/model.h"
#include "runtime/memory_plan.h"
#ifdef KILN_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace kiln::cli {

namespace {

struct FitOptions {
  std::string model_dir;
  std::string model_name;
  int64_t context = 4096;
  int64_t batch = 1;
  int64_t prefill_chunk = 256;
  size_t prompt_cache_bytes = 0;
  std::string memory;  // bytes, or a fraction of the device's memory
  bool json = false;
  RunOptions run;
};

std::string gib(size_t bytes) {
  const double b = double(bytes);
  if (b >= double(1 << 30)) return fmt::format("{:.2f} GiB", b / double(1 << 30));
  if (b >= double(1 << 20)) return fmt::format("{:.1f} MiB", b / double(1 << 20));
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

// The memory kiln may use on the device: its total memory (a GPU's, or the host's available
// memory for the CPU), times a fraction, or bytes given outright.
struct Budget {
  size_t device_bytes = 0;  // 0: unknown (planning for a GPU this machine does not have)
  std::string device_desc;
  size_t bytes = 0;  // 0: unknown
};

Result<size_t> host_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return make_error("cannot read MemAvailable from /proc/meminfo");
}

Result<Budget> device_budget(const std::string& device, const std::string& memory) {
  Budget b;
  if (device == "cpu") {
    KILN_ASSIGN(b.device_bytes, host_available_bytes());
    b.device_desc = fmt::format("host memory available {}", gib(b.device_bytes));
  } else {
#ifdef KILN_HAS_CUDA
    if (cuda_device_present()) {
      KILN_ASSIGN(CudaDeviceInfo info, cuda_device_info(0));
      b.device_bytes = info.total_memory;
      b.device_desc = fmt::format("{}, {}", info.name, gib(info.total_memory));
    }
#endif
    if (!b.device_bytes) b.device_desc = "no GPU on this machine";
  }
  double fraction = 0.9;  // as vLLM's default gpu_memory_utilization
  if (!memory.empty()) {
    double value = 0;
    std::istringstream in(memory);
    if (!(in >> value) || !in.eof() || value <= 0)
      return make_error("--memory {}: expected a number of bytes or a fraction of the device's memory", memory);
    if (value > 1.0) {
      b.bytes = size_t(value);
      return b;
    }
    fraction = value;
  }
  b.bytes = size_t(double(b.device_bytes) * fraction);
  return b;
}

std::string kv_description(const RunOptions& run) {
  if (run.kv_bits == 4 || run.kv_bits == 8)
    return fmt::format("{}-bit in groups of {}", run.kv_bits, run.kv_group_size);
  if (run.kv_bits == 16) return "unquantized";
  return "as the checkpoint's kv_config.json sets, else unquantized";
}

Status run_fit(const FitOptions& o) {
  std::string device = o.run.device;
  if (device.empty()) {
#ifdef KILN_HAS_CUDA
    device = cuda_device_present() ? "cuda" : "cpu";
#else
    device = "cpu";
#endif
  }
  PlanBackend backend(device == "cuda" ? cuda_plan_target() : cpu_plan_target());
  ModelOptions model_options;
  model_options.max_chunk_tokens = std::max<int64_t>(model_options.max_chunk_tokens, o.prefill_chunk);
  model_options.kv_quant = kv_quant_option(o.run);
  KILN_ASSIGN(auto model, load_model(o.model_dir, backend, model_options));
  const size_t weights = backend.live_memory_bytes();
  KILN_ASSIGN(const MemoryPlan plan, plan_memory(*model, weights, o.prefill_chunk, o.prompt_cache_bytes));
  KILN_ASSIGN(const Budget budget, device_budget(device, o.memory));
  const ModelInfo& info = model->info();
  if (info.max_position_embeddings > 0 && o.context > info.max_position_embeddings)
    spdlog::warn("--ctx {} is beyond the model's {} positions (max_position_embeddings)", o.context,
                 info.max_position_embeddings);
  const size_t total = plan.total(o.context, o.batch);

  nlohmann::json j;
  j["model"] = o.model_name;
  j["model_type"] = info.model_type;
  j["device"] = device;
  j["kv_cache"] = kv_description(o.run);
  j["weights_bytes"] = plan.weights;
  j["states"] = nlohmann::json::array();
  for (const auto& s : plan.states)
    j["states"].push_back({{"kind", s.kind},
                           {"layers", s.layers},
                           {"bytes_per_token", s.bytes_per_token},
                           {"bytes_per_sequence", s.bytes_per_sequence}});
  j["kv_bytes_per_token"] = plan.bytes_per_token();
  j["state_bytes_per_sequence"] = plan.bytes_per_sequence();
  j["prefill_chunk"] = plan.prefill_chunk;
  j["workspace_bytes"] = plan.step_workspace(o.batch);
  j["prompt_cache_bytes"] = plan.prompt_cache;
  j["context"] = o.context;
  j["batch"] = o.batch;
  j["peak_memory_bytes"] = total;
  if (budget.bytes) {
    j["device_memory_bytes"] = budget.device_bytes;
    j["budget_bytes"] = budget.bytes;
    j["fits"] = total <= budget.bytes;
    j["max_context"] = plan.max_context(budget.bytes, o.batch);
    j["max_batch"] = plan.max_batch(budget.bytes, o.context);
  }
  if (o.json) {
    fmt::print("{}\n", j.dump(2));
    return ok_status();
  }

  fmt::print("{} ({}) on {}: {}\n", o.model_name, info.model_type, device, budget.device_desc);
  fmt::print("  weights                      {:>12}\n", gib(plan.weights));
  for (const auto& s : plan.states) {
    const std::string what = fmt::format("{} ({} layer{})", s.kind, s.layers, s.layers == 1 ? "" : "s");
    if (s.bytes_per_token)
      fmt::print("  {:<28} {:>12} per token of context ({})\n", what, gib(s.bytes_per_token), kv_description(o.run));
    else
      fmt::print("  {:<28} {:>12} per sequence\n", what, gib(s.bytes_per_sequence));
  }
  fmt::print("  step workspace               {:>12} (a {}-token prefill chunk beside {} decode row{})\n",
             gib(plan.step_workspace(o.batch)), plan.prefill_chunk, o.batch - 1, o.batch == 2 ? "" : "s");
  if (plan.prompt_cache) fmt::print("  prompt cache                 {:>12}\n", gib(plan.prompt_cache));
  fmt::print("  --ctx {} --batch {:<10} {:>12} at its peak\n", o.context, o.batch, gib(total));
  if (!budget.bytes) {
    fmt::print("  (give --memory BYTES to see what fits a device this machine does not have)\n");
    return ok_status();
  }
  fmt::print("  budget                       {:>12} ({})\n", gib(budget.bytes),
             total <= budget.bytes ? "fits" : "does not fit");
  const int64_t max_ctx = plan.max_context(budget.bytes, o.batch);
  fmt::print("  longest context at batch {:<4} {:>11}{}\n", o.batch, max_ctx,
             max_ctx == plan.max_positions ? " (the model's positions)" : "");
  fmt::print("  most sequences at ctx {:<7} {:>11}\n", o.context, plan.max_batch(budget.bytes, o.context));
  return ok_status();
}

}  // namespace

void add_fit_command(CLI::App& app, Action& action, const Environment& env) {
  auto options = std::make_shared<FitOptions>();
  auto* cmd = app.add_subcommand("fit", "Plan a model's memory on a device: what fits, before anything is allocated");
  cmd->add_option("model_dir", options->model_dir, "Model directory or Hugging Face id ORG/NAME[@REV] in the cache")
      ->required();
  cmd->add_option("--ctx", options->context, "Context per sequence in tokens")
      ->capture_default_str()
      ->check(positive_number());
  cmd->add_option("--batch", options->batch, "Sequences at once")->capture_default_str()->check(positive_number());
  cmd->add_option("--prefill-chunk", options->prefill_chunk, "Most prompt tokens per step, as kiln serve's")
      ->capture_default_str()
      ->check(positive_number());
  cmd->add_option("--prompt-cache-bytes", options->prompt_cache_bytes, "Prefix cache budget in bytes");
  cmd->add_option("--memory", options->memory,
                  "Memory kiln may use: bytes, or a fraction of the device's (default 0.9 of a GPU's memory, or of "
                  "the host's available memory)");
  cmd->add_flag("--json", options->json, "Print the plan as JSON");
  add_run_options(*cmd, options->run);
  cmd->callback([options, &action, &env] {
    action = [options, &env]() -> Status {
      options->model_name = options->model_dir;
      KILN_ASSIGN(const ModelSource model, resolve_model(options->model_dir, env));
      options->model_dir = model.dir;
      return run_fit(*options);
    };
  });
}

}  // namespace kiln::cli
