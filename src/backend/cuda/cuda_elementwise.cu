// CUDA backend: elementwise and row-wise ops (norms, activations, embeddings, argmax).
// Row-wise ops use one warp per row: rows are short (head dims) or few (tokens), and the work is
// memory-bound either way.
#include <algorithm>
#include <cassert>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_residual_norm.cuh"

namespace kiln::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;

template <typename T>
__global__ void fill_kernel(Rows<T> t, int64_t rows, int64_t cols, float value) {
  wait_for_inputs();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  t.row(i / cols)[i % cols] = from_float<T>(value);
}

__global__ void fill_i32_kernel(Rows<int32_t> t, int64_t rows, int64_t cols, int32_t value) {
  wait_for_inputs();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  t.row(i / cols)[i % cols] = value;
}

template <typename S, typename D>
__global__ void convert_kernel(Rows<const S> src, Rows<D> dst, int64_t rows, int64_t cols) {
  wait_for_inputs();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  dst.row(i / cols)[i % cols] = from_float<D>(to_float(src.row(i / cols)[i % cols]));
}

template <typename W, typename O>
__global__ void embed_kernel(const int32_t* ids, Rows<const W> table, int64_t vocab, Rows<O> out, int64_t n,
                             int64_t cols, float scale) {
  wait_for_inputs();
  const int64_t r = blockIdx.x;
  if (r >= n) return;
  int64_t id = ids[r];
  id = id < 0 ? 0 : (id >= vocab ? vocab - 1 : id);  // ids are validated on the host; never read out of range
  const W* src = table.row(id);
  O* dst = out.row(r);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = from_float<O>(to_float(src[c]) * scale);
}

// out = x / rms(x) · (w + offset)  [· silu(z) when gated]
constexpr int kRegisterCols = kNormRegisterCols;  // per lane: rows of up to 256 (head dims) held in registers
template <typename T, bool kGated>
__global__ void rms_norm_kernel(Rows<const T> x, Rows<const T> z, const float* weight, Rows<T> out, int64_t rows,
                                int64_t cols, float eps, float offset) {
  const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (cols <= 32 * kRegisterCols) {
    // the row, its weights and gates in registers, all requested at once (the weights, constants,
    // before the previous kernel has finished); the same sums in the same order as below
    float xv[kRegisterCols], wv[kRegisterCols], zv[kRegisterCols];
#pragma unroll
    for (int i = 0; i < kRegisterCols; ++i) {
      const int64_t c = lane + 32 * i;
      wv[i] = weight && c < cols ? weight[c] + offset : 1.0f;
    }
    wait_for_inputs();
    if (r >= rows) return;
#pragma unroll
    for (int i = 0; i < kRegisterCols; ++i) {
      const int64_t c = lane + 32 * i;
      xv[i] = c < cols ? to_float(x.row(r)[c]) : 0.0f;
      zv[i] = kGated && c < cols ? to_float(z.row(r)[c]) : 0.0f;
    }
    norm_row_registers<T, kGated>(xv, wv, zv, weight != nullptr, out.row(r), cols, eps, lane);
    return;
  }
  wait_for_inputs();
  if (r >= rows) return;
  const T* in = x.row(r);
  float sum = 0;
#pragma unroll 8  // independent loads: keep several in flight
  for (int64_t c = lane; c < cols; c += 32) {
    const float v = to_float(in[c]);
    sum += v * v;
  }
  sum = warp_sum(sum);
  const float inv = rsqrtf(sum / float(cols) + eps);
  T* o = out.row(r);
#pragma unroll 8
  for (int64_t c = lane; c < cols; c += 32) {
    float v = to_float(in[c]) * inv;
    if (weight) v *= weight[c] + offset;
    if constexpr (kGated) v *= silu(to_float(z.row(r)[c]));
    o[c] = from_float<T>(v);
  }
}

// Long rows (hidden-size norms of a few tokens): a block per row, so the row's loads are spread
// over many warps instead of one warp's long serial loop.
template <typename T, bool kGated>
__global__ void rms_norm_row_kernel(Rows<const T> x, Rows<const T> z, const float* weight, Rows<T> out, int64_t cols,
                                    float eps, float offset) {
  wait_for_inputs();
  const int64_t r = blockIdx.x;
  const T* in = x.row(r);
  float sum = 0;
#pragma unroll 8
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = to_float(in[c]);
    sum += v * v;
  }
  sum = block_sum(sum);
  const float inv = rsqrtf(sum / float(cols) + eps);
  T* o = out.row(r);
#pragma unroll 8
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = to_float(in[c]) * inv;
    if (weight) v *= weight[c] + offset;
    if constexpr (kGated) v *= silu(to_float(z.row(r)[c]));
    o[c] = from_float<T>(v);
  }
}

constexpr int64_t kLongRow = 1024;

// Long bf16 rows in 16-byte chunks: residual_norm_row's layout, sum and products for its next
// norms, so a row normed here (a step's first norm, or its final one when the logits want only
// some rows) has the bits the fused update gives it. The weights are requested before the wait.
template <int kChunks>
__global__ void __launch_bounds__(kRowThreads)
    rms_norm_chunks_kernel(Rows<const bf16> x, const float* weight, Rows<bf16> out, int64_t cols, float eps,
                           float offset) {
  __shared__ float scratch[kRowWarps];
  const int64_t chunks = cols / 8, r = blockIdx.x;
  auto held = [&](int j) { return threadIdx.x + int64_t(j) * kRowThreads < chunks; };
  auto chunk = [&](int j) { return threadIdx.x + int64_t(j) * kRowThreads; };
  float w[kChunks][8];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
#pragma unroll
    for (int e = 0; e < 8; ++e) w[j][e] = 1.0f;
    if (held(j) && weight) weights8(weight, chunk(j), offset, w[j]);
  }
  wait_for_inputs();
  const uint4* in = reinterpret_cast<const uint4*>(x.row(r));
  float v[kChunks][8];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) unpack8(held(j) ? in[chunk(j)] : make_uint4(0, 0, 0, 0), v[j]);
  float sum = 0;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    if (!held(j)) continue;
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += v[j][e] * v[j][e];
  }
  const float inv = rsqrtf(row_sum(sum, scratch) / float(cols) + eps);
  uint4* o = reinterpret_cast<uint4*>(out.row(r));
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    if (!held(j)) continue;
    float y[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) y[e] = v[j][e] * inv * w[j][e];
    o[chunk(j)] = pack8(y);
  }
}

bool aligned_rows16(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data()) % 16 == 0 && (t.row_stride() * int64_t(dtype_size(t.dtype()))) % 16 == 0;
}

// A block per row, each thread holding kPerThread columns in registers so that all of a row's
// loads are in flight at once: the block output's norm, the residual update (rounded to T once, as
// stored), then the norm of the stored residual for the next block. Rows of any float type and
// layout; bf16 rows in 16-byte chunks take residual_norm_rows_kernel.
template <typename T, int kPerThread>
__global__ void residual_norm_kernel(ResidualRows<T> a) {
  wait_for_inputs();
  const int64_t r = blockIdx.x, cols = a.cols;
  const T* b = a.block_out.row(r);
  T* res = a.residual.row(r);
  float bv[kPerThread], rv[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int64_t c = threadIdx.x + int64_t(i) * blockDim.x;
    bv[i] = c < cols ? to_float(b[c]) : 0.0f;
    rv[i] = c < cols ? to_float(res[c]) : 0.0f;
  }
  if (a.block_weight) {
    float sum = 0;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) sum += bv[i] * bv[i];
    const float inv = rsqrtf(block_sum(sum) / float(cols) + a.eps);
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int64_t c = threadIdx.x + int64_t(i) * blockDim.x;
      if (c < cols) bv[i] *= inv * (a.block_weight[c] + a.offset);
    }
  }
  float sum = 0;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int64_t c = threadIdx.x + int64_t(i) * blockDim.x;
    if (c >= cols) continue;
    const T stored = from_float<T>((rv[i] + bv[i]) * a.scale);
    res[c] = stored;
    rv[i] = to_float(stored);
    sum += rv[i] * rv[i];
  }
  if (!a.next.out[0].data) return;
  const float inv = rsqrtf(block_sum(sum) / float(cols) + a.eps);
  for (int n = 0; n < kNormOutputs; ++n) {
    if (!a.next.out[n].data) continue;
    T* o = a.next.out[n].row(r);
    const float* w = a.next.weight[n];
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int64_t c = threadIdx.x + int64_t(i) * blockDim.x;
      if (c < cols) o[c] = from_float<T>(rv[i] * inv * (w ? w[c] + a.offset : 1.0f));
    }
  }
}

// bf16 rows in 16-byte chunks (cuda_residual_norm.cuh), the bits of the products' fused epilogue.
template <int kChunks>
__global__ void __launch_bounds__(kRowThreads) residual_norm_rows_kernel(ResidualRows<bf16> a) {
  __shared__ float scratch[kRowWarps];
  wait_for_inputs();
  residual_norm_row<kChunks>(a, blockIdx.x, scratch);
}

// LayerNorm: a block per row, the mean and then the variance of the centred values (two passes
// over the row, as the CPU reference), in f32.
template <typename T>
__global__ void layer_norm_kernel(Rows<const T> x, const float* weight, const float* bias, Rows<T> out, int64_t cols,
                                  float eps) {
  wait_for_inputs();
  const int64_t r = blockIdx.x;
  const T* in = x.row(r);
  float sum = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += to_float(in[c]);
  const float mean = block_sum(sum) / float(cols);
  float squares = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = to_float(in[c]) - mean;
    squares += d * d;
  }
  const float inv = rsqrtf(block_sum(squares) / float(cols) + eps);
  T* o = out.row(r);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = (to_float(in[c]) - mean) * inv;
    if (weight) v *= weight[c];
    if (bias) v += bias[c];
    o[c] = from_float<T>(v);
  }
}

template <typename T, BiasActivation kAct>
__global__ void bias_act_kernel(Rows<const T> x, const float* bias, Rows<T> out, int64_t rows, int64_t cols) {
  wait_for_inputs();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  float v = to_float(x.row(r)[c]) + bias[c];
  if constexpr (kAct == BiasActivation::gelu_tanh) v = gelu_tanh(v);
  if constexpr (kAct == BiasActivation::gelu_erf) v = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  out.row(r)[c] = from_float<T>(v);
}

enum class Binary { add, glu_silu, glu_gelu, sigmoid_mul };

template <typename T, Binary kOp>
__global__ void binary_kernel(Rows<const T> a, Rows<const T> b, Rows<T> out, int64_t rows, int64_t cols, float scale) {
  wait_for_inputs();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  const float x = to_float(a.row(r)[c]), y = to_float(b.row(r)[c]);
  float v;
  if constexpr (kOp == Binary::add) v = (x + y) * scale;
  if constexpr (kOp == Binary::glu_silu) v = silu(x) * y;
  if constexpr (kOp == Binary::glu_gelu) v = gelu_tanh(x) * y;
  if constexpr (kOp == Binary::sigmoid_mul) v = x * sigmoid(y);
  out.row(r)[c] = from_float<T>(v);
}

template <typename T>
__global__ void scale_kernel(Rows<const T> x, Rows<T> out, int64_t rows, int64_t cols, float s) {
  wait_for_inputs();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  out.row(i / cols)[i % cols] = from_float<T>(to_float(x.row(i / cols)[i % cols]) * s);
}

template <typename T>
__global__ void softcap_kernel(Rows<T> x, int64_t rows, int64_t cols, float cap) {
  wait_for_inputs();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  T* p = x.row(i / cols) + i % cols;
  *p = from_float<T>(cap * tanhf(to_float(*p) / cap));
}

template <typename T>
__global__ void clamp_kernel(Rows<const T> x, Rows<T> out, int64_t rows, int64_t cols, float lo, float hi) {
  wait_for_inputs();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  out.row(i / cols)[i % cols] = from_float<T>(fminf(fmaxf(to_float(x.row(i / cols)[i % cols]), lo), hi));
}

template <typename S, typename D>
__global__ void column_affine_kernel(Rows<const S> x, Rows<D> out, int64_t rows, int64_t cols, float scale,
                                     const float* shift, const float* mul) {
  wait_for_inputs();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  float v = to_float(x.row(r)[c]) * scale;
  if (shift) v += shift[c];
  if (mul) v *= mul[c];
  out.row(r)[c] = from_float<D>(v);
}

// A block per output row: its n table rows summed column by column in f32.
template <typename W, typename O>
__global__ void gather_sum_kernel(Rows<const int32_t> ids, int64_t n, Rows<const W> table, int64_t vocab, Rows<O> out,
                                  int64_t cols, float scale) {
  wait_for_inputs();
  const int64_t r = blockIdx.x;
  const int32_t* id = ids.row(r);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      int64_t row = id[j];
      row = row < 0 ? 0 : (row >= vocab ? vocab - 1 : row);  // ids are checked by the caller; never read out of range
      acc += to_float(table.row(row)[c]);
    }
    out.row(r)[c] = from_float<O>(acc * scale);
  }
}

template <typename T, typename G>
__global__ void add_sigmoid_gated_kernel(Rows<T> acc, Rows<const T> x, Rows<const G> gate, int64_t rows, int64_t cols) {
  wait_for_inputs();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  const float s = sigmoid(to_float(gate.row(r)[0]));
  acc.row(r)[c] = from_float<T>(to_float(acc.row(r)[c]) + s * to_float(x.row(r)[c]));
}

// First index of the largest value of each row (ties go to the lower index, as on the CPU; NaNs
// never win). A row is searched by many blocks, each over kArgmaxSpan values, and one warp a row
// then merges their answers: a single block reading a 256K-entry vocabulary alone waits on memory
// for ~0.2 ms, more than a tenth of a small model's decode step.
constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxPerThread = 8;  // loads in flight a thread
constexpr int64_t kArgmaxSpan = int64_t(kArgmaxThreads) * kArgmaxPerThread;

struct ArgmaxBest {
  float value;
  int32_t index;
};

__device__ __forceinline__ void keep_better(float& best, int32_t& best_i, float v, int32_t i) {
  if (v > best || (v == best && i < best_i)) best = v, best_i = i;
}

__device__ __forceinline__ void warp_best(float& best, int32_t& best_i) {
  for (int o = 16; o > 0; o >>= 1)
    keep_better(best, best_i, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, best_i, o));
}

template <typename T>
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_span_kernel(Rows<const T> x, int64_t cols, int spans, ArgmaxBest* partial) {
  wait_for_inputs();
  const int row = int(blockIdx.x) / spans, span = int(blockIdx.x) % spans;
  const T* p = x.row(row);
  const int64_t begin = span * kArgmaxSpan;
  float v[kArgmaxPerThread];
#pragma unroll
  for (int j = 0; j < kArgmaxPerThread; ++j) {  // all loads issued before any comparison
    const int64_t c = begin + j * kArgmaxThreads + threadIdx.x;
    v[j] = c < cols ? to_float(p[c]) : -INFINITY;
  }
  float best = -INFINITY;
  int32_t best_i = 0;  // a row of -inf (or NaN) answers 0, as the CPU does
#pragma unroll
  for (int j = 0; j < kArgmaxPerThread; ++j)  // increasing indices: a strict > keeps the first
    if (v[j] > best) best = v[j], best_i = int32_t(begin + j * kArgmaxThreads + threadIdx.x);
  warp_best(best, best_i);
  __shared__ ArgmaxBest warps[kArgmaxThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warps[warp] = {best, best_i};
  __syncthreads();
  if (warp != 0) return;
  best = lane < kArgmaxThreads / 32 ? warps[lane].value : -INFINITY;
  best_i = lane < kArgmaxThreads / 32 ? warps[lane].index : 0;
  warp_best(best, best_i);
  if (lane == 0) partial[blockIdx.x] = {best, best_i};
}

// One warp a row: the row's spans' answers merged.
__global__ void argmax_merge_kernel(const ArgmaxBest* partial, int spans, int rows, int32_t* out) {
  wait_for_inputs();
  const int row = int(blockIdx.x) * (blockDim.x / 32) + int(threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;
  float best = -INFINITY;
  int32_t best_i = 0;
  for (int s = lane; s < spans; s += 32)
    keep_better(best, best_i, partial[row * spans + s].value, partial[row * spans + s].index);
  warp_best(best, best_i);
  if (lane == 0) out[row] = best_i;
}

int grid_for(int64_t n, int block = 256) {
  return ceil_div(n, block);
}

}  // namespace

void fill(Tensor& t, float value, cudaStream_t stream) {
  const int64_t n = t.rows() * t.cols();
  if (n == 0) return;
  if (t.dtype() == DType::i32) {
    launch(fill_i32_kernel, grid_for(n), 256, 0, stream, rows_of<int32_t>(t), t.rows(), t.cols(), int32_t(value));
    return;
  }
  dispatch_float(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(fill_kernel<T>, grid_for(n), 256, 0, stream, rows_of<T>(t), t.rows(), t.cols(), value);
  });
}

void convert(const Tensor& src, Tensor& dst, cudaStream_t stream) {
  const int64_t n = src.rows() * src.cols();
  if (n == 0) return;
  dispatch_float(src.dtype(), [&](auto s_tag) {
    using S = decltype(s_tag);
    dispatch_float(dst.dtype(), [&](auto d_tag) {
      using D = decltype(d_tag);
      launch(convert_kernel<S, D>, grid_for(n), 256, 0, stream, rows_of<const S>(src), rows_of<D>(dst), src.rows(),
             src.cols());
    });
  });
}

void embed(const Tensor& ids, const Tensor& table, float scale, Tensor& out, cudaStream_t stream) {
  const int64_t n = ids.numel();
  if (n == 0) return;
  dispatch_float(table.dtype(), [&](auto w_tag) {
    using W = decltype(w_tag);
    dispatch_float(out.dtype(), [&](auto o_tag) {
      using O = decltype(o_tag);
      launch(embed_kernel<W, O>, int(n), 256, 0, stream, ids.data_as<int32_t>(), rows_of<const W>(table), table.dim(0),
             rows_of<O>(out), n, table.cols(), scale);
    });
  });
}

void rms_norm(const Tensor& x, const Tensor& weight, float eps, float weight_offset, Tensor& out, cudaStream_t stream) {
  assert(!weight.defined() || weight.dtype() == DType::f32);
  const int64_t rows = x.rows();
  if (rows == 0) return;
  const float* w = weight.defined() ? weight.data_as<float>() : nullptr;
  const int64_t cols = x.cols();
  if (cols >= kLongRow && cols % 8 == 0 && cols <= kMaxRowNormCols && x.dtype() == DType::bf16 &&
      out.dtype() == DType::bf16 && aligned_rows16(x) && aligned_rows16(out) &&
      (!w || reinterpret_cast<uintptr_t>(w) % 16 == 0)) {
    dispatch_row_chunks(cols, [&](auto chunks) {
      launch(rms_norm_chunks_kernel<decltype(chunks)::value>, int(rows), kRowThreads, 0, stream, rows_of<const bf16>(x),
             w, rows_of<bf16>(out), cols, eps, weight_offset);
    });
    return;
  }
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (x.cols() >= kLongRow) {
      launch(rms_norm_row_kernel<T, false>, int(rows), 256, 0, stream, rows_of<const T>(x), Rows<const T>{nullptr, 0},
             w, rows_of<T>(out), x.cols(), eps, weight_offset);
      return;
    }
    launch(rms_norm_kernel<T, false>, ceil_div(rows, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream,
           rows_of<const T>(x), Rows<const T>{nullptr, 0}, w, rows_of<T>(out), rows, x.cols(), eps, weight_offset);
  });
}

void residual_norm(const ResidualNormArgs& args, cudaStream_t stream) {
  const int64_t rows = args.residual.rows(), cols = args.residual.cols();
  if (rows == 0) return;
  if (row_norm_vectorizable(args)) {
    dispatch_row_chunks(cols, [&](auto chunks) {
      launch(residual_norm_rows_kernel<decltype(chunks)::value>, int(rows), kRowThreads, 0, stream,
             residual_rows<bf16>(args));
    });
    return;
  }
  dispatch_float(args.residual.dtype(), [&](auto tag) {
    using T = decltype(tag);
    auto run = [&](auto per_thread) {
      constexpr int kPer = decltype(per_thread)::value;
      const int threads = int(std::max<int64_t>(32, (ceil_div(cols, kPer) + 31) / 32 * 32));
      launch(residual_norm_kernel<T, kPer>, int(rows), threads, 0, stream, residual_rows<T>(args));
    };
    // the fewest columns a thread that fit the row in 1024 threads (hidden sizes reach 8192)
    if (cols <= 1024)
      run(std::integral_constant<int, 1>{});
    else if (cols <= 2048)
      run(std::integral_constant<int, 2>{});
    else if (cols <= 4096)
      run(std::integral_constant<int, 4>{});
    else if (cols <= 8192)
      run(std::integral_constant<int, 8>{});
    else
      run(std::integral_constant<int, 16>{});
  });
}

void rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, float eps, Tensor& out,
                    cudaStream_t stream) {
  const int64_t rows = x.rows();
  if (rows == 0) return;
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(rms_norm_kernel<T, true>, ceil_div(rows, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream,
           rows_of<const T>(x), rows_of<const T>(z), weight.data_as<float>(), rows_of<T>(out), rows, x.cols(), eps,
           0.0f);
  });
}

namespace {
template <Binary kOp>
void binary(const Tensor& a, const Tensor& b, Tensor& out, float scale, cudaStream_t stream) {
  const int64_t n = a.rows() * a.cols();
  if (n == 0) return;
  dispatch_float(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(binary_kernel<T, kOp>, grid_for(n), 256, 0, stream, rows_of<const T>(a), rows_of<const T>(b),
           rows_of<T>(out), a.rows(), a.cols(), scale);
  });
}
}  // namespace

void add(const Tensor& a, const Tensor& b, float scale, Tensor& out, cudaStream_t stream) {
  binary<Binary::add>(a, b, out, scale, stream);
}

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out,
                cudaStream_t stream) {
  assert((!weight.defined() || weight.dtype() == DType::f32) && (!bias.defined() || bias.dtype() == DType::f32));
  const int64_t rows = x.rows();
  if (rows == 0) return;
  const int threads = int(std::min<int64_t>(256, (x.cols() + 31) / 32 * 32));
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(layer_norm_kernel<T>, int(rows), threads, 0, stream, rows_of<const T>(x),
           weight.defined() ? weight.data_as<float>() : nullptr, bias.defined() ? bias.data_as<float>() : nullptr,
           rows_of<T>(out), x.cols(), eps);
  });
}

void bias_act(const Tensor& x, const Tensor& bias, BiasActivation act, Tensor& out, cudaStream_t stream) {
  assert(bias.dtype() == DType::f32 && bias.numel() == x.cols());
  const int64_t n = x.rows() * x.cols();
  if (n == 0) return;
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    auto run = [&](auto kernel) {
      launch(kernel, grid_for(n), 256, 0, stream, rows_of<const T>(x), bias.data_as<float>(), rows_of<T>(out), x.rows(),
             x.cols());
    };
    if (act == BiasActivation::gelu_tanh)
      run(bias_act_kernel<T, BiasActivation::gelu_tanh>);
    else if (act == BiasActivation::gelu_erf)
      run(bias_act_kernel<T, BiasActivation::gelu_erf>);
    else
      run(bias_act_kernel<T, BiasActivation::none>);
  });
}

void glu(const Tensor& gate, const Tensor& up, Activation act, Tensor& out, cudaStream_t stream) {
  if (act == Activation::silu)
    binary<Binary::glu_silu>(gate, up, out, 1.0f, stream);
  else
    binary<Binary::glu_gelu>(gate, up, out, 1.0f, stream);
}

void sigmoid_mul(const Tensor& x, const Tensor& gate, Tensor& out, cudaStream_t stream) {
  binary<Binary::sigmoid_mul>(x, gate, out, 1.0f, stream);
}

void scale(const Tensor& x, float s, Tensor& out, cudaStream_t stream) {
  const int64_t n = x.rows() * x.cols();
  if (n == 0) return;
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(scale_kernel<T>, grid_for(n), 256, 0, stream, rows_of<const T>(x), rows_of<T>(out), x.rows(), x.cols(), s);
  });
}

void add_sigmoid_gated(Tensor& acc, const Tensor& x, const Tensor& gate, cudaStream_t stream) {
  const int64_t n = x.rows() * x.cols();
  if (n == 0) return;
  dispatch_float(acc.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_float(gate.dtype(), [&](auto g_tag) {
      using G = decltype(g_tag);
      launch(add_sigmoid_gated_kernel<T, G>, grid_for(n), 256, 0, stream, rows_of<T>(acc), rows_of<const T>(x),
             rows_of<const G>(gate), x.rows(), x.cols());
    });
  });
}

void softcap(Tensor& x, float cap, cudaStream_t stream) {
  const int64_t n = x.rows() * x.cols();
  if (n == 0) return;
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(softcap_kernel<T>, grid_for(n), 256, 0, stream, rows_of<T>(x), x.rows(), x.cols(), cap);
  });
}

void clamp(const Tensor& x, float lo, float hi, Tensor& out, cudaStream_t stream) {
  const int64_t n = x.rows() * x.cols();
  if (n == 0) return;
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(clamp_kernel<T>, grid_for(n), 256, 0, stream, rows_of<const T>(x), rows_of<T>(out), x.rows(), x.cols(), lo,
           hi);
  });
}

void column_affine(const Tensor& x, float scale, const Tensor& shift, const Tensor& mul, Tensor& out,
                   cudaStream_t stream) {
  assert((!shift.defined() || shift.dtype() == DType::f32) && (!mul.defined() || mul.dtype() == DType::f32));
  const int64_t n = x.rows() * x.cols();
  if (n == 0) return;
  dispatch_float(x.dtype(), [&](auto s_tag) {
    using S = decltype(s_tag);
    dispatch_float(out.dtype(), [&](auto d_tag) {
      using D = decltype(d_tag);
      launch(column_affine_kernel<S, D>, grid_for(n), 256, 0, stream, rows_of<const S>(x), rows_of<D>(out), x.rows(),
             x.cols(), scale, shift.defined() ? shift.data_as<float>() : nullptr,
             mul.defined() ? mul.data_as<float>() : nullptr);
    });
  });
}

void gather_sum(const Tensor& ids, const Tensor& table, float scale, Tensor& out, cudaStream_t stream) {
  assert(ids.dtype() == DType::i32 && !table.quantized());
  if (ids.rows() == 0) return;
  dispatch_float(table.dtype(), [&](auto w_tag) {
    using W = decltype(w_tag);
    dispatch_float(out.dtype(), [&](auto o_tag) {
      using O = decltype(o_tag);
      launch(gather_sum_kernel<W, O>, int(ids.rows()), 256, 0, stream, rows_of<const int32_t>(ids), ids.cols(),
             rows_of<const W>(table), table.rows(), rows_of<O>(out), table.cols(), scale);
    });
  });
}

void argmax(const Tensor& x, Tensor& out, const Allocate& alloc, cudaStream_t stream) {
  if (x.rows() == 0) return;
  const int rows = int(x.rows()), spans = int(std::max<int64_t>(1, ceil_div(x.cols(), kArgmaxSpan)));
  static_assert(sizeof(ArgmaxBest) == 8);
  Tensor partial = alloc(DType::u32, Shape{int64_t(rows) * spans, 2});
  auto* best = static_cast<ArgmaxBest*>(partial.data());
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(argmax_span_kernel<T>, rows * spans, kArgmaxThreads, 0, stream, rows_of<const T>(x), x.cols(), spans, best);
  });
  constexpr int kRowsPerBlock = 8;
  launch(argmax_merge_kernel, ceil_div(rows, kRowsPerBlock), 32 * kRowsPerBlock, 0, stream, best, spans, rows,
         out.data_as<int32_t>());
}

}  // namespace kiln::cuda
