// The op table's products: dense (f32 and bf16 weights and outputs, one to 256 rows, several products
// of one input, the GLU product, the output projection fused with the residual update) and
// quantized (2 to 8 bits, groups of 32 to 128), and the embedding lookups and bags.
#include "op_table_cases.h"

namespace kiln::test::op_cases {

void dense_products(Table& t) {
  struct Product {
    int64_t m, n, k;
  };
  std::vector<Product> products;
  for (int64_t m : {1, 2, 33, 256})
    for (int64_t n : {31, 128}) products.push_back({m, n, 96});
  products.insert(products.end(), {{5, 63, 33}, {9, 65, 264}, {17, 127, 2560}});
  struct Types {
    DType act, out;
  };
  for (const Product p : products)
    for (const Types ty : {Types{kBf16, kBf16}, Types{kBf16, kF32}, Types{kF32, kF32}})
      t.add("matmul", dims({p.m, p.n, p.k}), ty.act, ty.out, [=](OpRun& r) {
        const Tensor x = r.random(Shape{p.m, p.k}), w = r.random(Shape{p.n, p.k});
        Tensor out = r.alloc_out(Shape{p.m, p.n});
        r.b.matmul(r.up(x), r.weight(w), out);
        return Outputs{output("out", r.host(out), r.out, p.k)};
      });
  for (DType out_type : kFloatTypes)  // the right half of wider input rows
    t.add("matmul", "5x97x256 strided input", kBf16, out_type, [=](OpRun& r) {
      const Tensor x = r.random(Shape{5, 512}), w = r.random(Shape{97, 256});
      Tensor out = r.alloc_out(Shape{5, 97});
      r.b.matmul(r.up(x).cols_view(256, 256), r.weight(w), out);
      return Outputs{output("out", r.host(out), r.out, 256)};
    });
  // several products of one input (q/k/v), and the GLU product; k a multiple of 32 takes the
  // tensor-core kernels (2560: many warps share a tile), 264 the streaming ones
  for (int64_t k : {264, 2560})
    for (int64_t m : {1, 3, 8, 9, 17, 32, 33}) {
      for (DType out_type : kFloatTypes)
        t.add("matmul_many", dims({m, 31 + 64 + 9, k}), kBf16, out_type, [=](OpRun& r) {
          const Tensor x = r.random(Shape{m, k});
          std::vector<MatmulProduct> products;
          for (int64_t n : {31, 64, 9}) products.push_back({r.weight(r.random(Shape{n, k})), r.alloc_out(Shape{m, n})});
          r.b.matmul_many(r.up(x), products);
          Outputs outs;
          for (size_t i = 0; i < products.size(); ++i)
            outs.push_back(output(fmt::format("out {}", i), r.host(products[i].out), r.out, k));
          return outs;
        });
      for (Activation act : {Activation::silu, Activation::gelu_tanh})
        for (DType out_type : kFloatTypes) {
          if (out_type == kF32 && m != 1 && m != 33) continue;
          t.add("glu_matmul", fmt::format("{} {}", dims({m, 45, k}), act_name(act)), kBf16, out_type, [=](OpRun& r) {
            const Tensor x = r.random(Shape{m, k}), gate = r.random(Shape{45, k}, 0.1f), up = r.random(Shape{45, k});
            Tensor out = r.alloc_out(Shape{m, 45});
            r.b.glu_matmul(r.up(x), r.weight(gate), r.weight(up), act, out);
            return Outputs{output("out", r.host(out), r.out, k)};
          });
        }
    }
  // a block's output projection with the residual update after it: the fused launch (one or two
  // rows) and the plain ops (three)
  for (int64_t n : {160, 2560})
    for (bool block_norm : {false, true})
      for (int64_t m : {1, 2, 3})
        t.add("matmul_residual_norm", fmt::format("{}{}", dims({m, n, 4096}), block_norm ? " block norm" : ""), kBf16,
              [=](OpRun& r) {
                const Tensor x = r.random(Shape{m, 4096}, 0.5f), w = r.random(Shape{n, 4096});
                ResidualInputs in = residual_inputs(r, m, n, block_norm, true, true);
                in.args.block_out = r.alloc(Shape{m, n});
                r.b.matmul_residual_norm(r.up(x), r.weight(w), in.args);
                Outputs outs = residual_outputs(r, in.args, 4096);
                outs.push_back(output("block_out", r.host(in.args.block_out), r.act, 4096));
                return outs;
              });
  for (int64_t cols : {33, 160})
    for (float scale : {1.0f, 3.0f})
      for (DType dt : kFloatTypes)
        t.add("embed", fmt::format("53x{} scale {}", cols, scale), dt, [=](OpRun& r) {
          const Tensor table = r.random(Shape{53, cols});
          std::vector<int32_t> ids;
          for (int i = 0; i < 7; ++i) ids.push_back((i * 13 + 5) % 53);
          Tensor out = r.alloc(Shape{7, cols});
          r.b.embed(r.up_i32(r.ints(ids)), r.weight(table), scale, out);
          return Outputs{scale == 1.0f ? exact("out", r.host(out)) : output("out", r.host(out), r.act)};  // copied rows
        });
  // embedding bags: a vision tower's x and y position rows (two a row), its k x k pooling (nine),
  // over a table that is a weight or an activation
  struct Bag {
    int64_t rows, n, vocab, cols;
    float scale;
  };
  for (const Bag g :
       {Bag{7, 2, 53, 33, 1.0f}, Bag{20, 9, 180, 160, 1.0f / 9.0f}, Bag{5, 4, 40, 1031, 0.25f}, Bag{1, 1, 3, 32, 1.0f}})
    for (DType dt : kFloatTypes)
      t.add("gather_sum", fmt::format("{} of {} scale {}", dims({g.rows, g.n, g.cols}), g.vocab, g.scale), dt,
            [=](OpRun& r) {
              const Tensor table = r.random(Shape{g.vocab, g.cols});
              std::vector<int32_t> ids;
              for (int64_t i = 0; i < g.rows * g.n; ++i) ids.push_back(int32_t((i * 37 + 11) % g.vocab));
              Tensor out = r.alloc(Shape{g.rows, g.cols});
              r.b.gather_sum(r.up_i32(r.ints(ids)).reshape(Shape{g.rows, g.n}), r.weight(table), g.scale, out);
              return Outputs{output("out", r.host(out), r.act, g.n)};
            });
}

constexpr int kBits[] = {2, 3, 4, 5, 6, 8};

void quantized_products(Table& t) {
  for (int bits : kBits)
    for (int group : {32, 64, 128})
      for (int64_t k : {int64_t(3 * group + (group == 32 ? 64 : 0)), int64_t(4224)})
        for (int64_t m : {1, 9, 33})
          for (DType out_type : kFloatTypes)
            t.add("matmul", fmt::format("{} q{} g{}", dims({m, 31, k}), bits, group), kBf16, out_type, [=](OpRun& r) {
              const Tensor w = r.quantized(Shape{31, k}, bits, group), x = r.random(Shape{m, k});
              Tensor out = r.alloc_out(Shape{m, 31});
              r.b.matmul(product_input(r, x, bits), product_weight(r, w, m), out);
              return Outputs{product_output("out", r.host(out), r.out, k, bits, m)};
            });
  for (int bits : kBits) {
    const int group = bits == 4 ? 64 : bits % 2 ? 128 : 32;
    for (int64_t m : {1, 3, 9, 32, 40})
      for (DType out_type : kFloatTypes) {
        t.add("matmul_many", fmt::format("{} q{} g{}", dims({m, 31 + 64 + 9 + 3, 640}), bits, group), kBf16, out_type,
              [=](OpRun& r) {
                const Tensor x = r.random(Shape{m, 640});
                std::vector<MatmulProduct> products;
                for (int64_t n : {31, 64, 9, 3})
                  products.push_back(
                      {product_weight(r, r.quantized(Shape{n, 640}, bits, group), m), r.alloc_out(Shape{m, n})});
                r.b.matmul_many(product_input(r, x, bits), products);
                Outputs outs;
                for (size_t i = 0; i < products.size(); ++i)
                  outs.push_back(
                      product_output(fmt::format("out {}", i), r.host(products[i].out), r.out, 640, bits, m));
                return outs;
              });
        for (Activation act : {Activation::silu, Activation::gelu_tanh})
          t.add("glu_matmul", fmt::format("{} q{} g{} {}", dims({m, 45, 2560}), bits, group, act_name(act)), kBf16,
                out_type, [=](OpRun& r) {
                  const Tensor gate = r.quantized(Shape{45, 2560}, bits, group),
                               up = r.quantized(Shape{45, 2560}, bits, group);
                  const Tensor x = r.random(Shape{m, 2560}, 0.05f);  // gates of a few units, where both bend
                  Tensor out = r.alloc_out(Shape{m, 45});
                  r.b.glu_matmul(product_input(r, x, bits), product_weight(r, gate, m), product_weight(r, up, m), act,
                                 out);
                  return Outputs{product_output("out", r.host(out), r.out, 2560, bits, m)};
                });
      }
  }
  for (int bits : {2, 3, 4, 8})
    for (int64_t m : {1, 2, 3})
      t.add("matmul_residual_norm", fmt::format("{} q{} g64", dims({m, 160, 4096}), bits), kBf16, [=](OpRun& r) {
        const Tensor x = r.random(Shape{m, 4096}, 0.5f), w = r.quantized(Shape{160, 4096}, bits, 64);
        ResidualInputs in = residual_inputs(r, m, 160, true, true, false);
        in.args.block_out = r.alloc(Shape{m, 160});
        r.b.matmul_residual_norm(product_input(r, x, bits), product_weight(r, w, m), in.args);
        Outputs outs = residual_outputs(r, in.args, 4096);
        outs.push_back(output("block_out", r.host(in.args.block_out), r.act, 4096));
        return outs;
      });
  for (int bits : kBits)
    for (int group : {32, 64})
      for (DType out_type : kFloatTypes)
        t.add("embed", fmt::format("53x192 q{} g{} scale 3", bits, group), out_type, [=](OpRun& r) {
          const Tensor table = r.quantized(Shape{53, 192}, bits, group);
          std::vector<int32_t> ids;
          for (int i = 0; i < 7; ++i) ids.push_back((i * 13 + 5) % 53);
          Tensor out = r.alloc(Shape{7, 192});
          r.b.embed(r.up_i32(r.ints(ids)), r.weight(table), 3.0f, out);
          return Outputs{output("out", r.host(out), r.act)};
        });
}

}  // namespace kiln::test::op_cases
