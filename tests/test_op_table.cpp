// The backend op table and its tolerance rule, without a GPU: the rule's arithmetic, that the bf16
// emulation gives tolerances of the size bf16 rounding should (nonzero, a few ulps), that the rule
// catches a wrong result, that the table covers every op, and that every case runs and passes with
// the emulating CPU backend standing in for the device (which checks each case's plumbing: the
// three runs draw the same inputs and give outputs of one shape).
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "op_table.h"

namespace kiln::test {
namespace {

const OpCase& find_case(const std::vector<OpCase>& table, const std::string& label) {
  for (const OpCase& c : table)
    if (c.label() == label) return c;
  ADD_FAILURE() << "no case " << label;
  return table.front();
}

Tensor values(std::vector<float> v) {
  Tensor t = host_tensor(DType::f32, Shape{int64_t(v.size())});
  std::copy(v.begin(), v.end(), t.data_as<float>());
  return t;
}

TEST(OpTolerance, UnitsInTheLastPlace) {
  EXPECT_EQ(ulp(DType::bf16, 1.0), std::ldexp(1.0, -7));
  EXPECT_EQ(ulp(DType::bf16, 3.0), std::ldexp(1.0, -6));
  EXPECT_EQ(ulp(DType::f32, 1.0), std::ldexp(1.0, -23));
  EXPECT_EQ(ulp(DType::f32, 0.75), std::ldexp(1.0, -24));
  EXPECT_EQ(ulp(DType::bf16, 0.0), 0.0);
}

TEST(OpTolerance, TheRule) {
  const Tensor ref = values({1.0f, -2.0f, 0.5f}), emu = values({1.0f, -2.0f, 0.5f + 0.01f});
  // bf16 output, elementwise: 2 × 0.01 + ulp(bf16, 2) / 2 + 32 · 2^-24 · 2
  Comparison c = compare(values({1.0f, -2.0f, 0.52f}), ref, emu, DType::bf16, 1, false);
  EXPECT_NEAR(c.tolerance, 2 * c.emu_error + std::ldexp(1.0, -7) + 32 * std::ldexp(2.0, -24), 1e-12);
  EXPECT_NEAR(c.emu_error, 0.01, 1e-6);
  EXPECT_NEAR(c.max_error, 0.02, 1e-6);
  EXPECT_EQ(c.worst, 2);
  EXPECT_TRUE(c.passed());
  // beyond it
  c = compare(values({1.0f, -2.05f, 0.5f}), ref, emu, DType::bf16, 1, false);
  EXPECT_FALSE(c.passed());
  EXPECT_EQ(c.worst, 1);
  EXPECT_NE(describe("case", c).find("tolerance"), std::string::npos);
  // a sum of 4096 terms in f32 may differ in its order: 32 · 2^-24 · 64 of max |ref|
  c = compare(ref, ref, ref, DType::f32, 4096, false);
  EXPECT_NEAR(c.tolerance, std::ldexp(1.0, -23) + 32 * 64 * std::ldexp(2.0, -24), 1e-12);
  // NaN, infinity, and exact outputs
  EXPECT_FALSE(compare(values({1.0f, NAN, 0.5f}), ref, ref, DType::bf16, 1, false).passed());
  EXPECT_FALSE(compare(values({1.0f, -INFINITY, 0.5f}), ref, ref, DType::bf16, 1, false).passed());
  EXPECT_TRUE(
      compare(values({1.0f, -INFINITY}), values({1.0f, -INFINITY}), values({1.0f, -INFINITY}), DType::f32, 1, false)
          .passed());
  EXPECT_FALSE(compare(values({1.0f, -2.0f, 0.5000001f}), ref, ref, DType::f32, 1, true).passed());
  EXPECT_TRUE(compare(ref, ref, ref, DType::f32, 1, true).passed());
  EXPECT_FALSE(compare(values({1.0f}), ref, ref, DType::f32, 1, false).passed());
}

// The emulation of a bf16 norm differs from the f32 reference by its output's rounding: half a
// bf16 ulp of the larger values at most, and about that over a few thousand values. The f32 case
// gets the floor alone: an f32 ulp and the order of a 127-term sum.
TEST(OpTolerance, TheEmulationsRoundingSetsTheTolerance) {
  const std::vector<OpCase> table = op_table();
  CpuBackend device(2, true);
  const auto bf16 = run_op_case(find_case(table, "rms_norm 33x127 weight bf16"), device);
  ASSERT_EQ(bf16.size(), 1u);
  const Comparison& c = bf16[0].comparison;
  EXPECT_GT(c.emu_error, std::ldexp(c.max_ref, -11)) << describe(bf16[0].what, c);
  EXPECT_LE(c.emu_error, ulp(DType::bf16, c.max_ref) / 2) << describe(bf16[0].what, c);
  EXPECT_LT(c.tolerance, std::ldexp(c.max_ref, -5)) << describe(bf16[0].what, c);
  EXPECT_TRUE(c.passed()) << describe(bf16[0].what, c);
  const auto f32 = run_op_case(find_case(table, "rms_norm 33x127 weight f32"), device);
  ASSERT_EQ(f32.size(), 1u);
  EXPECT_EQ(f32[0].comparison.emu_error, 0.0);
  EXPECT_GT(f32[0].comparison.tolerance, 0.0);
  EXPECT_LT(f32[0].comparison.tolerance, 3e-5 * f32[0].comparison.max_ref);  // 32 · 2^-24 · √127 ≈ 2.2e-5
  EXPECT_EQ(f32[0].comparison.max_error, 0.0);                               // the same code on the same inputs
}

// The integer products' int16 inputs, emulated, move an f32 product by far less than bf16 would.
TEST(OpTolerance, Int16InputsAreEmulated) {
  const std::vector<OpCase> table = op_table();
  CpuBackend device(2, true);
  const auto checks = run_op_case(find_case(table, "matmul 9x31x4224 q4 g64 bf16->f32"), device);
  ASSERT_EQ(checks.size(), 1u);
  const Comparison& c = checks[0].comparison;
  EXPECT_GT(c.emu_error, 0.0) << describe(checks[0].what, c);
  EXPECT_LT(c.emu_error, 1e-4 * c.max_ref) << describe(checks[0].what, c);
  EXPECT_TRUE(c.passed()) << describe(checks[0].what, c);
}

TEST(OpTable, CoversEveryOpWithUniqueNames) {
  std::set<std::string> ops, names;
  for (const OpCase& c : op_table()) {
    ops.insert(c.op);
    EXPECT_TRUE(names.insert(c.name()).second) << "two cases named " << c.name();
  }
  for (const char* op : {"matmul",
                         "matmul_many",
                         "glu_matmul",
                         "matmul_residual_norm",
                         "embed",
                         "rms_norm",
                         "rms_norm_gated",
                         "add",
                         "residual_norm",
                         "scale",
                         "glu",
                         "sigmoid_mul",
                         "add_sigmoid_gated",
                         "softcap",
                         "argmax",
                         "top_k",
                         "rope",
                         "kv_write",
                         "attention_inputs",
                         "attention",
                         "causal_conv1d",
                         "gated_delta",
                         "moe_route",
                         "moe_experts"})
    EXPECT_TRUE(ops.count(op)) << op << " has no case";
}

// Each case with the emulating CPU backend as the device: its outputs are the emulation's own (up
// to the integer products' inputs, which only the emulation run rounds), so every case must pass,
// and every bf16 output of a few hundred values or more must get a nonzero tolerance from it.
class OpTableOnCpu : public testing::TestWithParam<OpCase> {};

TEST_P(OpTableOnCpu, PassesWithTheEmulationAsDevice) {
  CpuBackend device(2, true);
  const std::vector<OpCheck> checks = run_op_case(GetParam(), device);
  ASSERT_FALSE(checks.empty());
  for (const OpCheck& check : checks) {
    EXPECT_TRUE(check.comparison.passed()) << describe(check.what, check.comparison);
    if (!check.exact && check.type == DType::bf16 && check.comparison.count >= 256 && check.comparison.max_ref > 0) {
      EXPECT_GT(check.comparison.emu_error, 0.0) << describe(check.what, check.comparison);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Table, OpTableOnCpu, testing::ValuesIn(op_table()),
                         [](const testing::TestParamInfo<OpCase>& info) { return info.param.name(); });

}  // namespace
}  // namespace kiln::test
