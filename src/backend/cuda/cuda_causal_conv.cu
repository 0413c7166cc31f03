// CUDA backend: the causal conv1d of Gated DeltaNet, over each sequence's window of the last
// kernel - 1 inputs (its state). Decode is a thread per channel; prefill cuts the tokens into runs
// so that a long prompt spreads over the GPU.
#include <algorithm>
#include <cassert>
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_state_table.cuh"

namespace kiln::cuda {

namespace {

constexpr int kMaxSeqs = kMaxDeltaSeqs;

// The window sits right-aligned in fixed-size arrays (slot kMaxConvKernel - 1 the newest input),
// so every index is a compile-time constant and the window stays in registers for any kernel size;
// slots left of the kernel are skipped, never multiplied.
template <typename T>
__global__ void causal_conv_kernel(StateTable table, Rows<const T> x, const float* weight, Rows<T> out,
                                   int64_t channels, int kernel, bool apply_silu) {
  wait_for_inputs();
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const StateSeq& s = table.seq[blockIdx.y];
  T* state = static_cast<T*>(s.state);
  const int first = kMaxConvKernel - kernel;             // first slot in use
  float w[kMaxConvKernel], history[kMaxConvKernel - 1];  // history: the last kernel-1 inputs
#pragma unroll
  for (int i = 0; i < kMaxConvKernel; ++i) w[i] = i >= first ? weight[c * kernel + (i - first)] : 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxConvKernel - 1; ++i)
    history[i] = i >= first ? to_float(state[(i - first) * channels + c]) : 0.0f;
  for (int64_t t = 0; t < s.n_rows; ++t) {
    const float acc = causal_conv_step(w, history, to_float(x.row(s.row_begin + t)[c]), first);
    out.row(s.row_begin + t)[c] = from_float<T>(apply_silu ? silu(acc) : acc);
  }
#pragma unroll
  for (int i = 0; i < kMaxConvKernel - 1; ++i)
    if (i >= first) state[(i - first) * channels + c] = from_float<T>(history[i]);
}

// Prefill: tokens are cut into runs of kConvRun, one thread per (channel, run, sequence), so a long
// prompt spreads over the GPU instead of walking its tokens in one thread per channel. A run's
// history is the kernel-1 inputs before it: from x, or from the old state for a sequence's first
// run. That run's thread is the only reader of the old state, so it alone writes the new one (from
// its own window when it is also the last run, else from the sequence's last kernel-1 rows of x).
// The arithmetic per output is causal_conv_kernel's, in the same order.
constexpr int kConvRun = 32;
static_assert(kConvRun >= kMaxConvKernel - 1, "a later run's history lies within its sequence");

template <typename T>
__global__ void causal_conv_runs_kernel(StateTable table, Rows<const T> x, const float* weight, Rows<T> out,
                                        int64_t channels, int kernel, bool apply_silu) {
  wait_for_inputs();
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const StateSeq& s = table.seq[blockIdx.z];
  const int64_t t0 = int64_t(blockIdx.y) * kConvRun;
  if (c >= channels || t0 >= s.n_rows) return;
  const int len = s.n_rows - t0 < kConvRun ? int(s.n_rows - t0) : kConvRun;
  const int64_t row0 = s.row_begin + t0;
  T* state = static_cast<T*>(s.state);
  const int first = kMaxConvKernel - kernel;
  float w[kMaxConvKernel], history[kMaxConvKernel - 1], xs[kConvRun];
  // every load of the run is issued before any arithmetic, so they are in flight together
#pragma unroll
  for (int t = 0; t < kConvRun; ++t) xs[t] = t < len ? to_float(x.row(row0 + t)[c]) : 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxConvKernel; ++i) w[i] = i >= first ? weight[c * kernel + (i - first)] : 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxConvKernel - 1; ++i) {
    if (i < first)
      history[i] = 0.0f;
    else if (t0 == 0)
      history[i] = to_float(state[(i - first) * channels + c]);
    else
      history[i] = to_float(x.row(row0 - (kMaxConvKernel - 1) + i)[c]);
  }
#pragma unroll
  for (int t = 0; t < kConvRun; ++t) {
    if (t < len) {
      const float acc = causal_conv_step(w, history, xs[t], first);
      out.row(row0 + t)[c] = from_float<T>(apply_silu ? silu(acc) : acc);
    }
  }
  if (t0 != 0) return;
  const bool last_run = len == s.n_rows;
#pragma unroll
  for (int i = 0; i < kMaxConvKernel - 1; ++i)
    if (i >= first)
      state[(i - first) * channels + c] =
          last_run ? from_float<T>(history[i]) : x.row(s.row_begin + s.n_rows - (kMaxConvKernel - 1) + i)[c];
}

}  // namespace

void causal_conv1d(const CausalConvArgs& args, cudaStream_t stream) {
  const int64_t channels = args.x.cols();
  const int kernel = int(args.weight.numel() / channels);
  assert(kernel >= 1 && kernel <= kMaxConvKernel);
  for (size_t begin = 0; begin < args.seqs.size(); begin += kMaxSeqs) {
    StateTable table{};
    table.n = int(std::min<size_t>(kMaxSeqs, args.seqs.size() - begin));
    for (int i = 0; i < table.n; ++i) {
      const SeqRows& s = args.seqs[begin + size_t(i)];
      table.seq[i] = StateSeq{s.row_begin, s.n_rows, args.states[begin + size_t(i)].data()};
    }
    int64_t max_rows = 0;
    for (int i = 0; i < table.n; ++i) max_rows = std::max(max_rows, table.seq[i].n_rows);
    // a thread per channel; blocks of 64 so that one decode token (8192 channels on Qwen 3.5 4B)
    // spreads over 128 SMs rather than 64
    constexpr int kThreads = 64;
    const unsigned channel_blocks = unsigned(ceil_div(channels, kThreads));
    // up to one run the two kernels do the same work; past it the runs kernel splits the tokens
    const bool runs = max_rows > kConvRun;
    assert(ceil_div(max_rows, kConvRun) <= 65535);
    assert(!runs || args.out.data() != args.x.data());  // runs read inputs that others' outputs would overwrite
    dispatch_float(args.x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if (runs)
        launch(causal_conv_runs_kernel<T>,
               dim3(channel_blocks, unsigned(ceil_div(max_rows, kConvRun)), unsigned(table.n)), kThreads, 0, stream,
               table, rows_of<const T>(args.x), args.weight.data_as<float>(), rows_of<T>(args.out), channels, kernel,
               args.silu);
      else
        launch(causal_conv_kernel<T>, dim3(channel_blocks, unsigned(table.n)), kThreads, 0, stream, table,
               rows_of<const T>(args.x), args.weight.data_as<float>(), rows_of<T>(args.out), channels, kernel,
               args.silu);
    });
  }
}

}  // namespace kiln::cuda
