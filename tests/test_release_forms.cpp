// Checkpoints as they are released: every tensor accounted for (used by the model, held by the
// reference without use, or part of a tower or head that is set aside and reported), sidecar
// files, the wrappers' own settings, the family registry, and named activations.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "backend/cpu/cpu_backend.h"
#include "core/npy.h"
#include "io/safetensors.h"
#include "models/activation_dump.h"
#include "models/family.h"
#include "models/model.h"
#include "runtime/prefill.h"
#include "test_util.h"

namespace kiln::test {
namespace {

std::vector<NamedTensor> read_tensors(const std::string& path) {
  std::vector<NamedTensor> tensors;
  auto file = SafetensorsFile::open(path);
  EXPECT_TRUE(file.ok());
  if (!file.ok()) return tensors;
  for (const auto& info : (*file)->tensors()) {
    auto view = (*file)->view(info);
    Tensor copy = host_tensor(view->dtype(), view->shape());
    std::memcpy(copy.data(), view->data(), view->nbytes());
    tensors.push_back({info.name, copy});
  }
  return tensors;
}

Tensor zeros(Shape shape) {
  Tensor t = host_tensor(DType::f32, shape);
  std::memset(t.data(), 0, t.nbytes());
  return t;
}

void add_tensors(const std::string& dir, std::vector<NamedTensor> extra) {
  const std::string path = dir + "/model.safetensors";
  auto tensors = read_tensors(path);
  tensors.insert(tensors.end(), extra.begin(), extra.end());
  ASSERT_TRUE(write_safetensors(path, tensors).ok());
}

Result<std::unique_ptr<Model>> load(const std::string& dir, CpuBackend& backend) {
  return load_model(dir, backend);
}

std::vector<std::string> part_names(const Model& model) {
  std::vector<std::string> out;
  for (const auto& p : model.set_aside()) out.push_back(p.part);
  return out;
}

TEST(ReleaseForms, EveryModelTypeBelongsToOneFamily) {
  std::set<std::string> seen;
  for (const ModelFamily* f : model_families()) {
    EXPECT_EQ(family_named(f->name), f);
    EXPECT_TRUE(f->load && f->checkpoint_tensors && f->quantize.mlx_layout && f->quantize.eight_bit) << f->name;
    for (const auto& e : f->model_types) {
      EXPECT_TRUE(seen.insert(e.model_type).second) << e.model_type << " is claimed twice";
      for (const auto& text : e.text_model_types) EXPECT_NE(f->entry(text), nullptr) << text;
    }
  }
  for (const char* type : {"gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text", "qwen3_5", "qwen3_5_text",
                           "qwen3_5_moe", "qwen3_5_moe_text"})
    EXPECT_TRUE(seen.count(type)) << type;
}

TEST(ReleaseForms, TowersAreSetAsideAndReported) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("gemma4_dense");
  add_tensors(dir, {{"model.vision_tower.encoder.layers.0.mlp.fc1.weight", zeros(Shape{4, 4})},
                    {"model.embed_vision.embedding_projection.weight", zeros(Shape{4, 4})},
                    {"model.audio_tower.layers.0.norm.weight", zeros(Shape{4})}});
  CpuBackend backend(1);
  auto model = load(dir, backend);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const auto parts = part_names(**model);
  EXPECT_EQ(parts, (std::vector<std::string>{"audio encoder", "vision encoder"}));
  for (const auto& p : (*model)->set_aside()) EXPECT_GT(p.tensors, 0u);
}

TEST(ReleaseForms, AnUnknownTensorIsAnErrorNamingIt) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("qwen3_5_dense");
  add_tensors(dir, {{"model.layers.0.mlp.extra_proj.weight", zeros(Shape{4, 4})}});
  CpuBackend backend(1);
  auto model = load(dir, backend);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.error().message.find("model.layers.0.mlp.extra_proj.weight"), std::string::npos)
      << model.error().message;
  EXPECT_EQ(model.error().message.find('\n'), std::string::npos);
}

// (A vision tower in optiq_vision.safetensors is read and used: test_qwen_vision.cpp.)
TEST(ReleaseForms, SidecarFilesAreReadAndSetAside) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("qwen3_5_untied_mlx");
  ASSERT_TRUE(write_safetensors(dir + "/mtp.safetensors",
                                {{"mtp.fc.weight", zeros(Shape{4, 8})}, {"mtp.norm.weight", zeros(Shape{4})}})
                  .ok());
  CpuBackend backend(1);
  auto model = load(dir, backend);
  ASSERT_TRUE(model.ok()) << model.error().message;
  EXPECT_EQ(part_names(**model), (std::vector<std::string>{"MTP head"}));

  // a vision sidecar that holds part of a tower is an error naming what is missing
  auto config = read_json(dir + "/config.json");
  config["vision_config"] = {{"depth", 1}, {"hidden_size", 4}, {"num_heads", 1}, {"out_hidden_size", 64}};
  std::ofstream(dir + "/config.json", std::ios::trunc) << config.dump();
  ASSERT_TRUE(write_safetensors(dir + "/optiq_vision.safetensors",
                                {{"vision_tower.blocks.0.attn.qkv.weight", zeros(Shape{4, 4})}})
                  .ok());
  auto partial = load(dir, backend);
  ASSERT_FALSE(partial.ok());
  EXPECT_NE(partial.error().message.find("vision_tower.patch_embed.proj.weight"), std::string::npos)
      << partial.error().message;
  std::filesystem::remove(dir + "/optiq_vision.safetensors");

  // a sidecar whose header is broken is an error naming it, not a silent drop
  std::ofstream(dir + "/mtp.safetensors", std::ios::trunc) << "not a safetensors file";
  auto broken = load(dir, backend);
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.error().message.find("mtp.safetensors"), std::string::npos) << broken.error().message;
}

TEST(ReleaseForms, AConfigSectionAloneIsReported) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("gemma4_keqv");  // a gemma4 wrapper with "vision_config"
  CpuBackend backend(1);
  auto model = load(dir, backend);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const auto parts = part_names(**model);
  EXPECT_NE(std::find(parts.begin(), parts.end(), "vision encoder"), parts.end());
}

TEST(ReleaseForms, AnUnknownModelTypeIsRefusedByName) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("qwen3_5_dense");
  auto config = read_json(dir + "/config.json");
  config["model_type"] = "llama";
  std::ofstream(dir + "/config.json", std::ios::trunc) << config.dump();
  CpuBackend backend(1);
  auto model = load(dir, backend);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.error().message.find("'llama'"), std::string::npos) << model.error().message;
}

// The wrapper classes tie the head by their own top-level setting (transformers builds the head
// from the wrapper's config), whatever text_config says.
TEST(ReleaseForms, AWrappersTopLevelTieDecides) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("qwen3_5_untied_mlx");  // untied, stored with its lm_head
  auto config = read_json(dir + "/config.json");
  ASSERT_TRUE(config.contains("text_config"));
  config["text_config"]["tie_word_embeddings"] = true;
  config["tie_word_embeddings"] = false;
  std::ofstream(dir + "/config.json", std::ios::trunc) << config.dump();
  const auto ids = fixture_ids("qwen3_5_untied_mlx");
  CpuBackend backend(2);
  auto model = load(dir, backend);
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto state = (*model)->new_sequence(int64_t(ids.size()));
  ASSERT_TRUE(state.ok());
  auto logits = run_tokens(**model, **state, ids, int64_t(ids.size()), LogitRows::all);
  ASSERT_TRUE(logits.ok());
  auto want = read_npy(fixture_path("qwen3_5_untied_mlx") + "/logits.npy");
  ASSERT_TRUE(want.ok());
  auto c = compare_logits(logits->data_as<float>(), want->f32.data(), int64_t(ids.size()), logits->dim(1));
  EXPECT_LE(c.max_abs_diff, 1e-4 * c.max_abs_reference);
}

// kiln logits --dump: the named activations of one forward equal those of the same prompt fed in
// chunks, and the last ones are the logits themselves.
TEST(ReleaseForms, NamedActivationsDoNotDependOnChunking) {
  for (const char* fixture : {"gemma4_moe", "qwen3_5_moe"}) {
    const auto ids = fixture_ids(fixture);
    const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 24);
    CpuBackend backend(2);
    ActivationRecorder whole, chunked;
    for (auto [recorder, chunk] : {std::pair{&whole, int64_t(24)}, std::pair{&chunked, int64_t(7)}}) {
      auto model = load_model(fixture_path(fixture), backend, ModelOptions{.max_chunk_tokens = chunk});
      ASSERT_TRUE(model.ok()) << model.error().message;
      (*model)->set_activation_dump(recorder);
      auto state = (*model)->new_sequence(24);
      auto logits = run_tokens(**model, **state, prompt, chunk, LogitRows::all);
      ASSERT_TRUE(logits.ok());
      const auto* dumped = recorder->find("logits");
      ASSERT_NE(dumped, nullptr);
      ASSERT_EQ(dumped->rows, 24);
      EXPECT_EQ(std::memcmp(dumped->data.data(), logits->data_as<float>(), size_t(logits->numel()) * 4), 0);
    }
    for (const char* name : {"embed_tokens", "layers.0", "layers.1.mlp", "layers.1.router_logits", "norm"}) {
      const auto* a = whole.find(name);
      const auto* b = chunked.find(name);
      ASSERT_TRUE(a && b) << fixture << " " << name;
      ASSERT_EQ(a->data.size(), b->data.size()) << name;
      double diff = 0, scale = 1e-30;
      for (size_t i = 0; i < a->data.size(); ++i) {
        diff = std::max(diff, double(std::fabs(a->data[i] - b->data[i])));
        scale = std::max(scale, double(std::fabs(a->data[i])));
      }
      EXPECT_LE(diff, 1e-4 * scale) << fixture << " " << name;
    }
  }
}

}  // namespace
}  // namespace kiln::test
