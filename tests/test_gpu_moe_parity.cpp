// The CUDA backend on every mixture-of-experts fixture: deviations from the CPU f32 path beyond the
// dense fixtures' tolerance are expert-choice ties (see moe_parity.h). Skipped, visibly, without a
// GPU.
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "moe_parity.h"

namespace kiln::test {
namespace {

class GpuMoeParity : public testing::TestWithParam<std::string> {};

TEST_P(GpuMoeParity, DeviationsAreExpertTies) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  CpuBackend cpu(4);
  auto gpu = make_cuda_backend(0);
  ASSERT_TRUE(gpu.ok());
  expect_deviations_are_expert_ties(cpu, **gpu, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuMoeParity, testing::ValuesIn(moe_fixtures()),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace kiln::test
