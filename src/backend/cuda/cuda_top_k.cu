// CUDA backend: the k most likely tokens of each row of logits (Backend::top_k), so that a sampled
// token needs k candidates on the host instead of the whole vocabulary.
//
// Each (value, id) pair becomes one 64-bit key whose unsigned order is the sampler's order: the
// value's bits made monotonic in the high word, the id's complement in the low word (ties go to the
// lower id). Blocks sort spans of a row in shared memory and keep their best k; one block a row then
// merges the spans' keys in rounds, its best k so far sorted with the next batch.
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.cuh"

namespace kiln::cuda {

namespace {

constexpr int kSpanThreads = 512;
constexpr int kSpanKeys = 4096;  // values a span block sorts
constexpr int kMergeThreads = 1024;
constexpr int kMergeKeys = 8192;  // keys a merge round sorts (64 KB)

// The sampler's order as an unsigned one: larger keys are more likely. A NaN ranks as -inf, and -0
// as +0 (the sampler compares floats, for which they are equal).
__device__ __forceinline__ uint64_t candidate_key(float v, int32_t id) {
  if (v != v) v = -INFINITY;
  if (v == 0.0f) v = 0.0f;
  uint32_t bits = __float_as_uint(v);
  bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (uint64_t(bits) << 32) | uint32_t(~uint32_t(id));
}

__device__ __forceinline__ int32_t key_id(uint64_t key) {
  return int32_t(~uint32_t(key));
}

// Sorts n keys (a power of two) of shared memory, largest first, with all threads of the block.
__device__ void sort_descending(uint64_t* keys, int n) {
  for (int size = 2; size <= n; size <<= 1)
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      __syncthreads();
      for (int t = int(threadIdx.x); t < n / 2; t += int(blockDim.x)) {
        const int lo = 2 * t - (t & (stride - 1)), hi = lo + stride;
        const bool descending = (lo & size) == 0;  // the final pass (size == n) is descending throughout
        const uint64_t a = keys[lo], b = keys[hi];
        if ((a < b) == descending) keys[lo] = b, keys[hi] = a;
      }
    }
  __syncthreads();
}

// Block (row, span): the span's kSpanKeys values divided by the row's temperature, sorted, its best
// k keys written to best[row][span]. Past the row's end, keys of 0 (below every value's).
template <typename T>
__global__ void __launch_bounds__(kSpanThreads)
    top_k_span_kernel(Rows<const T> logits, int64_t cols, const float* temperatures, int spans, int k, uint64_t* best) {
  __shared__ uint64_t keys[kSpanKeys];
  wait_for_inputs();
  const int row = int(blockIdx.x) / spans, span = int(blockIdx.x) % spans;
  const T* p = logits.row(row);
  const float t = temperatures[row];
  const int64_t begin = int64_t(span) * kSpanKeys;
  float v[kSpanKeys / kSpanThreads];
#pragma unroll
  for (int j = 0; j < kSpanKeys / kSpanThreads; ++j) {  // all loads issued before any key is formed
    const int64_t c = begin + j * kSpanThreads + threadIdx.x;
    v[j] = c < cols ? to_float(p[c]) : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kSpanKeys / kSpanThreads; ++j) {
    const int i = j * kSpanThreads + int(threadIdx.x);
    const int64_t c = begin + i;
    keys[i] = c < cols ? candidate_key(__fdiv_rn(v[j], t), int32_t(c)) : 0;
  }
  sort_descending(keys, kSpanKeys);
  uint64_t* out = best + (int64_t(row) * spans + span) * k;
  for (int j = int(threadIdx.x); j < k; j += kSpanThreads) out[j] = keys[j];
}

// Block row: the spans' spans·k keys merged in rounds of kMergeKeys (the best k so far first), then
// the best k written as values (the divided logits, read again) and ids.
template <typename T>
__global__ void __launch_bounds__(kMergeThreads)
    top_k_merge_kernel(Rows<const T> logits, const float* temperatures, const uint64_t* best, int candidates, int k,
                       float* values, int32_t* ids) {
  extern __shared__ uint64_t merged[];
  wait_for_inputs();
  const int row = int(blockIdx.x);
  const uint64_t* mine = best + int64_t(row) * candidates;
  for (int i = int(threadIdx.x); i < k; i += kMergeThreads) merged[i] = 0;
  for (int taken = 0; taken < candidates; taken += kMergeKeys - k) {
    for (int i = k + int(threadIdx.x); i < kMergeKeys; i += kMergeThreads) {
      const int c = taken + i - k;
      merged[i] = c < candidates ? mine[c] : 0;
    }
    sort_descending(merged, kMergeKeys);
  }
  const float t = temperatures[row];
  const T* p = logits.row(row);
  for (int j = int(threadIdx.x); j < k; j += kMergeThreads) {
    const int32_t id = key_id(merged[j]);
    const float v = __fdiv_rn(to_float(p[id]), t);
    values[int64_t(row) * k + j] = v == v ? v : -INFINITY;
    ids[int64_t(row) * k + j] = id;
  }
}

}  // namespace

void top_k(const Tensor& logits, const Tensor& temperatures, int k, Tensor& values, Tensor& ids, const Allocate& alloc,
           cudaStream_t stream) {
  const int rows = int(logits.rows());
  if (rows == 0) return;
  const int spans = int(ceil_div(logits.cols(), kSpanKeys)), candidates = spans * k;
  Tensor scratch = alloc(DType::u32, Shape{int64_t(rows) * candidates, 2});
  auto* best = static_cast<uint64_t*>(scratch.data());
  const size_t merge_shared = kMergeKeys * sizeof(uint64_t);
  dispatch_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(top_k_span_kernel<T>, rows * spans, kSpanThreads, 0, stream, rows_of<const T>(logits), logits.cols(),
           temperatures.data_as<float>(), spans, k, best);
    allow_most_dynamic_shared(top_k_merge_kernel<T>);
    launch(top_k_merge_kernel<T>, rows, kMergeThreads, merge_shared, stream, rows_of<const T>(logits),
           temperatures.data_as<float>(), best, candidates, k, values.data_as<float>(), ids.data_as<int32_t>());
  });
}

}  // namespace kiln::cuda
