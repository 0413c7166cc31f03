// CUDA backend: attention for decode rows (a few a sequence), flash-decoding.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/cuda_attention.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.cuh"

namespace kiln::cuda {

namespace {

// Decode (a few rows per sequence): flash-decoding. Blocks split each sequence's slots into
// spans, a warp per (row, query head) runs an online softmax over its span, and a second kernel
// merges the spans. Parallel over slots, so one KV head and a long context still fill the GPU.
// A KV head with a large group of query heads (Gemma 4's global layers: 16 on one) spreads its
// heads over several blocks of a span, so that a warp has one (row, head) pair, not several in turn.
//
// The spans are sized by the caches' capacities, so that a recorded step stays valid as the context
// grows; the span is sized on the device from the filled slots, so that a short context in a large
// cache still spreads over many blocks. A block walks spans blockIdx.x, + gridDim.x, ... and stops
// at the first past the context: a block a span launched mostly empty blocks at many sequences
// (32 sequences of 4,096-slot caches: 32,768 blocks for a few hundred spans; Qwen 3.5 4B's bf16
// step went from 6.36 to 5.89 ms on an H200). How spans are dealt to blocks changes no sum.
constexpr int kSlotUnroll = 8;  // slots whose keys and values are loaded together
constexpr int kMinSpan = 16;
constexpr int kMaxSplits = 1024;
constexpr int kCombineWarps = 8;
constexpr int kBlocksPerSm = 16;  // the attention grid's size, in blocks an SM

struct DecodeParams {
  const bf16* q;
  bf16* out;
  const int32_t* positions;
  float* partial_o;   // [rows, n_heads, splits, head_dim]
  float* partial_ml;  // [rows, n_heads, splits, 2]: running max, sum of exponentials
  int n_heads, n_kv_heads, group, head_dim;
  int splits;
  // a KV head's group of query heads over head_blocks blocks of heads_per_block each:
  // blockIdx.y = kv_head · head_blocks + part
  int heads_per_block, head_blocks;
  float scale;
  int64_t window;
  const bf16* gate;  // row (row · n_heads + head) of the output gate, or null
  int64_t gate_stride;
  SeqTable seqs;
};

// The filled slots of a sequence (its last row's position bounds them) and the span per block.
__device__ __forceinline__ int64_t filled_slots(const DecodeParams& p, const SeqDesc& seq) {
  return min(seq.capacity, int64_t(p.positions[seq.row_begin + seq.n_rows - 1]) + 1);
}
__device__ __forceinline__ int64_t span_for(int64_t n_slots, int splits) {
  return max(int64_t(kMinSpan), (n_slots + splits - 1) / splits);
}

__device__ __forceinline__ float dot8(const float* q, const uint4& raw) {
  const bf16* k = reinterpret_cast<const bf16*>(&raw);
  float d = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) d = fmaf(q[i], __bfloat162float(k[i]), d);
  return d;
}

// kChunksPerLane: head_dim / 256, rounded up: 16-byte chunks of q, k, v per lane. kQuant: the caches
// are quantized (a kernel of its own: the dequantizing loads in the bf16 kernel cost it registers,
// 153 to 255 with spills at one chunk a lane).
template <int kChunksPerLane, bool kQuant>
__global__ void __launch_bounds__(128) decode_attention_kernel(DecodeParams p) {
  // Before the inputs are ready, a warp requests its first group of cached keys and values: earlier
  // steps wrote them, and the op before (the cache write) writes only the slots of this step's rows,
  // which are found here too (from the positions, set before the step) and loaded after the wait.
  // Finding them after the wait instead added a round trip there and measured slower on an H200.
  const SeqDesc& seq = p.seqs.seq[blockIdx.z];
  const int kvh = int(blockIdx.y) / p.head_blocks;
  int split = blockIdx.x;
  const int first_head = int(blockIdx.y) % p.head_blocks * p.heads_per_block;
  const int heads = min(p.heads_per_block, p.group - first_head);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int hd = p.head_dim, chunks = hd / 8;
  const int64_t n_slots = filled_slots(p, seq);
  const int64_t span = span_for(n_slots, p.splits);
  int64_t j0 = int64_t(split) * span, j1 = min(n_slots, j0 + span);
  const int pairs = int(seq.n_rows) * heads;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  int64_t step_slot[kDecodeMaxRows];
#pragma unroll
  for (int r = 0; r < kDecodeMaxRows; ++r)
    step_slot[r] = r < seq.n_rows ? int64_t(p.positions[seq.row_begin + r]) % seq.capacity : -1;
  auto written_now = [&](int64_t slot) {  // a slot one of this step's rows writes
    bool hit = false;
#pragma unroll
    for (int r = 0; r < kDecodeMaxRows; ++r) hit = hit || step_slot[r] == slot;
    return hit;
  };
  uint4 kr[kSlotUnroll][kChunksPerLane], vr[kSlotUnroll][kChunksPerLane];
  int kp[kSlotUnroll];
  // the group of slots from j; `step_slots`: only those this step writes (the rest are loaded)
  auto load_group = [&](int64_t j, bool step_slots) {
#pragma unroll
    for (int u = 0; u < kSlotUnroll; ++u) {
      const int64_t slot = j + u;
      const bool in_span = slot < j1;
      if (step_slots && !(in_span && written_now(slot))) continue;
      kp[u] = in_span ? seq.slot_pos[slot] : -1;
#pragma unroll
      for (int c = 0; c < kChunksPerLane; ++c) {
        const int chunk = lane + 32 * c;
        const bool load = in_span && chunk < chunks;
        const int64_t head_row = slot * p.n_kv_heads + kvh;
        if constexpr (kQuant) {
          kr[u][c] =
              load ? load_kv8_codes(seq.k, seq.k_scale, seq.k_bias, p.seqs.format, head_row, hd, chunk * 8) : zero;
          vr[u][c] =
              load ? load_kv8_codes(seq.v, seq.v_scale, seq.v_bias, p.seqs.format, head_row, hd, chunk * 8) : zero;
        } else {
          const int64_t at = head_row * hd + chunk * 8;
          kr[u][c] = load ? *reinterpret_cast<const uint4*>(seq.k + at) : zero;
          vr[u][c] = load ? *reinterpret_cast<const uint4*>(seq.v + at) : zero;
        }
      }
    }
  };
  const bool early = j0 < n_slots && warp < pairs;
  if (early) load_group(j0, false);
  wait_for_inputs();
  auto attend_span = [&](bool first_span) {
    for (int pair = warp; pair < pairs; pair += warps) {
      const int r = pair / heads, head = kvh * p.group + first_head + pair % heads;
      const int64_t row = seq.row_begin + r;
      const int qp = p.positions[row];
      float q[kChunksPerLane][8], o[kChunksPerLane][8];
#pragma unroll
      for (int c = 0; c < kChunksPerLane; ++c) {
        const int chunk = lane + 32 * c;
#pragma unroll
        for (int i = 0; i < 8; ++i) o[c][i] = q[c][i] = 0.0f;
        if (chunk < chunks) {
          const uint4 raw = *reinterpret_cast<const uint4*>(p.q + (row * p.n_heads + head) * hd + chunk * 8);
          const bf16* v = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
          for (int i = 0; i < 8; ++i) q[c][i] = __bfloat162float(v[i]) * p.scale;
        }
      }
      float m = -INFINITY, l = 0.0f;
      for (int64_t j = j0; j < j1; j += kSlotUnroll) {
        // every key and value of the group in flight at once (the first group of the warp's first
        // pair already is, less this step's slots)
        load_group(j, first_span && pair == warp && j == j0);
        float s[kSlotUnroll];
#pragma unroll
        for (int u = 0; u < kSlotUnroll; ++u) {
          float d = 0.0f;
#pragma unroll
          for (int c = 0; c < kChunksPerLane; ++c) d += dot8(q[c], kr[u][c]);
          s[u] = d;
        }
#pragma unroll
        for (int u = 0; u < kSlotUnroll; ++u) s[u] = warp_sum(s[u]);
        float m_new = m;
#pragma unroll
        for (int u = 0; u < kSlotUnroll; ++u) {
          const bool visible = kp[u] >= 0 && kp[u] <= qp && (p.window <= 0 || int64_t(qp) - kp[u] < p.window);
          if (!visible) s[u] = -INFINITY;
          m_new = fmaxf(m_new, s[u]);
        }
        if (m_new == -INFINITY) continue;  // nothing visible in this group
        const float alpha = __expf(m - m_new);
        l *= alpha;
#pragma unroll
        for (int c = 0; c < kChunksPerLane; ++c)
#pragma unroll
          for (int i = 0; i < 8; ++i) o[c][i] *= alpha;
#pragma unroll
        for (int u = 0; u < kSlotUnroll; ++u) {
          const float e = s[u] == -INFINITY ? 0.0f : __expf(s[u] - m_new);
          l += e;
#pragma unroll
          for (int c = 0; c < kChunksPerLane; ++c) {
            const bf16* vv = reinterpret_cast<const bf16*>(&vr[u][c]);
#pragma unroll
            for (int i = 0; i < 8; ++i) o[c][i] = fmaf(e, __bfloat162float(vv[i]), o[c][i]);
          }
        }
        m = m_new;
      }
      const int64_t part = (row * p.n_heads + head) * p.splits + split;
      if (lane == 0) {
        p.partial_ml[part * 2] = m;
        p.partial_ml[part * 2 + 1] = l;
      }
      float* out = p.partial_o + part * hd;
#pragma unroll
      for (int c = 0; c < kChunksPerLane; ++c) {
        const int chunk = lane + 32 * c;
        if (chunk >= chunks) continue;
        reinterpret_cast<float4*>(out + chunk * 8)[0] = make_float4(o[c][0], o[c][1], o[c][2], o[c][3]);
        reinterpret_cast<float4*>(out + chunk * 8)[1] = make_float4(o[c][4], o[c][5], o[c][6], o[c][7]);
      }
    }
  };
  // the block's spans: blockIdx.x, + gridDim.x, ... up to the first past the filled slots
  for (; split < p.splits; split += gridDim.x) {
    const bool first_span = split == int(blockIdx.x);
    j0 = int64_t(split) * span;
    j1 = min(n_slots, j0 + span);
    if (j0 >= n_slots) return;
    attend_span(first_span);
  }
}

// out[row, head] = Σ_span e^{m_s − m} o_s / Σ_span e^{m_s − m} l_s over the spans that hold slots:
// warp w sums spans w, w + kCombineWarps, ... for every dimension, then the warps' sums are added in
// order. A warp's first kCombineBatch spans are loaded before the spans' weights are formed, and
// each later batch's loads go out together, so that the merge waits on memory about once, not once
// a span.
constexpr int kCombineBatch = 8;
__global__ void __launch_bounds__(kCombineWarps * 32) decode_combine_kernel(DecodeParams p, int64_t row_begin) {
  wait_for_inputs();
  constexpr int kQuads = kMaxDecodeDim / 128;  // float4s of a span a lane holds: d4 = lane + 32·i
  __shared__ float weight[kMaxSplits];
  __shared__ float4 sums[kCombineWarps][kMaxDecodeDim / 4];
  const int64_t row = row_begin + blockIdx.x;
  const int head = blockIdx.y, hd = p.head_dim;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const SeqDesc& seq = p.seqs.seq[find_seq(p.seqs, row)];
  const int64_t n_slots = filled_slots(p, seq);
  const int spans = int((n_slots + span_for(n_slots, p.splits) - 1) / span_for(n_slots, p.splits));
  const int64_t base = (row * p.n_heads + head) * p.splits;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 held[kCombineBatch][kQuads];
  auto load_batch = [&](int first) {  // spans warp + kCombineWarps·(first + j), j < kCombineBatch
#pragma unroll
    for (int j = 0; j < kCombineBatch; ++j) {
      const int s = warp + kCombineWarps * (first + j);
#pragma unroll
      for (int i = 0; i < kQuads; ++i) {
        const int d4 = lane + 32 * i;
        held[j][i] =
            s < spans && d4 < hd / 4 ? reinterpret_cast<const float4*>(p.partial_o + (base + s) * hd)[d4] : zero;
      }
    }
  };
  load_batch(0);
  float m = -INFINITY;
  for (int s = threadIdx.x; s < spans; s += blockDim.x) m = fmaxf(m, p.partial_ml[(base + s) * 2]);
  m = block_max(m);
  float l = 0.0f;
  for (int s = threadIdx.x; s < spans; s += blockDim.x) {
    const float ms = p.partial_ml[(base + s) * 2];
    const float w = ms == -INFINITY ? 0.0f : __expf(ms - m);
    weight[s] = w;
    l += w * p.partial_ml[(base + s) * 2 + 1];
  }
  l = block_sum(l);  // its barrier also publishes weight[]
  float4 acc[kQuads];
#pragma unroll
  for (int i = 0; i < kQuads; ++i) acc[i] = zero;
  for (int first = 0; warp + kCombineWarps * first < spans; first += kCombineBatch) {
    if (first > 0) load_batch(first);
#pragma unroll
    for (int j = 0; j < kCombineBatch; ++j) {
      const int s = warp + kCombineWarps * (first + j);
      if (s >= spans) break;
      const float w = weight[s];
      if (w == 0.0f) continue;
#pragma unroll
      for (int i = 0; i < kQuads; ++i) {
        acc[i].x = fmaf(w, held[j][i].x, acc[i].x);
        acc[i].y = fmaf(w, held[j][i].y, acc[i].y);
        acc[i].z = fmaf(w, held[j][i].z, acc[i].z);
        acc[i].w = fmaf(w, held[j][i].w, acc[i].w);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kQuads; ++i)
    if (lane + 32 * i < hd / 4) sums[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  const bf16* gate = p.gate ? p.gate + (row * p.n_heads + head) * p.gate_stride : nullptr;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float total = 0.0f;
    for (int w = 0; w < kCombineWarps; ++w) total += reinterpret_cast<const float*>(sums[w])[d];
    bf16 o = __float2bfloat16(total * inv);
    if (gate) o = __float2bfloat16(__bfloat162float(o) * sigmoid(__bfloat162float(gate[d])));  // as sigmoid_mul
    p.out[(row * p.n_heads + head) * hd + d] = o;
  }
}

}  // namespace

bool decode_attention_takes(const AttentionArgs& args) {
  // bidirectional blocks come with prompts (images), which the prefill kernels take
  bool decode = !args.blocks.defined() && args.head_dim % 8 == 0 && args.head_dim <= kMaxDecodeDim;
  for (const SeqRows& s : args.seqs) decode = decode && s.n_rows <= kDecodeMaxRows;
  return decode && (!args.output_gate.defined() || args.output_gate.dtype() == DType::bf16);
}

void decode_attention(const AttentionArgs& args, const Allocate& allocate, cudaStream_t stream) {
  DecodeParams p{};
  p.q = args.q.data_as<bf16>();
  p.out = args.out.data_as<bf16>();
  p.positions = args.positions.data_as<int32_t>();
  p.n_heads = args.n_heads;
  p.n_kv_heads = args.n_kv_heads;
  p.group = args.n_heads / args.n_kv_heads;
  p.head_dim = args.head_dim;
  p.scale = args.scale;
  p.window = args.window;
  p.gate = args.output_gate.defined() ? args.output_gate.data_as<bf16>() : nullptr;
  p.gate_stride = args.output_gate.defined() ? args.output_gate.row_stride() : 0;
  int64_t capacity = 1, rows = 0, most_rows = 1;
  for (size_t i = 0; i < args.seqs.size(); ++i) {
    capacity = std::max(capacity, args.caches[i].capacity);
    rows = std::max(rows, args.seqs[i].row_begin + args.seqs[i].n_rows);
    most_rows = std::max(most_rows, args.seqs[i].n_rows);
  }
  // as many blocks as spans of the smallest length fit the largest cache, at most kMaxSplits
  p.splits = int(std::min<int64_t>(kMaxSplits, ceil_div(capacity, kMinSpan)));
  Tensor partial = allocate(DType::f32, Shape{rows, args.n_heads, p.splits, args.head_dim + 2});
  p.partial_o = partial.data_as<float>();
  p.partial_ml = p.partial_o + rows * args.n_heads * p.splits * args.head_dim;
  // a warp per (row, query head) of a KV head: no more warps than that, and the group's heads over
  // as many blocks as give each warp one pair
  const int warps = int(std::min<int64_t>(4, most_rows * p.group));
  p.heads_per_block = ceil_div(p.group, std::min<int64_t>(p.group, ceil_div(most_rows * p.group, warps)));
#if KILN_CUDA_TIMELINE
  // developer builds: a KV head's query heads per block forced from the environment, for measuring
  if (const char* forced = std::getenv("KILN_DECODE_HEADS_PER_BLOCK"))
    p.heads_per_block = std::max(1, std::min(p.group, std::atoi(forced)));
#endif
  p.head_blocks = ceil_div(p.group, p.heads_per_block);
  const int64_t blocks_y = int64_t(p.n_kv_heads) * p.head_blocks;
  for (size_t begin = 0; begin < args.seqs.size(); begin += kMaxSeqs) {
    p.seqs = make_table(args.seqs, args.caches, begin);
    // a (KV head, sequence) takes as many blocks as give the GPU about 16 an SM, each walking spans
    const int64_t span_blocks =
        std::min<int64_t>(p.splits, ceil_div(int64_t(kBlocksPerSm) * multiprocessors(), blocks_y * p.seqs.n));
    const dim3 grid(unsigned(span_blocks), unsigned(blocks_y), unsigned(p.seqs.n));
    const bool quantized = p.seqs.format.bits != 0;
    if (args.head_dim <= 256)
      launch(quantized ? decode_attention_kernel<1, true> : decode_attention_kernel<1, false>, grid, warps * 32, 0,
             stream, p);
    else
      launch(quantized ? decode_attention_kernel<2, true> : decode_attention_kernel<2, false>, grid, warps * 32, 0,
             stream, p);
    const int64_t first = p.seqs.seq[0].row_begin;
    const int64_t last = p.seqs.seq[p.seqs.n - 1].row_begin + p.seqs.seq[p.seqs.n - 1].n_rows;
    launch(decode_combine_kernel, dim3(unsigned(last - first), unsigned(p.n_heads)), kCombineWarps * 32, 0, stream, p,
           first);
  }
}

}  // namespace kiln::cuda
