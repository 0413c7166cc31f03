#include <spdlog/spdlog.h>

#include <cstdlib>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "cli/commands.h"
#include "cli/validators.h"
#ifdef KILN_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace kiln::cli {

void add_run_options(CLI::App& command, RunOptions& options) {
  command.add_option("--device", options.device, "cpu or cuda (default: cuda when a GPU is present)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  command.add_option("--threads", options.threads, "CPU threads (default: all cores)")
      ->check(number_in(0, kMaxThreads));
  command
      .add_option("--kv-bits", options.kv_bits,
                  "Attention caches quantized to 4 or 8 bits, or 16 (unquantized); default: the checkpoint's "
                  "kv_config.json, else 16")
      ->check(CLI::IsMember({4, 8, 16}));
  command.add_option("--kv-group-size", options.kv_group_size, "Elements per scale and bias of a quantized cache")
      ->check(CLI::IsMember({32, 64, 128}))
      ->capture_default_str();
}

std::optional<KvQuant> kv_quant_option(const RunOptions& options) {
  if (options.kv_bits == 0) return std::nullopt;
  return KvQuant{.bits = options.kv_bits == 16 ? 0 : options.kv_bits, .group_size = options.kv_group_size};
}

Result<std::unique_ptr<Backend>> make_backend(const RunOptions& options) {
#ifdef KILN_HAS_CUDA
  if (options.device == "cuda" || (options.device.empty() && cuda_device_present())) {
    // Developers measuring the tiled quantized layout (not yet the faster one) turn it on here.
    const char* tiled = std::getenv("KILN_TILED_WEIGHTS");
    KILN_ASSIGN(auto cuda, make_cuda_backend(
                               0, CudaBackendOptions{.tiled_quantized_weights = tiled && std::string(tiled) == "1"}));
    spdlog::info("backend: {}", cuda->name());
    return cuda;
  }
#else
  if (options.device == "cuda") return make_error("this kiln was built without CUDA; use --device cpu");
#endif
  auto backend = std::make_unique<CpuBackend>(options.threads);
  spdlog::info("backend: {}", backend->name());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace kiln::cli
