// Every mixture-of-experts fixture on the CPU in bf16 emulation (the GPU's rounding): deviations
// from the f32 path beyond the dense fixtures' tolerance are expert-choice ties (see moe_parity.h).
#include "backend/cpu/cpu_backend.h"
#include "moe_parity.h"

namespace kiln::test {
namespace {

class Bf16MoeParity : public testing::TestWithParam<std::string> {};

TEST_P(Bf16MoeParity, DeviationsAreExpertTies) {
  CpuBackend f32(2), bf16(2, /*emulate_bf16=*/true);
  expect_deviations_are_expert_ties(f32, bf16, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Bf16MoeParity, testing::ValuesIn(moe_fixtures()),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace kiln::test
