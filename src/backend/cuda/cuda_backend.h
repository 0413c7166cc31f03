// The CUDA backend: bf16 weights and activations, f32 accumulation, one stream per backend.
// This header is free of CUDA includes so that the CLI and tests can create the backend.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "ops/backend.h"

namespace kiln {

struct CudaDeviceInfo {
  std::string name;
  int compute_capability = 0;  // e.g. 90
  size_t total_memory = 0;
  int multiprocessors = 0;
};

// Whether a CUDA device can be used (a driver and at least one GPU).
bool cuda_device_present();
Result<CudaDeviceInfo> cuda_device_info(int device = 0);
struct CudaBackendOptions {
  // 4- and 8-bit matrices in the tiled layout that the streamed decode products read
  // (src/quant/tiles.h, cuda_quant_tiles.cu) instead of MLX's rows. Off by default: on an H200 it
  // is not yet faster at batch 1 (docs/performance.md).
  bool tiled_quantized_weights = false;
};
Result<std::unique_ptr<Backend>> make_cuda_backend(int device = 0, const CudaBackendOptions& options = {});

}  // namespace kiln
