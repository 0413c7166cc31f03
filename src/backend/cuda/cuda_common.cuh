// Shared pieces of the CUDA kernels: types, dtype dispatch, launch checks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "core/tensor.h"

#if KILN_CUDA_TIMELINE
#include "backend/cuda/cuda_timeline_marks.h"
#endif

namespace kiln::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(bf16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half(x);
}

__device__ __forceinline__ float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float silu(float x) {
  return x / (1.0f + expf(-x));
}
__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// One output of the causal conv over a window right-aligned in arrays of K slots (slot K - 1 the
// new input xt; slots below `first` unused, never multiplied), summed in this one order by every
// kernel that forms it; the window then advances by xt.
template <int K>
__device__ __forceinline__ float causal_conv_step(const float (&w)[K], float (&history)[K - 1], float xt, int first) {
  float acc = w[K - 1] * xt;
#pragma unroll
  for (int i = 0; i < K - 1; ++i)
    if (i >= first) acc += w[i] * history[i];
#pragma unroll
  for (int i = 0; i + 1 < K - 1; ++i) history[i] = history[i + 1];
  history[K - 2] = xt;
  return acc;
}

// Row-strided 2-D view handed to kernels by value.
template <typename T>
struct Rows {
  T* data;
  int64_t stride;  // elements between consecutive rows
  __device__ __forceinline__ T* row(int64_t r) const { return data + r * stride; }
};

template <typename T>
Rows<T> rows_of(const Tensor& t) {
  return Rows<T>{static_cast<T*>(t.data()), t.row_stride()};
}

// Calls f(T{}) with T the C++ type of a float dtype.
template <typename F>
void dispatch_float(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32:
      f(float{});
      break;
    case DType::bf16:
      f(bf16{});
      break;
    case DType::f16:
      f(__half{});
      break;
    default:
      break;
  }
}

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// `op` over a warp's lanes (butterfly: every lane gets the result).
template <typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  return warp_reduce(v, SumOp{});
}
__device__ __forceinline__ float warp_max(float v) {
  return warp_reduce(v, MaxOp{});
}

// `op` over a block (blockDim.x a multiple of 32, at most 1024): each warp's result, then the warps'
// in order from `identity`; every thread gets the result.
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, Op op, float identity) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_reduce(v, op);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = identity;
  for (int w = 0; w < int(blockDim.x + 31) / 32; ++w) total = op(total, partial[w]);
  return total;
}
__device__ __forceinline__ float block_sum(float v) {
  return block_reduce(v, SumOp{}, 0.0f);
}
__device__ __forceinline__ float block_max(float v) {
  return block_reduce(v, MaxOp{}, -INFINITY);
}

// A 16-byte load of data read once per kernel (weights): not kept in L1, and L2 fetches the
// surrounding 256 bytes from memory at once. On an H200 the hint took a 1.3 GB batch-1 product
// from 3.9 to 4.35 TB/s.
__device__ __forceinline__ uint4 load_streaming(const uint4* p) {
  uint4 r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
#else
  r = __ldg(p);
#endif
  return r;
}

// cp.async: copies from global to shared memory that hold no registers while in flight; each
// thread waits for its own groups, others' need a barrier.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return unsigned(__cvta_generic_to_shared(p));
}
// 16 bytes global → shared, or 16 zero bytes when !fill (nothing is read then)
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool fill) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(fill ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;" ::: "memory");
}
// Counts a block's arrival on `count` and returns the count before it: a release of the stores the
// block made before a __syncthreads() (or __syncwarp()) the caller ran, and an acquire of those of
// the blocks counted before it, for the caller's threads after a barrier that follows. Cheaper
// than a __threadfence() in every thread around a relaxed atomicAdd (measured on an H200: −0.02 ms
// a decode step).
__device__ __forceinline__ unsigned arrive_acq_rel(unsigned* count) {
  unsigned before;
  asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(before) : "l"(count) : "memory");
  return before;
}
// Four 8x8 bf16 matrices from shared memory, lane l giving a row address of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d += a · b on the tensor cores (mma.sync m16n8k8, tf32): a 16×8 row-major, b 8×8 column-major,
// d 16×8 f32; a register holds an f32 of which the tensor cores read the top 19 bits (a bf16 value
// as f32 is exact). Fragments in the PTX ISA's per-lane layout: a0 (g, t), a1 (g + 8, t), a2 (g,
// t + 4), a3 (g + 8, t + 4); b0 (t, g), b1 (t + 4, g); d as for m16n8k16 (g = lane / 4, t = lane % 4).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
// x as a pair of tf32 values, hi + lo equal to x within ~2^-22 of it: two tf32 products against an
// exact tf32 operand keep (nearly) f32's precision.
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(hi) : "f"(x));
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(x - __uint_as_float(hi)));
#endif
}

// d += a · b on the tensor cores (mma.sync m16n8k16): a 16×16 bf16 row-major, b 16×8 bf16
// column-major, d 16×8 f32; fragments in the PTX ISA's per-lane layout.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// A row of up to 32 · kNormRegisterCols columns normalised by one warp, held in registers (lane l
// has columns l + 32 i): out = x · rsqrt(Σx² / cols + eps) · w (· silu(z) when gated), w the weight
// plus offset (1 where there is none). Every warp-per-row norm goes through here, so all give a row
// the same bits.
constexpr int kNormRegisterCols = 8;
template <typename T, bool kGated>
__device__ __forceinline__ void norm_row_registers(const float (&xv)[kNormRegisterCols],
                                                   const float (&wv)[kNormRegisterCols],
                                                   const float (&zv)[kNormRegisterCols], bool weighted, T* out,
                                                   int64_t cols, float eps, int lane) {
  float sum = 0;
#pragma unroll
  for (int i = 0; i < kNormRegisterCols; ++i) sum += xv[i] * xv[i];
  sum = warp_sum(sum);
  const float inv = rsqrtf(sum / float(cols) + eps);
#pragma unroll
  for (int i = 0; i < kNormRegisterCols; ++i) {
    const int64_t c = lane + 32 * i;
    if (c >= cols) continue;
    float v = xv[i] * inv;
    if (weighted) v *= wv[i];
    if constexpr (kGated) v *= silu(zv[i]);
    out[c] = from_float<T>(v);
  }
}

#if KILN_CUDA_TIMELINE
namespace {
__device__ TimelineControl timeline_control;  // this translation unit's copy
void set_timeline_control(const TimelineControl& control) {
  cudaMemcpyToSymbol(timeline_control, &control, sizeof control);
}
[[maybe_unused]] const bool timeline_registered = (register_timeline_unit(set_timeline_control), true);
}  // namespace

__device__ __forceinline__ unsigned long long global_nanoseconds() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif

// Programmatic dependent launch. At batch 1 a decode step is a few hundred short kernels, and each
// launch used to start only after the previous kernel had drained. Kernels launched with launch()
// may be scheduled while the kernel before them finishes; every kernel therefore calls
// wait_for_inputs() before it touches memory that others write (before it, a kernel may only read
// constants such as weights), which returns once the previous kernel has completed and its writes
// are visible, and then lets the next kernel start its own launch. (Letting the next one launch
// before waiting measured slower on an H200: its blocks then take room the running kernel's
// successors need; see docs/performance.md.)
__device__ __forceinline__ void wait_for_inputs() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#if KILN_CUDA_TIMELINE
  const TimelineControl control = timeline_control;
  const bool first = threadIdx.x + threadIdx.y + threadIdx.z + blockIdx.x + blockIdx.y + blockIdx.z == 0;
  const bool mark = control.marks && first;
  unsigned long long slot = 0, started = 0;
  if (mark) slot = atomicAdd(control.marks, 1ull), started = global_nanoseconds();
  if (control.early_trigger) asm volatile("griddepcontrol.launch_dependents;" :::);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (!control.early_trigger) asm volatile("griddepcontrol.launch_dependents;" :::);
  if (mark && slot < control.capacity) {
    unsigned long long* m = control.marks + 1 + 3 * slot;
    m[0] = started;
    m[1] = global_nanoseconds();
    m[2] = (unsigned long long)(gridDim.x * gridDim.y * gridDim.z) << 32 | blockDim.x * blockDim.y * blockDim.z;
  }
#else
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
#endif
}

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
#if KILN_CUDA_TIMELINE
  timeline_note_launch(reinterpret_cast<const void*>(kernel), grid.x * grid.y * grid.z, block.x * block.y * block.z);
#endif
  cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// The device's opt-in shared memory per block (static and dynamic together).
inline size_t max_shared_memory() {
  static const size_t bytes = [] {
    int device = 0, value = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    return size_t(value);
  }();
  return bytes;
}

// Lets `kernel` launch with as much dynamic shared memory as the device gives a block beside the
// kernel's static shared memory. Always the most, never one launch's size: a captured graph replays
// every launch of a kernel against the kernel's one setting, the last one made.
template <typename Kernel>
void allow_most_dynamic_shared(Kernel kernel) {
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernel)) != cudaSuccess) return;
  cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                       int(max_shared_memory()) - int(attributes.sharedSizeBytes));
}

// The current device's SMs.
inline int multiprocessors() {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return sms > 0 ? sms : 1;
}

inline int ceil_div(int64_t a, int64_t b) {
  return int((a + b - 1) / b);
}

}  // namespace kiln::cuda
