// Every op of the op interface on the CUDA backend against the CPU reference: the table of
// op_table.cpp (each op × shapes with odd sizes × the dtypes it takes), each output held to the
// tolerance of op_tolerance.h (what a naive bf16 implementation's rounding costs, times a small
// factor, plus a floor). Skipped, visibly, where no GPU is present.
#include <gtest/gtest.h>

#include <memory>

#include "backend/cuda/cuda_backend.h"
#include "op_table.h"

namespace kiln::test {
namespace {

class GpuOps : public testing::TestWithParam<OpCase> {
 protected:
  // One backend for the whole table (creating one takes a while); a case that leaves it in error
  // fails, and the next case gets a fresh one.
  static std::unique_ptr<Backend>& shared() {
    static std::unique_ptr<Backend> gpu;
    return gpu;
  }
  static void TearDownTestSuite() { shared().reset(); }
};

TEST_P(GpuOps, MatchesTheReference) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<Backend>& gpu = shared();
  if (!gpu) {
    auto made = make_cuda_backend(0);
    ASSERT_TRUE(made.ok()) << made.error().message;
    gpu = std::move(made).value();
  }
  const std::vector<OpCheck> checks = run_op_case(GetParam(), *gpu, /*cpu_threads=*/4);
  ASSERT_FALSE(checks.empty()) << GetParam().label() << ": no outputs";
  for (const OpCheck& check : checks) EXPECT_TRUE(check.comparison.passed()) << describe(check.what, check.comparison);
  const Status status = gpu->status();
  if (!status.ok()) {
    ADD_FAILURE() << GetParam().label() << ": " << status.error().message;
    gpu.reset();
  }
}

INSTANTIATE_TEST_SUITE_P(Table, GpuOps, testing::ValuesIn(op_table()),
                         [](const testing::TestParamInfo<OpCase>& info) { return info.param.name(); });

}  // namespace
}  // namespace kiln::test
