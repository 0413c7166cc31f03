// What one dependent step of a decode costs on this GPU, apart from any work: a kernel boundary in
// a CUDA graph with programmatic dependent launch (how kiln's decode graph chains its kernels),
// against a grid-wide barrier inside one persistent kernel (what a persistent decode kernel would
// pay instead). Each step every thread reads a value another block wrote in the step before and
// writes its own, so each step truly depends on the one before. A third form signals block to block:
// each block waits only for the block whose value it reads.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a tools/gpu/sync-cost.cu -o sync-cost
//   ./sync-cost            (prints µs a step for a few grid shapes)
#include <cuda_runtime.h>

#include <cstdio>

#define CHECK(call)                                                                             \
  do {                                                                                          \
    const cudaError_t e = (call);                                                               \
    if (e != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e)); \
      return 1;                                                                                 \
    }                                                                                           \
  } while (0)

// one step: out[i] from in[] at an index another block holds
__device__ __forceinline__ void step_work(const float* in, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __ldcg(in + (i + blockDim.x + 1) % n) * 0.5f + 1.0f;  // through L2: another SM wrote it
}

__global__ void step_kernel(const float* in, float* out, int n) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  step_work(in, out, n);
  asm volatile("griddepcontrol.launch_dependents;");
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Sense by generation: a block reads the generation, arrives, and the last to arrive starts the
// next generation; the others wait for it to change.
__device__ __forceinline__ void grid_barrier(unsigned* count, unsigned* generation) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned g = load_acquire(generation);
    __threadfence();
    if (atomicAdd(count, 1u) == gridDim.x - 1) {
      *count = 0;
      __threadfence();
      atomicAdd(generation, 1u);
    } else {
      while (load_acquire(generation) == g) {
      }
    }
  }
  __syncthreads();
}

__device__ __forceinline__ void store_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// The same steps with a signal from the one block each block reads (the next one) instead of a
// barrier over all: a block's flag holds the steps it has finished.
__global__ void signalled_kernel(float* a, float* b, int n, int steps, unsigned* done_steps) {
  const unsigned* neighbour = done_steps + (blockIdx.x + 1) % gridDim.x;
  for (int s = 0; s < steps; ++s) {
    if (threadIdx.x == 0)
      while (load_acquire(neighbour) < unsigned(s)) {
      }
    __syncthreads();
    step_work(s % 2 ? b : a, s % 2 ? a : b, n);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      store_release(done_steps + blockIdx.x, unsigned(s + 1));
    }
  }
}

__global__ void persistent_kernel(float* a, float* b, int n, int steps, unsigned* count, unsigned* generation) {
  for (int s = 0; s < steps; ++s) {
    step_work(s % 2 ? b : a, s % 2 ? a : b, n);
    grid_barrier(count, generation);
  }
}

bool ok(cudaError_t e) {
  if (e != cudaSuccess) std::fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(e));
  return e == cudaSuccess;
}

// The fastest of four timed runs of `launch` after one that warms up, in ms, with `prepare` run
// before each outside the timing; -1 on a CUDA error (reported).
template <typename Prepare, typename Launch>
float best_ms(cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop, Prepare prepare, Launch launch) {
  float best = 1e9f;
  for (int rep = 0; rep < 5; ++rep) {
    float ms = 0;
    if (!ok(prepare()) || !ok(cudaEventRecord(start, stream)) || !ok(launch()) || !ok(cudaEventRecord(stop, stream)) ||
        !ok(cudaEventSynchronize(stop)) || !ok(cudaEventElapsedTime(&ms, start, stop)))
      return -1;
    if (rep > 0 && ms < best) best = ms;
  }
  return best;
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr int kSteps = 1000;
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  unsigned* sync = nullptr;
  CHECK(cudaMalloc(&sync, 2 * sizeof(unsigned)));
  CHECK(cudaMemset(sync, 0, 2 * sizeof(unsigned)));
  unsigned* flags = nullptr;
  CHECK(cudaMalloc(&flags, size_t(sms) * sizeof(unsigned)));
  std::printf("%-28s %10s %10s %10s\n", "grid", "graph+PDL", "barrier", "signals");
  for (int threads : {128, 512})
    for (int blocks : {sms / 2, sms}) {
      const int n = blocks * threads;
      float *a = nullptr, *b = nullptr;
      CHECK(cudaMalloc(&a, n * sizeof(float)));
      CHECK(cudaMalloc(&b, n * sizeof(float)));
      CHECK(cudaMemset(a, 0, n * sizeof(float)));
      CHECK(cudaMemset(b, 0, n * sizeof(float)));

      // kSteps dependent kernels in one graph, each launched early (programmatic serialization)
      cudaGraph_t graph;
      CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      for (int s = 0; s < kSteps; ++s) {
        cudaLaunchConfig_t config{};
        config.gridDim = dim3(blocks);
        config.blockDim = dim3(threads);
        config.stream = stream;
        cudaLaunchAttribute attribute{};
        attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attribute.val.programmaticStreamSerializationAllowed = 1;
        config.attrs = &attribute;
        config.numAttrs = 1;
        CHECK(cudaLaunchKernelEx(&config, step_kernel, static_cast<const float*>(s % 2 ? b : a), s % 2 ? a : b, n));
      }
      CHECK(cudaStreamEndCapture(stream, &graph));
      cudaGraphExec_t exec;
      CHECK(cudaGraphInstantiate(&exec, graph, 0));
      const auto none = [] { return cudaSuccess; };
      const float graph_ms = best_ms(stream, start, stop, none, [&] { return cudaGraphLaunch(exec, stream); });
      const float barrier_ms = best_ms(stream, start, stop, none, [&] {
        persistent_kernel<<<blocks, threads, 0, stream>>>(a, b, n, kSteps, sync, sync + 1);
        return cudaGetLastError();
      });
      const float signal_ms = best_ms(
          stream, start, stop, [&] { return cudaMemsetAsync(flags, 0, size_t(sms) * sizeof(unsigned), stream); },
          [&] {
            signalled_kernel<<<blocks, threads, 0, stream>>>(a, b, n, kSteps, flags);
            return cudaGetLastError();
          });
      if (graph_ms < 0 || barrier_ms < 0 || signal_ms < 0) return 1;
      char name[64];
      std::snprintf(name, sizeof name, "%d blocks x %d threads", blocks, threads);
      std::printf("%-28s %8.2f us %8.2f us %8.2f us\n", name, 1000.0f * graph_ms / kSteps,
                  1000.0f * barrier_ms / kSteps, 1000.0f * signal_ms / kSteps);
      CHECK(cudaGraphExecDestroy(exec));
      CHECK(cudaGraphDestroy(graph));
      CHECK(cudaFree(a));
      CHECK(cudaFree(b));
    }
  return 0;
}
