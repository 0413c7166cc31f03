#include "backend/meta/plan_backend.h"

#include <cstring>

namespace kiln {

PlanTarget cuda_plan_target() {
  // CudaBackend: bf16 activations, caches and matrices; quantized scales and biases as bf16
  return PlanTarget{.name = "cuda",
                    .activation_dtype = DType::bf16,
                    .matrix_dtype = DType::bf16,
                    .quant_scale_dtype = DType::bf16,
                    .quantized_kv_caches = true};
}

PlanTarget cpu_plan_target() {
  // CpuBackend: f32 throughout; quantized matrices stay as the checkpoint packs them
  return PlanTarget{.name = "cpu",
                    .activation_dtype = DType::f32,
                    .matrix_dtype = DType::f32,
                    .quant_scale_dtype = std::nullopt,
                    .quantized_kv_caches = true};
}

PlanBackend::PlanBackend(PlanTarget target) : target_(std::move(target)) {}

Tensor PlanBackend::counted(DType dtype, Shape shape, size_t bytes) {
  auto counter = counter_;
  const size_t live = counter->live += bytes;
  size_t peak = counter->peak;
  while (live > peak && !counter->peak.compare_exchange_weak(peak, live)) {
  }
  // a distinct address for each tensor, 256-byte aligned, that nothing ever reads
  const uintptr_t address = counter->next_address.fetch_add((bytes + 511) & ~uintptr_t(255));
  std::shared_ptr<void> owner(reinterpret_cast<void*>(address), [counter, bytes](void*) { counter->live -= bytes; });
  return Tensor(dtype, shape, owner.get(), owner, Device::meta);
}

Tensor PlanBackend::alloc(DType dtype, Shape shape) {
  return counted(dtype, shape, size_t(shape.numel()) * dtype_size(dtype));
}

Tensor PlanBackend::upload(const Tensor& host, DType dtype) {
  const bool is_float = host.dtype() == DType::f32 || host.dtype() == DType::bf16 || host.dtype() == DType::f16;
  return alloc(is_float ? dtype : host.dtype(), host.shape());
}

Tensor PlanBackend::upload_quantized(const Tensor& host) {
  const QuantParams& q = host.quant();
  auto params = std::make_shared<QuantParams>(q);
  Shape packed_shape = host.shape();
  packed_shape[-1] = host.cols() * q.bits / 32;
  const Tensor packed = alloc(DType::u32, packed_shape);
  const DType scale_dtype = target_.quant_scale_dtype.value_or(q.scales.dtype());
  params->scales = alloc(scale_dtype, q.scales.shape());
  params->biases = alloc(scale_dtype, q.biases.shape());
  params->tiled_bytes = 0;
  return Tensor(DType::u32, host.shape(), packed.data(), packed.owner(), Device::meta).with_quant(std::move(params));
}

Tensor PlanBackend::to_host(const Tensor& t) {
  const bool is_float = t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f16;
  Tensor out = host_tensor(is_float ? DType::f32 : t.dtype(), t.shape());
  std::memset(out.data(), 0, out.nbytes());
  return out;
}

}  // namespace kiln
