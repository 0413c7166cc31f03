// CPU backend: rotary embedding, the KV cache ring and causal attention over it (with bidirectional
// blocks).
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "quant/affine.h"

namespace kiln {

void CpuBackend::rope(const RopeArgs& args) {
  OpTimer timed(this, "rope");
  Tensor x = args.x;
  if (args.normalize)
    rms_norm(args.input.defined() ? args.input : x, args.norm_weight, args.norm_eps, args.norm_offset, x);
  // one axis of positions [T], or several [axes, T] that the pairs choose from
  const int64_t n_tokens = args.pair_axis.defined() ? args.positions.cols() : args.positions.numel();
  const int64_t rows = x.rows();  // tokens × heads
  const int64_t heads = n_tokens ? rows / n_tokens : 0;
  const int64_t n_pairs = args.inv_freq.numel();
  const int32_t* pos = args.positions.data_as<int32_t>();
  const int32_t* axis = args.pair_axis.defined() ? args.pair_axis.data_as<int32_t>() : nullptr;
  const float* inv_freq = args.inv_freq.data_as<float>();
  const int off = args.pair_offset;
  pool_.parallel_for(n_tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> cos_t(static_cast<size_t>(n_pairs)), sin_t(static_cast<size_t>(n_pairs));
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t i = 0; i < n_pairs; ++i) {
        const int32_t p = axis ? pos[int64_t(axis[i]) * n_tokens + t] : pos[t];
        // the angle is formed in f32 like the reference; its cosine and sine are then exact
        const float angle = float(p) * inv_freq[i];
        cos_t[size_t(i)] = float(std::cos(double(angle)));
        sin_t[size_t(i)] = float(std::sin(double(angle)));
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* p = row_ptr(x, t * heads + h);
        for (int64_t i = 0; i < n_pairs; ++i) {
          const float a = p[i], b = p[i + off];
          p[i] = a * cos_t[size_t(i)] - b * sin_t[size_t(i)];
          p[i + off] = b * cos_t[size_t(i)] + a * sin_t[size_t(i)];
        }
      }
    }
  });
  finish(x);
}

namespace {

// Writes one token's keys or values (row_elems floats, every head) into a cache's slot: copied, or
// quantized per group with the scale and bias rounded to f16.
void store_row(const Tensor& cache, int64_t slot, const float* src, int64_t row_elems) {
  if (!cache.quantized()) {
    std::memcpy(cache.data_as<float>() + slot * row_elems, src, size_t(row_elems) * 4);
    return;
  }
  const QuantParams& q = cache.quant();
  const int64_t groups = row_elems / q.group_size;
  std::vector<float> scales(static_cast<size_t>(groups)), biases(static_cast<size_t>(groups));
  quant::quantize_row(src, row_elems, q.bits, q.group_size,
                      static_cast<uint8_t*>(cache.data()) + size_t(slot * row_elems) * size_t(q.bits) / 8,
                      scales.data(), biases.data());
  uint16_t* s = q.scales.data_as<uint16_t>() + slot * groups;
  uint16_t* b = q.biases.data_as<uint16_t>() + slot * groups;
  for (int64_t g = 0; g < groups; ++g) {
    s[g] = f32_to_f16(scales[g]);
    b[g] = f32_to_f16(biases[g]);
  }
}

// One head's vector of a cached token: a pointer into the cache, or its codes dequantized into buf.
const float* load_head(const Tensor& cache, int64_t slot, int64_t kv_heads, int64_t kvh, int64_t head_dim, float* buf) {
  if (!cache.quantized()) return cache.data_as<float>() + (slot * kv_heads + kvh) * head_dim;
  quant::dequantize_rows(cache, slot * kv_heads + kvh, 1, buf);
  return buf;
}

}  // namespace

void CpuBackend::kv_write(const KvWriteArgs& args) {
  OpTimer timed(this, "kv_write");
  for (size_t s = 0; s < args.seqs.size(); ++s) {
    const SeqRows& seq = args.seqs[s];
    const KvCacheView& cache = args.caches[s];
    const int64_t row_elems = cache.k.numel() / cache.capacity;  // n_kv_heads · head_dim
    int32_t* slot_pos = cache.slot_pos.data_as<int32_t>();
    // k/v are contiguous [T, n_kv_heads, head_dim]; view them one token per row
    assert(args.k.contiguous() && args.v.contiguous());
    const Tensor k_tok = args.k.reshape(Shape{args.k.numel() / row_elems, row_elems});
    const Tensor v_tok = args.v.reshape(Shape{args.v.numel() / row_elems, row_elems});
    for (int64_t i = 0; i < seq.n_rows; ++i) {
      const int64_t pos = seq.pos_begin + i;
      const int64_t slot = pos % cache.capacity;
      store_row(cache.k, slot, row_ptr(k_tok, seq.row_begin + i), row_elems);
      store_row(cache.v, slot, row_ptr(v_tok, seq.row_begin + i), row_elems);
      slot_pos[slot] = int32_t(pos);
    }
  }
}

void CpuBackend::attention(const AttentionArgs& args) {
  OpTimer timed(this, "attention");
  const int64_t hd = args.head_dim;
  const int64_t group = args.n_heads / args.n_kv_heads;
  // one task per (query row, head) across all sequences
  struct Task {
    size_t seq;
    int64_t row;
  };
  std::vector<Task> tasks;
  for (size_t s = 0; s < args.seqs.size(); ++s)
    for (int64_t i = 0; i < args.seqs[s].n_rows; ++i) tasks.push_back({s, args.seqs[s].row_begin + i});

  const Tensor q = args.q.reshape(Shape{args.q.numel() / hd, hd});
  Tensor out = args.out.reshape(Shape{args.out.numel() / hd, hd});
  pool_.parallel_for(int64_t(tasks.size()) * args.n_heads, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<double> acc(static_cast<size_t>(hd));
    std::vector<float> head_buf(static_cast<size_t>(hd));  // a quantized cache's dequantized head
    for (int64_t task = begin; task < end; ++task) {
      const Task& tk = tasks[size_t(task / args.n_heads)];
      const int64_t h = task % args.n_heads;
      const SeqRows& seq = args.seqs[tk.seq];
      const KvCacheView& cache = args.caches[tk.seq];
      const int64_t qpos = args.positions.defined() ? int64_t(args.positions.data_as<int32_t>()[tk.row])
                                                    : seq.pos_begin + (tk.row - seq.row_begin);
      // the query's bidirectional block, [first, last] (empty without blocks)
      int64_t first = 1, last = 0;
      if (args.blocks.defined()) {
        first = args.blocks.data_as<int32_t>()[tk.row * 2];
        last = args.blocks.data_as<int32_t>()[tk.row * 2 + 1];
      }
      // slots beyond the highest position written so far are still empty
      const int64_t n_slots = std::min<int64_t>(cache.capacity, seq.pos_begin + seq.n_rows);
      const int32_t* slot_pos = cache.slot_pos.data_as<int32_t>();
      const int64_t kvh = h / group;
      const float* qv = row_ptr(q, tk.row * args.n_heads + h);
      const int64_t kv_heads = cache.k.dim(1);

      scores.assign(size_t(n_slots), -INFINITY);
      float max_score = -INFINITY;
      for (int64_t j = 0; j < n_slots; ++j) {
        const int64_t kp = slot_pos[j];
        if (kp < 0) continue;
        const bool in_block = first <= kp && kp <= last;
        const bool in_window = args.window <= 0 || qpos - kp < args.window;
        const bool visible =
            args.block_window ? (kp <= qpos || in_block) && in_window : (kp <= qpos && in_window) || in_block;
        if (!visible) continue;
        const float* kv = load_head(cache.k, j, kv_heads, kvh, hd, head_buf.data());
        float dot = 0;
        for (int64_t d = 0; d < hd; ++d) dot += qv[d] * kv[d];
        scores[size_t(j)] = dot * args.scale;
        max_score = std::max(max_score, scores[size_t(j)]);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double denom = 0;
      for (int64_t j = 0; j < n_slots; ++j) {
        if (scores[size_t(j)] == -INFINITY) continue;
        const double p = std::exp(double(scores[size_t(j)] - max_score));
        denom += p;
        const float* vv = load_head(cache.v, j, kv_heads, kvh, hd, head_buf.data());
        for (int64_t d = 0; d < hd; ++d) acc[size_t(d)] += p * vv[d];
      }
      float* o = row_ptr(out, tk.row * args.n_heads + h);
      for (int64_t d = 0; d < hd; ++d) o[d] = denom > 0 ? float(acc[size_t(d)] / denom) : 0.0f;
    }
  });
  finish(args.out);
  if (args.output_gate.defined()) sigmoid_mul(out, args.output_gate, out);
}

}  // namespace kiln
