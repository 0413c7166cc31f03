// The op table's sequence ops: rotary embeddings (with and without the per-head norms), the KV cache
// write, a step's attention inputs, attention over ring caches through prefill and decode (with
// bidirectional image blocks, and over a whole image as a vision tower attends), the
// causal conv and the gated delta rule over several calls, and the mixture-of-experts ops.
#include <tuple>

#include "op_table_cases.h"

namespace kiln::test::op_cases {

// ---- sequence ops ----

static std::vector<float> inv_freqs(int n_pairs) {
  std::vector<float> f;
  for (int i = 0; i < n_pairs; ++i) f.push_back(std::pow(10000.0f, -float(i) / float(n_pairs)));
  return f;
}

static std::vector<int32_t> positions_of(const std::vector<SeqRows>& seqs) {
  std::vector<int32_t> pos;
  for (const SeqRows& s : seqs)
    for (int64_t i = 0; i < s.n_rows; ++i) pos.push_back(int32_t(s.pos_begin + i));
  return pos;
}

// A ring cache of the run's type, zeroed (the reference's host memory is not), every slot empty.
static KvCacheView zeroed_cache(OpRun& r, int64_t capacity, int hkv, int hd) {
  KvCacheView c;
  c.capacity = capacity;
  c.k = r.b.alloc_cache(r.act, Shape{capacity, hkv, hd});
  c.v = r.b.alloc_cache(r.act, Shape{capacity, hkv, hd});
  c.slot_pos = r.b.alloc(DType::i32, Shape{capacity});
  r.b.fill(c.k, 0.0f);
  r.b.fill(c.v, 0.0f);
  r.b.fill(c.slot_pos, -1.0f);
  return c;
}

// Positions of several axes ([axes, tokens], axis-major) that differ per axis, and which axis each of
// n_pairs pairs follows: Qwen 3.5's interleaved text layout (t h w t h w …) for three axes, its
// vision tower's halves (rows, then columns) for two.
static std::vector<int32_t> axis_positions(int axes, int64_t tokens) {
  std::vector<int32_t> pos;
  for (int a = 0; a < axes; ++a)
    for (int64_t i = 0; i < tokens; ++i) pos.push_back(int32_t(i * 37 + a * 1000 + (a * i) % 5));
  return pos;
}
static std::vector<int32_t> pair_axes(int axes, int n_pairs) {
  std::vector<int32_t> axis;
  for (int i = 0; i < n_pairs; ++i) axis.push_back(axes == 3 ? (i < 30 ? i % 3 : 0) : (i < n_pairs / 2 ? 0 : 1));
  return axis;
}

void rope(Table& t) {
  struct Plain {
    int64_t tokens, heads;
    int hd, n_pairs, offset;
  };
  for (const Plain p :
       {Plain{9, 4, 64, 16, 32}, Plain{5, 3, 96, 24, 48}, Plain{1, 1, 128, 64, 64}, Plain{33, 2, 256, 64, 128}})
    for (DType dt : kFloatTypes)
      t.add("rope", fmt::format("{} pairs {} offset {}", dims({p.tokens, p.heads, p.hd}), p.n_pairs, p.offset), dt,
            [=](OpRun& r) {
              const Tensor x = r.random(Shape{p.tokens, p.heads, p.hd});
              std::vector<int32_t> pos;
              for (int64_t i = 0; i < p.tokens; ++i) pos.push_back(int32_t(i * 37));
              Tensor xd = r.up(x);
              r.b.rope(RopeArgs{.x = xd,
                                .positions = r.up_i32(r.ints(pos)),
                                .inv_freq = r.up_f32(r.floats(inv_freqs(p.n_pairs))),
                                .pair_offset = p.offset});
              return Outputs{output("x", r.host(xd), r.act, 2)};
            });
  // per-head norms folded into the rotation: full, partial and proportional pairings, a strided
  // input, no rotation at all, and a head too wide for the fused kernel
  struct Normed {
    int hd, n_pairs, offset;
    bool strided, weighted;
  };
  for (const Normed c :
       {Normed{64, 32, 32, true, true}, Normed{256, 16, 32, false, true}, Normed{512, 64, 256, false, true},
        Normed{128, 0, 0, false, false}, Normed{640, 32, 320, true, true}})
    for (DType dt : kFloatTypes)
      t.add("rope",
            fmt::format("7x3x{} pairs {} offset {} normalized{}{}", c.hd, c.n_pairs, c.offset,
                        c.strided ? " strided" : "", c.weighted ? "" : " unweighted"),
            dt, [=](OpRun& r) {
              const int64_t tokens = 7, heads = 3;
              const Tensor wide = r.random(Shape{tokens * heads, 2 * c.hd}, 2.0f);
              const Tensor x = r.random(Shape{tokens, heads, c.hd}, 2.0f), weight = r.random(Shape{c.hd});
              std::vector<int32_t> pos;
              for (int64_t i = 0; i < tokens; ++i) pos.push_back(int32_t(i * 101));
              Tensor xd = c.strided ? r.alloc(Shape{tokens, heads, c.hd}) : r.up(x);
              r.b.rope(RopeArgs{.x = xd,
                                .positions = r.up_i32(r.ints(pos)),
                                .inv_freq = c.n_pairs ? r.up_f32(r.floats(inv_freqs(c.n_pairs))) : Tensor(),
                                .pair_offset = c.offset,
                                .normalize = true,
                                .input = c.strided ? r.up(wide).cols_view(0, c.hd) : Tensor(),
                                .norm_weight = c.weighted ? r.up_f32(weight) : Tensor(),
                                .norm_eps = 1e-6f,
                                .norm_offset = 1.0f});
              return Outputs{output("x", r.host(xd), r.act, c.hd)};
            });
  // several position axes: the vision tower's rows and columns over whole heads, Qwen 3.5's text
  // layout over the first 64 of 256 elements, plain and with the per-head norm
  struct Axes {
    int axes, hd, n_pairs, offset;
    bool normalize;
  };
  for (const Axes c : {Axes{2, 72, 36, 36, false}, Axes{2, 64, 32, 32, false}, Axes{3, 256, 32, 32, false},
                       Axes{3, 256, 32, 32, true}, Axes{3, 32, 4, 4, true}})
    for (DType dt : kFloatTypes)
      t.add("rope",
            fmt::format("9x3x{} pairs {} offset {} axes {}{}", c.hd, c.n_pairs, c.offset, c.axes,
                        c.normalize ? " normalized" : ""),
            dt, [=](OpRun& r) {
              const int64_t tokens = 9, heads = 3;
              const Tensor x = r.random(Shape{tokens, heads, c.hd}, 2.0f), weight = r.random(Shape{c.hd});
              Tensor pos = host_tensor(DType::i32, Shape{c.axes, tokens});
              const std::vector<int32_t> values = axis_positions(c.axes, tokens);
              std::copy(values.begin(), values.end(), pos.data_as<int32_t>());
              Tensor xd = r.up(x);
              r.b.rope(RopeArgs{.x = xd,
                                .positions = r.up_i32(pos),
                                .inv_freq = r.up_f32(r.floats(inv_freqs(c.n_pairs))),
                                .pair_offset = c.offset,
                                .normalize = c.normalize,
                                .norm_weight = c.normalize ? r.up_f32(weight) : Tensor(),
                                .norm_eps = 1e-6f,
                                .norm_offset = 1.0f,
                                .pair_axis = r.up_i32(r.ints(pair_axes(c.axes, c.n_pairs)))});
              return Outputs{output("x", r.host(xd), r.act, c.normalize ? c.hd : 2)};
            });
}

// The caches' keys and values (copies of the inputs, or computed from them over `terms` terms) and
// which positions their slots hold.
static Outputs cache_outputs(OpRun& r, const std::vector<KvCacheView>& caches, bool k_copied, bool v_copied,
                             int64_t terms) {
  Outputs outs;
  for (size_t i = 0; i < caches.size(); ++i) {
    const Tensor k = r.host(caches[i].k), v = r.host(caches[i].v);
    const std::string k_name = fmt::format("cache {} k", i), v_name = fmt::format("cache {} v", i);
    outs.push_back(k_copied ? exact(k_name, k) : output(k_name, k, r.act, terms));
    outs.push_back(v_copied ? exact(v_name, v) : output(v_name, v, r.act, terms));
    outs.push_back(exact(fmt::format("cache {} slot_pos", i), r.host(caches[i].slot_pos)));
  }
  return outs;
}

void kv_and_attention(Table& t) {
  // two sequences, one decode row and a three-row chunk whose ring wraps
  const std::vector<SeqRows> seqs = {SeqRows{0, 1, 5}, SeqRows{1, 3, 17}};
  for (int hd : {64, 256})
    t.add("kv_write", fmt::format("4x2x{} capacity 8", hd), kBf16, [=](OpRun& r) {
      const Tensor k = r.random(Shape{4, 2, hd}), v = r.random(Shape{4, 2, hd});
      std::vector<KvCacheView> caches = {zeroed_cache(r, 8, 2, hd), zeroed_cache(r, 8, 2, hd)};
      r.b.kv_write(KvWriteArgs{.k = r.up(k),
                               .v = r.up(v),
                               .positions = r.up_i32(r.ints(positions_of(seqs))),
                               .seqs = seqs,
                               .caches = caches});
      return cache_outputs(r, caches, true, true, 1);
    });
  // Gemma 4's global layer (keys as values, a value norm, proportional RoPE on 512-wide heads), its
  // sliding layer (the value norm in place) and Qwen 3.5's (queries read from a strided view, norm
  // offset 1, no value norm)
  struct Inputs {
    int hq, hkv, hd, n_pairs, pair_offset;
    bool k_as_v, v_norm, strided_q;
    float norm_offset;
    int axes = 1;  // 3: Qwen 3.5's multimodal positions, apart from the tokens' cache positions
  };
  for (const Inputs c :
       {Inputs{4, 1, 512, 64, 256, true, true, false, 0.0f}, Inputs{4, 2, 256, 128, 128, false, true, false, 0.0f},
        Inputs{4, 2, 128, 32, 32, false, false, true, 1.0f}, Inputs{4, 2, 256, 32, 32, false, false, true, 1.0f, 3}})
    t.add("attention_inputs",
          fmt::format("4x{}x{} kv {}{}{}{}{}", c.hq, c.hd, c.hkv, c.k_as_v ? " k as v" : "", c.v_norm ? " v norm" : "",
                      c.strided_q ? " strided q" : "", c.axes > 1 ? " 3 axes" : ""),
          kBf16, [=](OpRun& r) {
            const int64_t tokens = 4;
            const Tensor q_wide = r.random(Shape{tokens * c.hq, 2 * c.hd}, 2.0f);
            const Tensor q_in = r.random(Shape{tokens * c.hq, c.hd}, 2.0f);
            const Tensor k = r.random(Shape{tokens, c.hkv, c.hd}, 2.0f), v = r.random(Shape{tokens, c.hkv, c.hd}, 2.0f);
            const Tensor q_norm = r.random(Shape{c.hd}), k_norm = r.random(Shape{c.hd});
            const Tensor pos = r.up_i32(r.ints(positions_of(seqs))), freqs = r.up_f32(r.floats(inv_freqs(c.n_pairs)));
            Tensor rope_pos = pos, axis;
            if (c.axes > 1) {
              Tensor host = host_tensor(DType::i32, Shape{c.axes, tokens});
              const std::vector<int32_t> values = axis_positions(c.axes, tokens);
              std::copy(values.begin(), values.end(), host.data_as<int32_t>());
              rope_pos = r.up_i32(host);
              axis = r.up_i32(r.ints(pair_axes(c.axes, c.n_pairs)));
            }
            std::vector<KvCacheView> caches = {zeroed_cache(r, 8, c.hkv, c.hd), zeroed_cache(r, 8, c.hkv, c.hd)};
            Tensor q = r.alloc(Shape{tokens, c.hq, c.hd}), kd = r.up(k), vd = r.up(v);
            auto rope_args = [&](const Tensor& x, const Tensor& input, const Tensor& norm) {
              return RopeArgs{.x = x,
                              .positions = rope_pos,
                              .inv_freq = freqs,
                              .pair_offset = c.pair_offset,
                              .normalize = true,
                              .input = input,
                              .norm_weight = r.up_f32(norm),
                              .norm_eps = 1e-6f,
                              .norm_offset = c.norm_offset,
                              .pair_axis = axis};
            };
            r.b.attention_inputs(AttentionInputsArgs{
                .q = rope_args(q, c.strided_q ? r.up(q_wide).cols_view(0, c.hd) : r.up(q_in), q_norm),
                .k = rope_args(kd, Tensor(), k_norm),
                .v = vd,
                .v_input = c.v_norm ? (c.k_as_v ? kd : vd).reshape(Shape{tokens * c.hkv, c.hd}) : Tensor(),
                .v_norm_eps = 1e-6f,
                .kv = KvWriteArgs{.k = kd, .v = vd, .positions = pos, .seqs = seqs, .caches = caches}});
            Outputs outs{output("q", r.host(q), r.act, c.hd)};
            for (OpOutput& o : cache_outputs(r, caches, false, !c.v_norm, c.hd)) outs.push_back(std::move(o));
            return outs;
          });

  // Chunked prefill then decode through ring caches, two sequences a call (45 and 19 tokens): the
  // outputs of every call, laid end to end.
  struct Attn {
    int hq, hkv, hd;
    int64_t window, chunk;
    bool gated;
  };
  std::vector<Attn> cases;
  for (int hd : {32, 64, 128, 256, 512})
    for (int64_t window : {0, 9}) cases.push_back({8, 2, hd, window, 7, false});
  cases.insert(cases.end(), {{6, 1, 128, 0, 13, false},  // a group that does not divide the tile
                             {16, 16, 64, 0, 5, false},  // no grouping
                             {16, 1, 512, 0, 3, false},  // Gemma 4's global layers: 16 heads on one
                             {16, 1, 512, 9, 5, false},  // KV head, spread over blocks
                             {8, 2, 128, 0, 7, true},    // with an output gate, as Qwen 3.5's
                             {8, 2, 256, 0, 7, true}});
  for (const Attn c : cases)
    t.add(
        "attention",
        fmt::format("{}x{} kv {} window {} chunk {}{}", c.hq, c.hd, c.hkv, c.window, c.chunk, c.gated ? " gated" : ""),
        kBf16, [=](OpRun& r) {
          const std::vector<int64_t> lengths = {45, 19};
          const int64_t capacity = c.window ? c.window - 1 + c.chunk : 64;
          std::vector<KvCacheView> all = {zeroed_cache(r, capacity, c.hkv, c.hd),
                                          zeroed_cache(r, capacity, c.hkv, c.hd)};
          std::vector<Tensor> outs;
          for (int64_t begin = 0; begin < 45;) {
            const int64_t step = begin < 30 ? c.chunk : 1;  // prefill in chunks, then decode
            std::vector<SeqRows> seqs;
            std::vector<KvCacheView> caches;
            int64_t rows = 0;
            for (size_t s = 0; s < lengths.size(); ++s) {
              const int64_t n = std::min(step, lengths[s] - begin);
              if (n <= 0) continue;
              seqs.push_back(SeqRows{rows, n, begin});
              caches.push_back(all[s]);
              rows += n;
            }
            const Tensor q = r.random(Shape{rows, c.hq, c.hd}), k = r.random(Shape{rows, c.hkv, c.hd}),
                         v = r.random(Shape{rows, c.hkv, c.hd}), gate = r.random(Shape{rows * c.hq, 2 * c.hd});
            // everything uploaded first, so that the attention runs right after the cache write
            const Tensor pos = r.up_i32(r.ints(positions_of(seqs))), qd = r.up(q), kd = r.up(k), vd = r.up(v);
            const Tensor gated = c.gated ? r.up(gate).cols_view(c.hd, c.hd) : Tensor();
            Tensor out = r.alloc(Shape{rows, c.hq, c.hd});
            r.b.kv_write(KvWriteArgs{.k = kd, .v = vd, .positions = pos, .seqs = seqs, .caches = caches});
            r.b.attention(AttentionArgs{.q = qd,
                                        .out = out,
                                        .positions = pos,
                                        .seqs = seqs,
                                        .caches = caches,
                                        .n_heads = c.hq,
                                        .n_kv_heads = c.hkv,
                                        .head_dim = c.hd,
                                        .scale = 0.125f,
                                        .window = c.window,
                                        .output_gate = gated});
            outs.push_back(r.host(out));
            begin += step;
          }
          return Outputs{output("out", concat(outs), r.act, std::max<int64_t>(c.hd, 45))};
        });

  // Bidirectional attention as a vision tower runs it: each frame's keys at positions 0 … n-1 of
  // a cache of its own, and every query at n-1; head sizes of the released towers (64, 72), two
  // frames, and a frame short enough for the decode kernels
  struct Frames {
    int heads, hd;
    std::vector<int64_t> lengths;
  };
  for (const Frames& c : {Frames{4, 72, {24, 24}}, Frames{3, 64, {80}}, Frames{2, 72, {3}}})
    t.add("attention", fmt::format("{}x{} frames {} bidirectional", c.heads, c.hd, joined(c.lengths, ",")), kBf16,
          [=](OpRun& r) {
            std::vector<SeqRows> seqs;
            std::vector<KvCacheView> caches;
            std::vector<int32_t> slots, queries;
            int64_t rows = 0;
            for (int64_t n : c.lengths) {
              seqs.push_back(SeqRows{rows, n, 0});
              caches.push_back(zeroed_cache(r, n, c.heads, c.hd));
              for (int64_t i = 0; i < n; ++i) slots.push_back(int32_t(i)), queries.push_back(int32_t(n - 1));
              rows += n;
            }
            const Tensor q = r.random(Shape{rows, c.heads, c.hd}), k = r.random(Shape{rows, c.heads, c.hd}),
                         v = r.random(Shape{rows, c.heads, c.hd});
            const Tensor slot_pos = r.up_i32(r.ints(slots)), query_pos = r.up_i32(r.ints(queries));
            const Tensor qd = r.up(q), kd = r.up(k), vd = r.up(v);
            Tensor out = r.alloc(Shape{rows, c.heads, c.hd});
            r.b.kv_write(KvWriteArgs{.k = kd, .v = vd, .positions = slot_pos, .seqs = seqs, .caches = caches});
            r.b.attention(AttentionArgs{.q = qd,
                                        .out = out,
                                        .positions = query_pos,
                                        .seqs = seqs,
                                        .caches = caches,
                                        .n_heads = c.heads,
                                        .n_kv_heads = c.heads,
                                        .head_dim = c.hd,
                                        .scale = 0.125f});
            return Outputs{output("out", r.host(out), r.act, std::max<int64_t>(c.hd, 80))};
          });
  // Bidirectional blocks (images): two sequences whose chunks hold whole images, one image longer
  // than the window and two adjacent ones making one block, then decode rows beside prefill; the
  // blocks obeying the window (Gemma 4's sliding layers) or not (the unified model's). Head dims
  // of the flash kernel and of the tiled one (72, a vision tower's), grouped and not.
  struct Blocked {
    int hq, hkv, hd;
    int64_t window;
    bool block_window;
  };
  std::vector<Blocked> blocked;
  for (const auto& [hq, hkv, hd] : {std::tuple{8, 2, 64}, std::tuple{8, 2, 128}, std::tuple{8, 2, 256},
                                   std::tuple{16, 1, 512}, std::tuple{4, 4, 72}, std::tuple{4, 2, 72}})
    for (int64_t window : {0, 9})
      for (bool block_window : {false, true})
        if (window || !block_window) blocked.push_back({hq, hkv, hd, window, block_window});
  for (const Blocked c : blocked)
    t.add("attention",
          fmt::format("{}x{} kv {} window {} image blocks{}", c.hq, c.hd, c.hkv, c.window,
                      c.block_window ? " in window" : ""),
          kBf16, [=](OpRun& r) {
            struct Seq {
              int64_t length;
              std::vector<std::pair<int64_t, int64_t>> runs;  // runs of image tokens [begin, end)
              std::vector<int64_t> ends;                      // prefill chunks end here, then decode
            };
            const std::vector<Seq> seqs = {{45, {{3, 14}, {20, 33}}, {3, 17, 20, 34, 40}}, {19, {{4, 16}}, {4, 16}}};
            const int64_t capacity = c.window ? c.window - 1 + 16 : 64;
            std::vector<KvCacheView> all;
            for (size_t s = 0; s < seqs.size(); ++s) all.push_back(zeroed_cache(r, capacity, c.hkv, c.hd));
            std::vector<int64_t> done(seqs.size(), 0);
            std::vector<Tensor> outs;
            while (done[0] < seqs[0].length || done[1] < seqs[1].length) {
              std::vector<SeqRows> rows_of;
              std::vector<KvCacheView> caches;
              std::vector<int32_t> blocks;
              int64_t rows = 0;
              for (size_t s = 0; s < seqs.size(); ++s) {
                const int64_t begin = done[s];
                if (begin >= seqs[s].length) continue;
                int64_t end = begin + 1;
                for (int64_t e : seqs[s].ends)
                  if (e > begin) {
                    end = e;
                    break;
                  }
                for (int64_t p = begin; p < end; ++p) {
                  int32_t first = 1, last = 0;
                  for (const auto& [b, e] : seqs[s].runs)
                    if (p >= b && p < e) first = int32_t(b), last = int32_t(e - 1);
                  blocks.push_back(first);
                  blocks.push_back(last);
                }
                rows_of.push_back(SeqRows{rows, end - begin, begin});
                caches.push_back(all[s]);
                rows += end - begin;
                done[s] = end;
              }
              const Tensor q = r.random(Shape{rows, c.hq, c.hd}), k = r.random(Shape{rows, c.hkv, c.hd}),
                           v = r.random(Shape{rows, c.hkv, c.hd});
              const Tensor pos = r.up_i32(r.ints(positions_of(rows_of))), qd = r.up(q), kd = r.up(k), vd = r.up(v);
              const Tensor bd = r.up_i32(r.ints(blocks)).reshape(Shape{rows, 2});
              Tensor out = r.alloc(Shape{rows, c.hq, c.hd});
              r.b.kv_write(KvWriteArgs{.k = kd, .v = vd, .positions = pos, .seqs = rows_of, .caches = caches});
              r.b.attention(AttentionArgs{.q = qd,
                                          .out = out,
                                          .positions = pos,
                                          .seqs = rows_of,
                                          .caches = caches,
                                          .n_heads = c.hq,
                                          .n_kv_heads = c.hkv,
                                          .head_dim = c.hd,
                                          .scale = 0.125f,
                                          .window = c.window,
                                          .blocks = bd,
                                          .block_window = c.block_window});
              outs.push_back(r.host(out));
            }
            return Outputs{output("out", concat(outs), r.act, std::max<int64_t>(c.hd, 45))};
          });

  // A vision tower's attention: one image of 50 patches, each seeing all of them, its keys and
  // values the cache itself (slot p holds patch p).
  for (const auto& [hq, hkv, hd] :
       {std::tuple{2, 2, 64}, std::tuple{4, 2, 72}, std::tuple{16, 16, 72}, std::tuple{12, 12, 64}})
    t.add("attention", fmt::format("{}x{} kv {} whole image of 50", hq, hd, hkv), kBf16, [=](OpRun& r) {
      const int64_t P = 50;
      const Tensor q = r.random(Shape{P, hq, hd}, 0.5f), k = r.random(Shape{P, hkv, hd}, 0.5f),
                   v = r.random(Shape{P, hkv, hd});
      std::vector<int32_t> index, whole;
      for (int64_t p = 0; p < P; ++p) {
        index.push_back(int32_t(p));
        whole.push_back(0);
        whole.push_back(int32_t(P - 1));
      }
      const Tensor positions = r.up_i32(r.ints(index));
      Tensor out = r.alloc(Shape{P, hq, hd});
      r.b.attention(
          AttentionArgs{.q = r.up(q),
                        .out = out,
                        .positions = positions,
                        .seqs = {SeqRows{0, P, 0}},
                        .caches = {KvCacheView{.k = r.up(k), .v = r.up(v), .slot_pos = positions, .capacity = P}},
                        .n_heads = hq,
                        .n_kv_heads = hkv,
                        .head_dim = hd,
                        .scale = 1.0f,
                        .blocks = r.up_i32(r.ints(whole)).reshape(Shape{P, 2})});
      return Outputs{output("out", r.host(out), r.act, std::max<int64_t>(hd, P))};
    });
}

// ---- recurrent: causal conv, gated delta ----

void recurrent(Table& t) {
  // every kernel size the decode kernel's window registers hold, channels that are no multiple of a
  // block, sequences of 1 to 4 tokens; then sequences longer than one run of tokens (the
  // token-parallel kernel), short ones beside them
  struct Conv {
    int64_t channels;
    std::vector<int64_t> lengths;
    int kernel, calls;
    bool silu;
  };
  std::vector<Conv> convs;
  for (int kernel : {2, 3, 4, 8}) convs.push_back({8192 + 33, {1, 4, 2}, kernel, 3, true});
  for (int kernel : {2, 4, 8}) convs.push_back({1024 + 33, {700, 1, 3, 129}, kernel, 2, true});
  convs.push_back({63, {5, 1}, 4, 2, false});
  for (const Conv& c : convs)
    for (DType dt : kFloatTypes) {
      const std::string lengths = joined(c.lengths, ",");
      t.add("causal_conv1d",
            fmt::format("{} channels kernel {} rows {} calls {}{}", c.channels, c.kernel, lengths, c.calls,
                        c.silu ? "" : " no silu"),
            dt, [=](OpRun& r) {
              std::vector<SeqRows> seqs;
              int64_t tokens = 0;
              for (int64_t n : c.lengths) {
                seqs.push_back(SeqRows{.row_begin = tokens, .n_rows = n});
                tokens += n;
              }
              const Tensor w = r.up_f32(r.random(Shape{c.channels, c.kernel}, 0.5f));
              std::vector<Tensor> states;
              for (size_t i = 0; i < seqs.size(); ++i)
                states.push_back(r.up(r.random(Shape{c.kernel - 1, c.channels})));
              std::vector<Tensor> outs, state_values;
              for (int call = 0; call < c.calls; ++call) {
                Tensor out = r.alloc(Shape{tokens, c.channels});
                r.b.causal_conv1d({.x = r.up(r.random(Shape{tokens, c.channels})),
                                   .weight = w,
                                   .out = out,
                                   .seqs = seqs,
                                   .states = states,
                                   .silu = c.silu});
                outs.push_back(r.host(out));
                for (const Tensor& s : states) state_values.push_back(r.host(s));
              }
              return Outputs{output("out", concat(outs), r.act, c.kernel), exact("states", concat(state_values))};
            });
    }

  struct Delta {
    int hk, hv, dk, dv;
    std::vector<int64_t> rows;  // tokens per sequence in each call
    int calls;
    DeltaRuleAlgorithm algorithm;
    bool output_norm;
  };
  constexpr auto recurrent = DeltaRuleAlgorithm::recurrent, chunked = DeltaRuleAlgorithm::chunked;
  const Delta deltas[] = {
      {16, 32, 128, 128, {1, 1, 1}, 2, recurrent, false},               // Qwen 3.5 4B's heads, several sequences
      {16, 32, 128, 128, {3, 1, 5}, 2, recurrent, false},               // several tokens per sequence
      {2, 4, 32, 36, {1, 2}, 3, recurrent, false},                      // a half-empty column slice, rows past k_dim
      {1, 3, 200, 12, {2}, 2, recurrent, false},                        // k_dim over 128
      {2, 4, 48, 30, {1, 3}, 2, recurrent, false},                      // v_dim no multiple of 4
      {1, 2, 16, 8, std::vector<int64_t>(70, 1), 2, recurrent, false},  // more sequences than a launch takes
      {16, 32, 128, 128, {1, 1, 1}, 2, recurrent, true},                // with the output norm
      {2, 4, 48, 30, {1, 3}, 2, recurrent, true},
      {16, 32, 128, 128, {200}, 1, chunked, false},    // a prompt
      {16, 48, 128, 128, {70, 1}, 1, chunked, false},  // three value heads per key head
      {1, 3, 200, 36, {100, 1}, 2, chunked, false},    // k_dim padded to 16, a part-filled slice
      {2, 4, 36, 20, {100, 3}, 2, chunked, false},     // q and k rows not in 16-byte pieces
      {16, 32, 128, 128, {70, 1}, 1, chunked, true},   // with the output norm
  };
  for (const Delta& c : deltas) {
    std::string rows =
        joined(std::vector<int64_t>(c.rows.begin(), c.rows.begin() + std::min<size_t>(c.rows.size(), 3)), ",");
    if (c.rows.size() > 3) rows += fmt::format(" ({} sequences)", c.rows.size());
    t.add("gated_delta",
          fmt::format("{} heads {}/{} {}x{} rows {} calls {}{}", c.algorithm == recurrent ? "recurrent" : "chunked",
                      c.hk, c.hv, c.dk, c.dv, rows, c.calls, c.output_norm ? " normed" : ""),
          kBf16, [=](OpRun& r) {
            std::vector<SeqRows> seqs;
            int64_t tokens = 0;
            for (int64_t n : c.rows) {
              seqs.push_back(SeqRows{.row_begin = tokens, .n_rows = n});
              tokens += n;
            }
            // decays e^g from about 0.97 down to about 0.2 across the heads
            std::vector<float> a_log, dt;
            for (int h = 0; h < c.hv; ++h) {
              a_log.push_back(-3.0f + 2.5f * float(h) / float(std::max(c.hv - 1, 1)));
              dt.push_back(0.5f - 0.05f * float(h % 8));
            }
            const Tensor a_log_d = r.up_f32(r.floats(a_log)), dt_d = r.up_f32(r.floats(dt));
            std::vector<Tensor> states;
            for (size_t i = 0; i < seqs.size(); ++i)
              states.push_back(r.up_f32(r.random(Shape{c.hv, c.dk, c.dv}, 0.5f)));
            const int64_t width = 2 * int64_t(c.hk) * c.dk + int64_t(c.hv) * c.dv, out_width = int64_t(c.hv) * c.dv;
            std::vector<Tensor> outs;
            for (int call = 0; call < c.calls; ++call) {
              const Tensor qkv = r.random(Shape{tokens, width}), a = r.random(Shape{tokens, c.hv}),
                           b = r.random(Shape{tokens, c.hv});
              const Tensor z = r.random(Shape{tokens, out_width}), norm = r.random(Shape{c.dv});
              Tensor out = r.alloc(Shape{tokens, out_width});
              GatedDeltaArgs args{.qkv = r.up(qkv),
                                  .a = r.up(a),
                                  .b = r.up(b),
                                  .a_log = a_log_d,
                                  .dt_bias = dt_d,
                                  .out = out,
                                  .seqs = seqs,
                                  .states = states,
                                  .n_k_heads = c.hk,
                                  .n_v_heads = c.hv,
                                  .k_dim = c.dk,
                                  .v_dim = c.dv,
                                  .algorithm = c.algorithm};
              if (c.output_norm) args.norm_z = r.up(z), args.norm_weight = r.up_f32(norm), args.norm_eps = 1e-6f;
              r.b.gated_delta(args);
              outs.push_back(r.host(out));
            }
            std::vector<Tensor> state_values;
            for (const Tensor& s : states) state_values.push_back(r.host(s));
            int64_t longest = 0;
            for (int64_t n : c.rows) longest = std::max(longest, n);
            const int64_t terms = int64_t(c.dk) * longest * c.calls;
            return Outputs{output("out", concat(outs), r.act, terms),
                           output("states", concat(state_values), kF32, terms)};
          });
  }
}

// ---- mixture of experts ----

// Routing of `tokens` tokens to top_k of `routed` experts, every one of them used, with weights of
// a few sizes: the same for every run.
static void route_evenly(OpRun& r, int64_t tokens, int top_k, int routed, Tensor& ids, Tensor& weights) {
  std::vector<int32_t> id;
  std::vector<float> w;
  for (int64_t i = 0; i < tokens * top_k; ++i) {
    id.push_back(int32_t((i * 7 + i / top_k) % routed));
    w.push_back(0.2f + 0.1f * float(i % 4));
  }
  ids = r.up_i32(r.ints(id)).reshape(Shape{tokens, top_k});
  weights = r.up_f32(r.floats(w)).reshape(Shape{tokens, top_k});
}

void moe(Table& t) {
  struct Route {
    int64_t tokens, experts;
    int top_k;
    bool renormalize, scaled;
  };
  for (const Route c : {Route{19, 10, 3, true, true}, Route{33, 64, 8, true, false}, Route{1, 128, 8, false, true},
                        Route{5, 6, 1, true, false}, Route{7, 512, 32, true, false}})
    for (DType dt : kFloatTypes)
      t.add("moe_route",
            fmt::format("{} of {} top {}{}{}", c.tokens, c.experts, c.top_k, c.renormalize ? "" : " unnormalized",
                        c.scaled ? " scaled" : ""),
            dt, [=](OpRun& r) {
              const Tensor logits = r.random(Shape{c.tokens, c.experts}, 2.0f), scale = r.random(Shape{c.experts});
              Tensor ids = r.b.alloc(DType::i32, Shape{c.tokens, c.top_k});
              Tensor weights = r.b.alloc(DType::f32, Shape{c.tokens, c.top_k});
              r.b.moe_route({.logits = r.up(logits),
                             .expert_scale = c.scaled ? r.up_f32(scale) : Tensor(),
                             .ids = ids,
                             .weights = weights,
                             .top_k = c.top_k,
                             .renormalize = c.renormalize});
              return Outputs{exact("ids", r.host(ids)), output("weights", r.host(weights), kF32, c.experts)};
            });

  // inter 48: the down products and their weighted sum in one pass; 4200: the two-pass path;
  // 26B-A4B-like sizes at decode (the tensor-core kernels) and prefill (grouped by expert); sizes the
  // tensor-core kernels do not take
  struct Experts {
    int64_t hidden, inter, experts;
    int top_k;
    int64_t tokens;
  };
  for (const Experts c : {Experts{96, 48, 10, 3, 19}, Experts{96, 4200, 10, 3, 19}, Experts{1056, 96, 12, 10, 1},
                          Experts{1056, 96, 12, 10, 13}, Experts{1056, 96, 12, 10, 40}, Experts{100, 36, 6, 3, 5},
                          Experts{256, 128, 64, 2, 100}})
    for (Activation act : {Activation::silu, Activation::gelu_tanh})
      for (DType out_type : kFloatTypes)
        t.add("moe_experts",
              fmt::format("{} tokens hidden {} inter {} {} experts top {} {}", c.tokens, c.hidden, c.inter, c.experts,
                          c.top_k, act_name(act)),
              kBf16, out_type, [=](OpRun& r) {
                const Tensor gate = r.random(Shape{c.experts, c.inter, c.hidden}, 0.05f);
                const Tensor up = r.random(Shape{c.experts, c.inter, c.hidden}, 0.05f);
                const Tensor down = r.random(Shape{c.experts, c.hidden, c.inter}, 0.05f);
                const Tensor x = r.random(Shape{c.tokens, c.hidden});
                Tensor ids, weights;
                route_evenly(r, c.tokens, c.top_k, int(c.experts), ids, weights);
                Tensor out = r.alloc_out(Shape{c.tokens, c.hidden});
                r.b.moe_experts({.x = r.up(x),
                                 .ids = ids,
                                 .weights = weights,
                                 .gate = r.weight(gate),
                                 .up = r.weight(up),
                                 .down = r.weight(down),
                                 .out = out,
                                 .act = act});
                return Outputs{output("out", r.host(out), r.out, std::max(c.hidden, c.inter) * c.top_k)};
              });

  // quantized stacks, per pair (19 tokens) and grouped by expert (100), a dense down projection
  // beside packed gate and up; the emulation multiplies the weights as bf16, as the grouped GEMMs do
  for (int bits : {3, 4, 8})
    for (int64_t tokens : {19, 100})
      for (bool dense_down : {false, true}) {
        if (dense_down && bits != 8) continue;
        t.add("moe_experts",
              fmt::format("{} tokens hidden 128 inter 64 12 experts top 3 q{} g32{}", tokens, bits,
                          dense_down ? " dense down" : ""),
              kBf16, kF32, [=](OpRun& r) {
                const Tensor gate = r.quantized(Shape{12, 64, 128}, bits, 32),
                             up = r.quantized(Shape{12, 64, 128}, bits, 32);
                Tensor down = r.quantized(Shape{12, 128, 64}, bits, 32);
                if (dense_down) down = bf16_dequantized(down);
                const Tensor x = r.random(Shape{tokens, 128}, 0.5f);
                Tensor ids, weights;
                route_evenly(r, tokens, 3, 10, ids, weights);
                auto stack = [&](const Tensor& w) {
                  return r.emulating && w.quantized() ? r.up(bf16_dequantized(w)) : r.weight(w);
                };
                Tensor out = r.alloc_out(Shape{tokens, 128});
                r.b.moe_experts({.x = r.up(x),
                                 .ids = ids,
                                 .weights = weights,
                                 .gate = stack(gate),
                                 .up = stack(up),
                                 .down = stack(down),
                                 .out = out,
                                 .act = Activation::silu});
                return Outputs{output("out", r.host(out), r.out, 128 * 3)};
              });
      }
}

}  // namespace kiln::test::op_cases
