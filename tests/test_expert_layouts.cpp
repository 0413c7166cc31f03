// The expert layouts found in checkpoints load to the same model: transformers' fused
// gate_up_proj / down_proj, one tensor per expert, and mlx-lm's stacked switch projections.
#include <cstring>
#include <map>

#include "backend/cpu/cpu_backend.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "runtime/prefill.h"
#include "test_util.h"

namespace kiln::test {
namespace {

using TensorMap = std::map<std::string, Tensor>;

TensorMap read_all(const std::string& dir) {
  TensorMap out;
  auto file = SafetensorsFile::open(dir + "/model.safetensors");
  EXPECT_TRUE(file.ok());
  for (const auto& info : (*file)->tensors()) {
    auto view = (*file)->view(info);
    Tensor copy = host_tensor(view->dtype(), view->shape());
    std::memcpy(copy.data(), view->data(), view->nbytes());
    out[info.name] = copy;
  }
  return out;
}

void write_all(const std::string& dir, const TensorMap& tensors) {
  std::vector<NamedTensor> list;
  for (const auto& [name, t] : tensors) list.push_back({name, t});
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", list).ok());
}

Tensor stack(const std::vector<Tensor>& parts) {
  Shape shape = parts[0].shape();
  Tensor out = host_tensor(parts[0].dtype(), Shape{int64_t(parts.size()), shape[0], shape[1]});
  for (size_t i = 0; i < parts.size(); ++i)
    std::memcpy(static_cast<char*>(out.data()) + i * parts[i].nbytes(), parts[i].data(), parts[i].nbytes());
  return out;
}

// [E, I, H] gate and up into transformers' fused [E, 2I, H], gate rows first.
Tensor fuse(const Tensor& gate, const Tensor& up) {
  const int64_t e = gate.dim(0), i = gate.dim(1), h = gate.dim(2);
  Tensor out = host_tensor(gate.dtype(), Shape{e, 2 * i, h});
  const size_t block = gate.nbytes() / size_t(e);
  for (int64_t x = 0; x < e; ++x) {
    std::memcpy(static_cast<char*>(out.data()) + 2 * x * block, static_cast<const char*>(gate.data()) + x * block,
                block);
    std::memcpy(static_cast<char*>(out.data()) + (2 * x + 1) * block, static_cast<const char*>(up.data()) + x * block,
                block);
  }
  return out;
}

std::vector<float> logits_of(const std::string& dir) {
  CpuBackend backend(2);
  auto model = load_model(dir, backend);
  EXPECT_TRUE(model.ok()) << (model.ok() ? "" : model.error().message);
  const auto ids = fixture_ids("qwen3_5_moe");
  std::vector<int32_t> prompt(ids.begin(), ids.begin() + 40);
  auto state = (*model)->new_sequence(64);
  auto logits = run_tokens(**model, **state, prompt, 0, LogitRows::all);
  EXPECT_TRUE(logits.ok());
  return std::vector<float>(logits->data_as<float>(), logits->data_as<float>() + logits->numel());
}

TEST(ExpertLayouts, QwenPerExpertFusedAndStackedAgree) {
  TempDir tmp;
  const auto per_expert = tmp.copy_fixture("qwen3_5_moe");  // as transformers saves Qwen 3.5 MoE
  const auto tensors = read_all(per_expert);
  const int64_t n_experts = read_json(per_expert + "/config.json")["text_config"]["num_experts"];
  const int64_t n_layers = read_json(per_expert + "/config.json")["text_config"]["num_hidden_layers"];

  TensorMap fused, stacked;
  for (const auto& [name, t] : tensors)
    if (name.find(".mlp.experts.") == std::string::npos) fused[name] = stacked[name] = t;
  for (int64_t l = 0; l < n_layers; ++l) {
    const std::string p = "model.language_model.layers." + std::to_string(l) + ".mlp.";
    std::map<std::string, std::vector<Tensor>> parts;
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"})
      for (int64_t e = 0; e < n_experts; ++e)
        parts[proj].push_back(tensors.at(p + "experts." + std::to_string(e) + "." + proj + ".weight"));
    Tensor gate = stack(parts["gate_proj"]), up = stack(parts["up_proj"]), down = stack(parts["down_proj"]);
    fused[p + "experts.gate_up_proj"] = fuse(gate, up);
    fused[p + "experts.down_proj"] = down;
    stacked[p + "switch_mlp.gate_proj.weight"] = gate;
    stacked[p + "switch_mlp.up_proj.weight"] = up;
    stacked[p + "switch_mlp.down_proj.weight"] = down;
  }
  write_all(tmp.copy_fixture("qwen3_5_moe", "fused"), fused);
  write_all(tmp.copy_fixture("qwen3_5_moe", "stacked"), stacked);

  const auto reference = logits_of(per_expert);
  EXPECT_EQ(logits_of(tmp.path() + "/fused"), reference);
  EXPECT_EQ(logits_of(tmp.path() + "/stacked"), reference);
}

TEST(ExpertLayouts, GemmaSwitchGluAndFusedAgree) {
  TempDir tmp;
  const auto mlx = tmp.copy_fixture("gemma4_moe");  // mlx-lm's switch_glu layout
  const auto tensors = read_all(mlx);
  TensorMap fused;
  for (const auto& [name, t] : tensors) {
    const auto at = name.find(".experts.switch_glu.");
    if (at == std::string::npos) {
      fused[name] = t;
      continue;
    }
    const std::string base = name.substr(0, at) + ".experts.";
    if (name.ends_with("gate_proj.weight"))
      fused[base + "gate_up_proj"] = fuse(t, tensors.at(name.substr(0, at) + ".experts.switch_glu.up_proj.weight"));
    if (name.ends_with("down_proj.weight")) fused[base + "down_proj"] = t;
  }
  write_all(tmp.copy_fixture("gemma4_moe", "fused"), fused);

  CpuBackend backend(2);
  std::vector<std::vector<float>> results;
  for (const auto& dir : {mlx, tmp.path() + "/fused"}) {
    auto model = load_model(dir, backend);
    ASSERT_TRUE(model.ok()) << model.error().message;
    const auto ids = fixture_ids("gemma4_moe");
    auto state = (*model)->new_sequence(64);
    auto logits = run_tokens(**model, **state, std::vector<int32_t>(ids.begin(), ids.begin() + 40), 0, LogitRows::all);
    ASSERT_TRUE(logits.ok());
    results.emplace_back(logits->data_as<float>(), logits->data_as<float>() + logits->numel());
  }
  EXPECT_EQ(results[0], results[1]);
}

}  // namespace
}  // namespace kiln::test
