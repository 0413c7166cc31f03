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
