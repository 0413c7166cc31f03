// Every mixture-of-experts fixture on the CPU in bf16 emulation (the GPU's rounding): deviations
// from the f32 path beyond the dense fixtures' tolerance are expert-choice ties (see moe_parity.h).
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "io/safetensors.h"
#include "moe_parity.h"

namespace kiln::test {
namespace {

class Bf16MoeParity : public testing::TestWithParam<std::string> {};

TEST_P(Bf16MoeParity, DeviationsAreExpertTies) {
  CpuBackend f32(2), bf16(2, /*emulate_bf16=*/true);
  expect_deviations_are_expert_ties(f32, bf16, GetParam());
}

// Scales every router of the checkpoint in `dir` by `factor` (a quantized router through its scales
// and biases: s·q + b scales as a whole).
void scale_routers(const std::string& dir, float factor) {
  auto is_router = [](const std::string& name) {
    for (const char* module : {"router.proj.", "mlp.gate."})
      for (const char* part : {"weight", "scales", "biases"})
        if (name.size() >= std::string(module).size() + std::string(part).size() &&
            name.ends_with(std::string(module) + part))
          return true;
    return false;
  };
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    std::vector<NamedTensor> tensors;
    {
      auto file = SafetensorsFile::open(entry.path().string());
      ASSERT_TRUE(file.ok()) << file.error().message;
      for (const auto& info : (*file)->tensors()) {
        auto view = (*file)->view(info);
        ASSERT_TRUE(view.ok());
        Tensor copy = host_tensor(view->dtype(), view->shape());
        if (is_router(info.name) && view->dtype() != DType::u32) {
          Tensor f = host_tensor(DType::f32, view->shape());
          convert_host(*view, DType::f32, f.data());
          for (int64_t i = 0; i < f.numel(); ++i) f.data_as<float>()[i] *= factor;
          convert_host(f, view->dtype(), copy.data());
        } else {
          std::memcpy(copy.data(), view->data(), view->nbytes());
        }
        tensors.push_back({info.name, copy});
      }
    }
    ASSERT_TRUE(write_safetensors(entry.path().string(), tensors).ok());
  }
}

// The same checkpoints with their routers 30 times narrower than the fixtures draw them: spread like
// the other matrices, as in trained models, so that near-ties in the choice of experts occur.
TEST_P(Bf16MoeParity, NarrowRoutersDeviateOnlyAtTies) {
  TempDir tmp;
  const std::string dir = tmp.copy_fixture(GetParam());
  scale_routers(dir, 1.0f / 30.0f);
  CpuBackend f32(2), bf16(2, /*emulate_bf16=*/true);
  expect_deviations_are_expert_ties(f32, bf16, GetParam(), dir);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Bf16MoeParity, testing::ValuesIn(moe_fixtures()),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace kiln::test
