// A prototype of a persistent 4-bit decode step: does one kernel that streams every layer's packed
// weights into shared memory ahead of their inputs reach the bandwidth that a kernel per op cannot?
// (Findings in docs/performance.md, "A persistent decode step, prototyped"; the device side is in
// persistent-decode.cuh.)
//
// One block an SM runs the whole step. Its last warp is a producer: one thread bulk-copies
// (cp.async.bulk, completing on an mbarrier) the SM's tiles of every product of the step, in step
// order, into a ring of shared-memory slots, held back only by free slots, never by inputs. The
// weights are stored tile-major (a tile of 16·rows-a-warp rows × up to `slice` columns, its codes,
// scales and biases in one contiguous piece, a row block's tiles one after another), so a tile is
// one copy. The other 16 warps walk the same phases: a product phase waits until the phase it
// reads has been finished by every SM (a count in global memory, release/acquire), forms its input
// in shared memory (norms, the residual, a merge of attention spans: each SM redoes that small
// work instead of a kernel doing it once), then each warp multiplies its rows of every tile as it
// lands (int16 inputs against 4-bit codes with dp2a, as the product kernels do) and releases the
// slot with its own arrival, so warps never wait for each other inside a product. A product with
// few row blocks splits its columns over SMs: partial sums, added in split order by the row
// block's last split to finish. A small-op phase (a delta-rule step, attention over a span) is
// spread over the SMs as tasks. Descriptors, norm weights, recurrent state and cached keys and
// values are requested before a phase's wait. The same kernel run one phase a launch (a CUDA graph
// of programmatically serialized launches) is the kernel-per-op form of the same work.
//
// Layers shaped like Qwen 3.5 4B's Gated DeltaNet layers and Gemma 4 12B's layers, MLX 4-bit g64
// weights (random), each layer's own weights so that none stay in L2; the small ops read and write
// state of the real sizes with arithmetic of the real kind, not the models' exact functions. The
// products of layer 0 and the head are checked against a plain GEMV over the same inputs.
//   nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -I src [-DPD_ROWS_PER_WARP=4] \
//        tools/gpu/persistent-decode.cu -o persistent-decode
//   ./persistent-decode qwen4b|gemma12b [layers] [slots] [slice columns] [mode] [marks]
//   mode 0: as described; 1: tiles copied, not multiplied; 2: tiles multiplied, not copied.
//   marks 1: each block notes when its phases' inputs were ready, its input stage ended and its
//   phase ended (%globaltimer), summarised for a middle layer.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "persistent-decode.cuh"

#define CHECK(call)                                                                             \
  do {                                                                                          \
    const cudaError_t e = (call);                                                               \
    if (e != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

// ---- the step's buffers ----
__device__ __forceinline__ uint32_t hash(uint32_t x) {
  x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
  return x;
}
// One block a tile: random codes, scales in [0.5, 1.5]·scale, biases in [-7.5, -7]·scale.
__global__ void fill_tiles(Phase p, uint32_t seed, float scale) {
  const int b = blockIdx.x / p.slices, s = blockIdx.x % p.slices, cols = slice_cols(p, s);
  unsigned char* tile = const_cast<unsigned char*>(p.tiles) + tile_offset(p, b, s);
  const int words = kTileRows * cols / 8, groups = kTileRows * (cols / kGroup);
  uint32_t* codes = reinterpret_cast<uint32_t*>(tile);
  bf16* sb = reinterpret_cast<bf16*>(tile + kTileRows * cols / 2);
  const uint32_t base = seed * 0x9e3779b9u + blockIdx.x * 0x85ebca6bu;
  for (int i = threadIdx.x; i < words; i += blockDim.x) codes[i] = hash(base + i);
  for (int i = threadIdx.x; i < groups; i += blockDim.x) {
    const float u = float(hash(base ^ (0x1234567u + i)) >> 8) * (1.0f / 16777216.0f);
    const float v = float(hash(base ^ (0x7654321u + i)) >> 8) * (1.0f / 16777216.0f);
    sb[i] = __float2bfloat16((0.5f + u) * scale);
    sb[groups + i] = __float2bfloat16((-7.5f + 0.5f * v) * scale);
  }
}
__global__ void fill_bf16(bf16* p, size_t n, float lo, float hi, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(lo + (hi - lo) * float(hash(uint32_t(i) ^ seed * 0x9e3779b9u) >> 8) * (1.0f / 16777216.0f));
}
__global__ void fill_f32(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) p[i] = v;
}
// Reads every byte of [p, p + 16n) once: the plain read rate of the step's weights.
__global__ void read_all(const uint4* p, size_t n, unsigned* sink) {
  uint32_t x = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x12345678u) *sink = x;
}

struct Arena {
  unsigned char* base = nullptr;
  size_t used = 0, size = 0;
  void* take(size_t bytes) {
    bytes = (bytes + 255) / 256 * 256;
    if (used + bytes > size) {
      std::fprintf(stderr, "arena too small\n");
      std::exit(1);
    }
    void* p = base + used;
    used += bytes;
    return p;
  }
};

template <typename T>
T* device_alloc(size_t n) {
  T* p = nullptr;
  CHECK(cudaMalloc(&p, n * sizeof(T)));
  CHECK(cudaMemset(p, 0, n * sizeof(T)));
  return p;
}
bf16* random_bf16(size_t n, float lo, float hi, uint32_t seed) {
  bf16* p = device_alloc<bf16>(n);
  fill_bf16<<<256, 256>>>(p, n, lo, hi, seed);
  return p;
}
float* ones(size_t n) {
  float* p = device_alloc<float>(n);
  fill_f32<<<256, 256>>>(p, n, 1.0f);
  return p;
}

struct Builder {
  Arena weights;
  int sms = 0, slice = 1024;
  std::vector<Phase> phases;

  // A product's tiles and outputs; its columns split over SMs when that evens the SMs' tiles
  // (never when a small op reads its outputs: one_split).
  Phase product(int kind, int n, int k, uint32_t seed, bool one_split = false) {
    Phase p;
    p.kind = kind, p.n = n, p.k = k, p.slice = std::min(k, slice);
    p.slices = (k + p.slice - 1) / p.slice;
    const int rows_a_block = kind == kGlu ? kTileRows / 2 : kTileRows;
    if (n % rows_a_block || k % kGroup || p.slice % kGroup)
      std::fprintf(stderr, "shape %d x %d does not tile\n", n, k), std::exit(1);
    p.blocks = n / rows_a_block;
    long best = -1;
    for (int splits = 1; splits <= (one_split ? 1 : p.slices); ++splits) {
      const int per = (p.slices + splits - 1) / splits;
      // a split unit also pays its partial sums' barrier and count (about a tile's time)
      const long rounds = (p.blocks * splits + sms - 1) / sms;
      const long cost = rounds * per + (splits > 1 ? rounds : 0);
      if (best < 0 || cost < best) best = cost, p.splits = splits, p.per_split = per;
    }
    p.splits = (p.slices + p.per_split - 1) / p.per_split;
    p.units = p.blocks * p.splits;
    p.tiles = static_cast<unsigned char*>(weights.take(size_t(p.blocks) * tile_bytes(k)));
    fill_tiles<<<p.blocks * p.slices, 256>>>(p, seed, 2.0f / std::sqrt(float(k)) / 7.5f);
    CHECK(cudaGetLastError());
    p.out = device_alloc<bf16>(n);
    if (p.splits > 1) {
      p.out_parts = device_alloc<float>(size_t(p.splits) * (kind == kGlu ? 2 * n : n));
      p.block_count = device_alloc<unsigned>(p.blocks);
    }
    return p;
  }
  static Source source_of(const Phase& p) {
    Source s;
    s.bf = p.out, s.n = p.n;
    return s;
  }
  int add(Phase p) {
    phases.push_back(p);
    return int(phases.size()) - 1;
  }
};

// The input stage that adds `branch` to the residual `res_in` (kResAdd; kResNorm: its norm), writes
// the sum to `res_out` and normalises it; the phase reads the phase added last.
void residual_input(const Builder& m, Phase& p, int input, const Source& branch, const bf16* res_in, bf16* res_out,
                    const float* norm) {
  p.input = input, p.in = branch, p.res_in = res_in, p.res_out = res_out, p.norm_w = norm;
  if (input == kResNorm) p.branch_w = norm;
  p.dep = int(m.phases.size()) - 1;
}

// A layer's GLU (its input the residual after the attention or mixer branch `out`, into h_mid) and
// down-projection; returns the down-projection's outputs, the next branch.
Source add_mlp(Builder& m, int input, const Phase& out, const bf16* h, bf16* h_mid, const float* norm, int H, int I,
               uint32_t seed) {
  Phase glu = m.product(kGlu, I, H, seed + 20);
  residual_input(m, glu, input, Builder::source_of(out), h, h_mid, norm);
  m.add(glu);
  Phase down = m.product(kProduct, H, I, seed + 30);
  down.input = kPlain, down.in = Builder::source_of(glu), down.dep = int(m.phases.size()) - 1;
  m.add(down);
  return Builder::source_of(down);
}

void add_head(Builder& m, int input, const Source& branch, const bf16* res, const float* norm, int vocab, int H) {
  Phase head = m.product(kProduct, vocab, H, 99);
  residual_input(m, head, input, branch, res, device_alloc<bf16>(H), norm);
  m.add(head);
}

// Qwen 3.5 4B: hidden 2560, 32 layers taken as Gated DeltaNet layers (16 key heads and 32 value
// heads of 128; in-projection q, k, v, z, b, a = 12352 rows), GLU 9216, vocabulary 248320.
void qwen4b(Builder& m, int layers) {
  const int H = 2560, I = 9216;
  const float* norm = ones(I);
  bf16* res = random_bf16(H, -1, 1, 7);
  Source branch;
  branch.bf = device_alloc<bf16>(H), branch.n = H;  // zero: layer 0's stage gives back the embedding
  for (int l = 0; l < layers; ++l) {
    const uint32_t seed = 1000 * (l + 1);
    bf16* h = device_alloc<bf16>(H);
    bf16* h_mid = device_alloc<bf16>(H);
    Phase in = m.product(kProduct, 12352, H, seed, true);
    residual_input(m, in, kResAdd, branch, res, h, norm);
    const int in_i = m.add(in);
    Phase delta;
    delta.kind = kDelta, delta.tasks = 128, delta.dep = in_i, delta.qkv = in.out, delta.out = device_alloc<bf16>(4096);
    delta.state = device_alloc<float>(size_t(32) * 128 * 128);
    delta.conv_state = device_alloc<bf16>(3 * 8192);
    const int delta_i = m.add(delta);
    Phase out = m.product(kProduct, H, 4096, seed + 10);
    out.input = kHeadNormGated, out.in.bf = delta.out, out.in.n = 4096, out.gate = in.out + 8192, out.norm_w = norm,
    out.dep = delta_i;
    m.add(out);
    branch = add_mlp(m, kResAdd, out, h, h_mid, norm, H, I, seed), res = h_mid;
  }
  add_head(m, kResAdd, branch, res, norm, 248320, H);
}

// Gemma 4 12B: hidden 3840, 48 layers of 16 query heads and 8 KV heads of 256 (q, k, v = 8192
// rows), attention over the 512 cached positions in 8 spans, GLU 15360, vocabulary 262144; the
// branch norms after attention and the MLP folded into the next product's input stage.
void gemma12b(Builder& m, int layers) {
  const int H = 3840, I = 15360, ctx = 512, spans = ctx / 64;
  const float* norm = ones(I);
  bf16* res = random_bf16(H, -1, 1, 7);
  Source branch;
  branch.bf = device_alloc<bf16>(H), branch.n = H;
  for (int l = 0; l < layers; ++l) {
    const uint32_t seed = 1000 * (l + 1);
    bf16* h = device_alloc<bf16>(H);
    bf16* h_mid = device_alloc<bf16>(H);
    Phase in = m.product(kProduct, 8192, H, seed, true);
    residual_input(m, in, kResNorm, branch, res, h, norm);
    const int in_i = m.add(in);
    Phase att;
    att.kind = kAttention, att.tasks = 8 * spans, att.dep = in_i, att.qkv = in.out, att.ctx = ctx, att.heads = 16;
    att.part_out = device_alloc<float>(size_t(spans) * 4096 + spans * 16 * 2);
    att.kcache = random_bf16(size_t(8) * ctx * 256, -1, 1, seed + 5);
    att.vcache = random_bf16(size_t(8) * ctx * 256, -1, 1, seed + 6);
    const int att_i = m.add(att);
    Phase out = m.product(kProduct, H, 4096, seed + 10);
    out.input = kMerge, out.parts = att.part_out, out.spans = spans, out.heads = 16, out.head_dim = 256,
    out.dep = att_i;
    m.add(out);
    branch = add_mlp(m, kResNorm, out, h, h_mid, norm, H, I, seed), res = h_mid;
  }
  add_head(m, kResNorm, branch, res, norm, 262144, H);
}

// Checks every product of layer 0 and the head against the reference, from the inputs the step
// left in memory; returns the largest |error| / max |reference|.
float check(const std::vector<Phase>& phases) {
  float worst = 0;
  float* x = device_alloc<float>(kMaxK);
  float* y = device_alloc<float>(262144);
  float* got_d = device_alloc<float>(262144);
  for (int ph : {0, 2, 3, 4, int(phases.size()) - 1}) {
    const Phase& p = phases[ph];
    ref_input<<<1, 1024>>>(p, x);
    ref_product<<<(p.n + 127) / 128, 128>>>(p, x, y);
    gather_outputs<<<(p.n + 255) / 256, 256>>>(p, got_d);
    CHECK(cudaDeviceSynchronize());
    std::vector<float> ref(p.n), got(p.n);
    CHECK(cudaMemcpy(ref.data(), y, p.n * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(got.data(), got_d, p.n * sizeof(float), cudaMemcpyDeviceToHost));
    float peak = 0, err = 0;
    for (int i = 0; i < p.n; ++i) {
      peak = std::max(peak, std::fabs(ref[i]));
      err = std::max(err, std::fabs(ref[i] - got[i]));
    }
    const float rel = peak > 0 ? err / peak : err;
    std::printf("  phase %d (%s, %d x %d, %d splits): max |err| %.3g of max |ref| %.3g = %.2e\n", ph,
                p.kind == kGlu ? "GLU" : "product", p.n, p.k, p.splits, err, peak, rel);
    worst = std::max(worst, rel);
  }
  return worst;
}

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "qwen4b";
  const bool gemma = which == "gemma12b";
  const int layers = argc > 2 ? std::atoi(argv[2]) : (gemma ? 48 : 32);
  const int slots = argc > 3 ? std::atoi(argv[3]) : 8;
  Builder m;
  m.slice = argc > 4 ? std::atoi(argv[4]) : 1024;
  const int mode = argc > 5 ? std::atoi(argv[5]) : 0;
  const bool with_marks = argc > 6 && std::atoi(argv[6]) != 0;
  if (slots < 2 || slots > kMaxSlots) return std::fprintf(stderr, "slots: 2..%d\n", kMaxSlots), 1;
  CHECK(cudaDeviceGetAttribute(&m.sms, cudaDevAttrMultiProcessorCount, 0));
  m.weights.size = size_t(gemma ? 7600 : 2700) << 20;
  CHECK(cudaMalloc(&m.weights.base, m.weights.size));
  if (gemma)
    gemma12b(m, layers);
  else
    qwen4b(m, layers);
  CHECK(cudaDeviceSynchronize());
  for (Phase& p : m.phases) {
    if ((p.kind == kProduct || p.kind == kGlu) && p.k / 8 > kConsumers && p.input != kPlain)
      return std::fprintf(stderr, "a long input (%d) must be plain\n", p.k), 1;
    if (p.dep >= 0) {
      const Phase& d = m.phases[p.dep];
      p.dep_target = d.kind == kProduct || d.kind == kGlu ? d.units : d.tasks;
    }
  }
  const std::vector<Phase>& host = m.phases;
  const int np = int(host.size());
  Phase* phases = device_alloc<Phase>(np);
  CHECK(cudaMemcpy(phases, host.data(), np * sizeof(Phase), cudaMemcpyHostToDevice));
  unsigned* counters = device_alloc<unsigned>(np);
  unsigned long long* marks = with_marks ? device_alloc<unsigned long long>(size_t(np) * m.sms * 3) : nullptr;
  unsigned* sink = device_alloc<unsigned>(1);
  const int slot_bytes = (tile_bytes(m.slice) + 127) / 128 * 128;
  const size_t smem = size_t(slots) * slot_bytes + 4 * kMaxChunks * sizeof(uint4) + kMaxChunks * sizeof(float2);
  CHECK(cudaFuncSetAttribute(decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t weight_bytes = m.weights.used;
  const size_t head_bytes = size_t(host.back().blocks) * tile_bytes(host.back().k);
  const size_t layer_bytes = weight_bytes - head_bytes;
  std::printf("%s: %d layers + head, %.1f MB of weights (%.2f MB a layer), %d SMs, %d slots of %d KB, mode %d\n",
              which.c_str(), layers, weight_bytes / 1e6, layer_bytes / 1e6 / layers, m.sms, slots, slot_bytes >> 10,
              mode);
  for (int ph : {0, 2, 3, 4, np - 1}) {
    const Phase& p = host[ph];
    std::printf("  %s %d x %d: %d blocks x %d slices, %d splits, %d units (%.2f a SM)\n",
                p.kind == kGlu ? "GLU" : "product", p.n, p.k, p.blocks, p.slices, p.splits, p.units,
                double(p.units) / m.sms);
  }

  auto launch = [&](int begin, int end, int per_op) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(m.sms);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &attribute;
    config.numAttrs = per_op ? 1 : 0;
    CHECK(cudaLaunchKernelEx(&config, decode_kernel, static_cast<const Phase*>(phases), begin, end, counters, slots,
                             slot_bytes, per_op, mode, marks));
  };
  // the step as one graph: the counters cleared, then one launch (persistent) or one a phase
  auto graph_of = [&](bool per_op, int begin, int end) {
    cudaGraph_t graph;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemsetAsync(counters, 0, np * sizeof(unsigned), stream));
    if (per_op)
      for (int p = begin; p < end; ++p) launch(p, p + 1, 1);
    else
      launch(begin, end, 0);
    CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    return exec;
  };
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  auto time_us = [&](cudaGraphExec_t exec) {
    for (int r = 0; r < 3; ++r) CHECK(cudaGraphLaunch(exec, stream));
    constexpr int kReps = 20;
    CHECK(cudaEventRecord(start, stream));
    for (int r = 0; r < kReps; ++r) CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    return 1000.0f * ms / kReps;
  };

  cudaGraphExec_t persistent = graph_of(false, 0, np);
  CHECK(cudaGraphLaunch(persistent, stream));
  CHECK(cudaStreamSynchronize(stream));
  if (std::getenv("PERSISTENT_DECODE_ONCE")) return 0;  // one step, for a profiler
  float worst = 0;
  if (mode == 0) {
    worst = check(host);
    std::printf("products against the f32 reference: worst %.2e of max |ref| (%s)\n", worst,
                worst < 2e-2f ? "ok" : "WRONG");
  }

  float read_us = 0;
  {
    constexpr int kReps = 10;
    const uint4* all = reinterpret_cast<const uint4*>(m.weights.base);
    read_all<<<m.sms * 8, 512, 0, stream>>>(all, weight_bytes / 16, sink);
    CHECK(cudaEventRecord(start, stream));
    for (int r = 0; r < kReps; ++r) read_all<<<m.sms * 8, 512, 0, stream>>>(all, weight_bytes / 16, sink);
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    read_us = 1000.0f * ms / kReps;
  }
  const double read_rate = weight_bytes / (read_us * 1e-6) / 1e9;
  std::printf("reading the weights once: %.1f us, %.0f GB/s\n", read_us, read_rate);

  cudaGraphExec_t per_op = graph_of(true, 0, np);
  cudaGraphExec_t layers_only = graph_of(false, 0, np - 1);
  cudaGraphExec_t head_only = graph_of(false, np - 1, np);
  const float t_persistent = time_us(persistent), t_per_op = time_us(per_op);
  const float t_layers = time_us(layers_only), t_head = time_us(head_only);
  auto line = [&](const char* name, float us, size_t bytes) {
    std::printf("%-36s %9.1f us  %7.0f GB/s  %5.1f%% of the read rate\n", name, us, bytes / (us * 1e-6) / 1e9,
                100.0 * (bytes / (us * 1e-6) / 1e9) / read_rate);
  };
  line("step, one persistent kernel", t_persistent, weight_bytes);
  line("step, a kernel a phase (PDL graph)", t_per_op, weight_bytes);
  line("layers alone, persistent", t_layers, layer_bytes);
  line("head alone, persistent", t_head, head_bytes);
  std::printf("a layer: %.2f us persistent (%.2f us of bytes at the read rate)\n", t_layers / layers,
              layer_bytes / layers / (read_rate * 1e3));
  if (marks) {  // the last persistent step's marks: where a middle layer's time goes
    CHECK(cudaGraphLaunch(persistent, stream));
    CHECK(cudaStreamSynchronize(stream));
    std::vector<unsigned long long> t(size_t(np) * m.sms * 3);
    CHECK(cudaMemcpy(t.data(), marks, t.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    auto at = [&](int ph, int b, int w) { return t[(size_t(ph) * m.sms + b) * 3 + w]; };
    auto active = [&](int ph) {
      const Phase& p = host[ph];
      return p.kind == kProduct || p.kind == kGlu ? p.units : p.tasks;
    };
    auto last_end = [&](int ph) {
      unsigned long long e = 0;
      for (int b = 0; b < std::min(m.sms, active(ph)); ++b) e = std::max(e, at(ph, b, 2));
      return e;
    };
    const char* names[5] = {"in-projection", "small op", "out-projection", "GLU", "down-projection"};
    double sig[5] = {}, stage[5] = {}, span[5] = {}, work[5] = {};
    int counted = 0;
    for (int l = 2; l + 2 < layers; ++l, ++counted)
      for (int q = 0; q < 5; ++q) {
        const int ph = 5 * l + q, n = std::min(m.sms, active(ph));
        const unsigned long long dep_end = last_end(ph - 1);
        unsigned long long first_ready = ~0ull;
        double st = 0, wk = 0;
        for (int b = 0; b < n; ++b) {
          first_ready = std::min(first_ready, at(ph, b, 0));
          st += double(at(ph, b, 1) - at(ph, b, 0)), wk += double(at(ph, b, 2) - at(ph, b, 1));
        }
        sig[q] += double(first_ready) - double(dep_end);
        stage[q] += st / n, work[q] += wk / n;
        span[q] += double(last_end(ph)) - double(dep_end);
      }
    std::printf(
        "a middle layer, µs (mean of %d layers): phase: last end of the phase before -> first block released; "
        "input stage (mean over blocks); tiles or tasks (mean over blocks); the phase's share of the step\n",
        counted);
    double total = 0;
    for (int q = 0; q < 5; ++q) {
      std::printf("  %-16s %6.2f %6.2f %6.2f %6.2f\n", names[q], sig[q] / counted / 1e3, stage[q] / counted / 1e3,
                  work[q] / counted / 1e3, span[q] / counted / 1e3);
      total += span[q] / counted / 1e3;
    }
    std::printf("  %-16s %27.2f\n", "layer", total);
  }
  std::printf(
      "RESULT %s rows/warp=%d slots=%d slice=%d mode=%d persistent_us=%.1f per_op_us=%.1f layers_us=%.1f head_us=%.1f "
      "read_gbs=%.0f check=%.2e\n",
      which.c_str(), kRowsPerWarp, slots, m.slice, mode, t_persistent, t_per_op, t_layers, t_head, read_rate, worst);
  return worst < 2e-2f ? 0 : 2;
}
