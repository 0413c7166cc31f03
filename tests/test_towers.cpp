// The parts a release-form config describes beside the language model (vision and audio towers,
// their embedders, Qwen's MTP head): their tensor listings for every released geometry, checked
// against the published checkpoints' parameter totals, and `kiln synth-model` writing a wrapper
// checkpoint that `kiln logits` loads with those parts set aside.
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "io/config.h"
#include "models/family.h"
#include "models/model.h"
#include "test_util.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

std::string release_dir() {
  return source_dir() + "/models/configs/release";
}

std::vector<std::string> release_configs() {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(release_dir()))
    if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<CheckpointTensor> parts_of(const ModelConfigFile& config) {
  auto parts = checkpoint_part_tensors(config);
  EXPECT_TRUE(parts.ok()) << (parts.ok() ? "" : parts.error().message);
  return parts.ok() ? *parts : std::vector<CheckpointTensor>{};
}

std::map<std::string, Shape> by_name(const std::vector<CheckpointTensor>& tensors) {
  std::map<std::string, Shape> out;
  for (const auto& t : tensors) out[t.name] = t.shape;
  return out;
}

// Parameters of the listed tensors that have at least one dimension.
int64_t parameters(const std::vector<CheckpointTensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors)
    if (t.shape.rank() > 0) n += t.shape.numel();
  return n;
}

ModelConfigFile config_from(const nlohmann::json& root) {
  TempDir tmp;
  const std::string path = tmp.path() + "/config.json";
  std::ofstream(path) << root.dump();
  auto config = read_model_config_file(path);
  EXPECT_TRUE(config.ok()) << (config.ok() ? "" : config.error().message);
  return config.ok() ? *config : ModelConfigFile{};
}

class TowersRelease : public testing::TestWithParam<std::string> {};

TEST_P(TowersRelease, ListingIsWellFormed) {
  auto config = read_model_config_file(release_dir() + "/" + GetParam() + ".json");
  ASSERT_TRUE(config.ok()) << config.error().message;
  ASSERT_TRUE(config->wrapped);
  const auto parts = parts_of(*config);
  ASSERT_FALSE(parts.empty());
  auto text = checkpoint_tensors(*config);
  ASSERT_TRUE(text.ok()) << text.error().message;
  std::set<std::string> names;
  for (const auto& t : *text) names.insert("model.language_model." + t.name.substr(6));
  for (const auto& t : parts) {
    EXPECT_TRUE(names.insert(t.name).second) << t.name << " is listed twice";
    bool known = false;
    for (const char* prefix : {"model.vision_tower.", "model.embed_vision.", "model.vision_embedder.", "model.audio_tower.", "model.embed_audio.",
                               "model.visual.", "mtp."})
      known = known || t.name.rfind(prefix, 0) == 0;
    EXPECT_TRUE(known) << t.name;
    for (int d = 0; d < t.shape.rank(); ++d) EXPECT_GT(t.shape[d], 0) << t.name << " " << t.shape.str();
    // only the clip bounds of Gemma 4's clippable linears are scalars
    if (t.shape.rank() == 0) {
      const std::string bound = t.name.substr(t.name.rfind('.') + 1);
      EXPECT_TRUE(bound == "input_min" || bound == "input_max" || bound == "output_min" || bound == "output_max")
          << t.name;
    }
  }
}

// The listed parts' parameters equal the published checkpoint total less the language model
// (models/configs/SOURCES.md: Hugging Face's safetensors totals and the text decoders computed from
// the flat configs; for e2b/e4b the text count includes the K/V projections the KV-sharing layers
// carry in the released files). The published totals leave out the clip bounds' 0-d tensors.
TEST_P(TowersRelease, ParametersMatchThePublishedCheckpoint) {
  const std::map<std::string, int64_t> published = {
      {"gemma4-e2b", 5'123'178'051 - 4'647'449'891},        {"gemma4-e4b", 7'996'156'490 - 7'518'069'034},
      {"gemma4-12b", 11'959'730'224 - 11'907'350'320},      {"gemma4-26b-a4b", 25'805'936'206 - 25'233'141'790},
      {"gemma4-31b", 31'273'088'876 - 30'697'345'340},      {"qwen3.5-0.8b", 873'438'784 - 752'393'024},
      {"qwen3.5-2b", 2'274'069'824 - 1'881'825'088},        {"qwen3.5-4b", 4'659'865'088 - 4'205'751'296},
      {"qwen3.5-9b", 9'653'104'368 - 8'953'803'264},        {"qwen3.5-27b", 27'781'427'952 - 26'895'998'464},
      {"qwen3.5-35b-a3b", 35'951'822'704 - 34'660'610'688}, {"qwen3.5-122b-a10b", 125'086'497'008 - 122'111'526'912},
  };
  auto it = published.find(GetParam());
  ASSERT_NE(it, published.end()) << "no published total for " << GetParam();
  auto config = read_model_config_file(release_dir() + "/" + GetParam() + ".json");
  ASSERT_TRUE(config.ok()) << config.error().message;
  EXPECT_EQ(parameters(parts_of(*config)), it->second);
}

// The towers' tensors as transformers' wrapper class holds them for the same config (names and
// shapes, tests/fixtures/release_listings/, written by tools/oracle/run_release_on_device.sh from a
// meta-device model: state-dict names, which the 12B's embedder saves under other names).
TEST_P(TowersRelease, MatchesTransformersListing) {
  const std::string listing_path = source_dir() + "/tests/fixtures/release_listings/" + GetParam() + ".json";
  if (!fs::exists(listing_path)) GTEST_SKIP() << "no transformers listing for " << GetParam();
  const auto listing = read_json(listing_path);
  auto config = read_model_config_file(release_dir() + "/" + GetParam() + ".json");
  ASSERT_TRUE(config.ok()) << config.error().message;
  // transformers' conversion_mapping.py "gemma4_unified": state-dict name -> saved name
  const std::vector<std::pair<std::string, std::string>> saved_as = {
      {"model.embed_vision.multimodal_embedder.embedding_projection", "model.embed_vision.embedding_projection"},
      {"model.embed_vision.patch_ln1", "model.vision_embedder.patch_ln1"},
      {"model.embed_vision.patch_dense", "model.vision_embedder.patch_dense"},
      {"model.embed_vision.patch_ln2", "model.vision_embedder.patch_ln2"},
      {"model.embed_vision.pos_embedding", "model.vision_embedder.pos_embedding"},
      {"model.embed_vision.pos_norm", "model.vision_embedder.pos_norm"},
  };
  std::map<std::string, Shape> want;
  for (const auto& [name, dims] : listing.items()) {
    std::string saved = name;
    if (config->outer_model_type == "gemma4_unified")
      for (const auto& [from, to] : saved_as)
        if (saved.rfind(from, 0) == 0) saved = to + saved.substr(from.size());
    const auto d = dims.get<std::vector<int64_t>>();
    want[saved] = Shape(d.begin(), d.end());
  }
  std::map<std::string, Shape> got;
  for (const auto& t : parts_of(*config))
    if (t.name.rfind("mtp.", 0) != 0) got[t.name] = t.shape;  // transformers builds no MTP head
  for (const auto& [name, shape] : want) {
    auto it = got.find(name);
    if (it == got.end()) {
      ADD_FAILURE() << name << " " << shape.str() << " is in transformers' model, not in kiln's listing";
      continue;
    }
    EXPECT_EQ(it->second, shape) << name;
  }
  for (const auto& [name, shape] : got)
    EXPECT_TRUE(want.count(name)) << name << " " << shape.str() << " is in kiln's listing, not in transformers' model";
}

INSTANTIATE_TEST_SUITE_P(Towers, TowersRelease, testing::ValuesIn(release_configs()), [](const auto& info) {
  std::string name = info.param;
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
});

// Each release config's text_config is the flat config of the same name, with the wrapper's own
// model_type and architectures around it.
TEST(TowersReleaseConfigs, WrapTheFlatConfigs) {
  for (const auto& name : release_configs()) {
    const auto flat = read_json(source_dir() + "/models/configs/" + name + ".json");
    const auto release = read_json(release_dir() + "/" + name + ".json");
    ASSERT_TRUE(release.contains("text_config")) << name;
    const auto& text = release["text_config"];
    for (const auto& [key, value] : flat.items()) {
      if (key == "model_type" || key == "architectures" || !text.contains(key)) continue;
      EXPECT_EQ(text[key], value) << name << " " << key;
    }
    EXPECT_EQ(release["tie_word_embeddings"], flat["tie_word_embeddings"]) << name;
    EXPECT_TRUE(release["vision_config"].is_object()) << name;
  }
}

nlohmann::json fixture_config(const std::string& fixture) {
  nlohmann::json config = read_json(fixture_path(fixture) + "/config.json");
  nlohmann::json text = config.contains("text_config") ? config["text_config"] : config;
  text.erase("architectures");
  return text;
}

TEST(TowersSubConfigs, KeysThatChangeShapes) {
  // Gemma 4: clip buffers only with use_clipped_linears; the embedders take the tower's width
  nlohmann::json gemma = {{"model_type", "gemma4"},
                          {"text_config", fixture_config("gemma4_dense")},
                          {"vision_config",
                           {{"hidden_size", 16},
                            {"intermediate_size", 24},
                            {"num_hidden_layers", 2},
                            {"num_attention_heads", 2},
                            {"num_key_value_heads", 1},
                            {"head_dim", 8},
                            {"position_embedding_size", 32},
                            {"patch_size", 4},
                            {"standardize", true}}},
                          {"audio_config",
                           {{"hidden_size", 32},
                            {"num_hidden_layers", 1},
                            {"num_attention_heads", 4},
                            {"subsampling_conv_channels", {16, 8}},
                            {"conv_kernel_size", 3},
                            {"use_clipped_linears", false},
                            {"output_proj_dims", 48}}}};
  auto g = by_name(parts_of(config_from(gemma)));
  EXPECT_EQ(g["model.vision_tower.patch_embedder.input_proj.weight"], (Shape{16, 48}));
  EXPECT_EQ(g["model.vision_tower.patch_embedder.position_embedding_table"], (Shape{2, 32, 16}));
  EXPECT_EQ(g["model.vision_tower.encoder.layers.1.self_attn.k_proj.linear.weight"], (Shape{8, 16}));
  EXPECT_EQ(g["model.vision_tower.encoder.layers.1.self_attn.q_norm.weight"], (Shape{8}));
  EXPECT_EQ(g["model.vision_tower.encoder.layers.0.mlp.down_proj.linear.weight"], (Shape{16, 24}));
  EXPECT_TRUE(g.count("model.vision_tower.std_scale"));
  EXPECT_FALSE(g.count("model.vision_tower.encoder.layers.0.self_attn.q_proj.input_min"));  // default: not clipped
  EXPECT_EQ(g["model.embed_vision.embedding_projection.weight"], (Shape{64, 16}));
  EXPECT_EQ(g["model.audio_tower.subsample_conv_projection.layer1.conv.weight"], (Shape{8, 16, 3, 3}));
  EXPECT_EQ(g["model.audio_tower.subsample_conv_projection.input_proj_linear.weight"], (Shape{32, 32}));
  EXPECT_EQ(g["model.audio_tower.layers.0.self_attn.per_dim_scale"], (Shape{8}));
  EXPECT_EQ(g["model.audio_tower.layers.0.lconv1d.depthwise_conv1d.weight"], (Shape{32, 1, 3}));
  EXPECT_EQ(g["model.audio_tower.layers.0.feed_forward2.ffw_layer_1.linear.weight"], (Shape{128, 32}));
  EXPECT_FALSE(g.count("model.audio_tower.layers.0.self_attn.q_proj.input_min"));
  EXPECT_EQ(g["model.audio_tower.output_proj.bias"], (Shape{48}));
  EXPECT_EQ(g["model.embed_audio.embedding_projection.weight"], (Shape{64, 48}));
  gemma["vision_config"]["use_clipped_linears"] = true;
  gemma.erase("audio_config");
  g = by_name(parts_of(config_from(gemma)));
  EXPECT_EQ(g["model.vision_tower.encoder.layers.0.self_attn.q_proj.output_max"], Shape{});
  EXPECT_FALSE(g.count("model.embed_audio.embedding_projection.weight"));

  // Gemma 4 unified: encoder-free embedders
  nlohmann::json unified = {{"model_type", "gemma4_unified"},
                            {"text_config", fixture_config("gemma4_dense")},
                            {"vision_config", {{"patch_size", 2}, {"mm_embed_dim", 24}, {"mm_posemb_size", 10}}},
                            {"audio_config", {{"audio_embed_dim", 40}}}};
  unified["text_config"]["model_type"] = "gemma4_unified_text";
  auto u = by_name(parts_of(config_from(unified)));
  // the released checkpoint's names, which transformers' save_pretrained writes
  EXPECT_EQ(u["model.vision_embedder.patch_ln1.bias"], (Shape{108}));  // (2 * 3)^2 * 3
  EXPECT_EQ(u["model.vision_embedder.patch_dense.weight"], (Shape{24, 108}));
  EXPECT_EQ(u["model.vision_embedder.pos_embedding"], (Shape{10, 2, 24}));
  EXPECT_EQ(u["model.embed_vision.embedding_projection.weight"], (Shape{64, 3840}));
  EXPECT_EQ(u["model.embed_audio.embedding_projection.weight"], (Shape{64, 40}));
  EXPECT_EQ(u.size(), 11u);

  // Qwen 3.5: the merger sees 2x2 patches; the MTP head follows mtp_num_hidden_layers
  nlohmann::json qwen = {{"model_type", "qwen3_5_moe"},
                         {"text_config", fixture_config("qwen3_5_moe")},
                         {"vision_config",
                          {{"depth", 1},
                           {"hidden_size", 8},
                           {"intermediate_size", 12},
                           {"num_heads", 2},
                           {"patch_size", 4},
                           {"temporal_patch_size", 1},
                           {"spatial_merge_size", 3},
                           {"out_hidden_size", 20},
                           {"num_position_embeddings", 9}}}};
  qwen["text_config"]["mtp_num_hidden_layers"] = 2;
  auto q = by_name(parts_of(config_from(qwen)));
  const int64_t H = qwen["text_config"]["hidden_size"];
  EXPECT_EQ(q["model.visual.patch_embed.proj.weight"], (Shape{8, 3, 1, 4, 4}));
  EXPECT_EQ(q["model.visual.pos_embed.weight"], (Shape{9, 8}));
  EXPECT_EQ(q["model.visual.blocks.0.attn.qkv.bias"], (Shape{24}));
  EXPECT_EQ(q["model.visual.merger.norm.weight"], (Shape{8}));
  EXPECT_EQ(q["model.visual.merger.linear_fc1.weight"], (Shape{72, 72}));
  EXPECT_EQ(q["model.visual.merger.linear_fc2.weight"], (Shape{20, 72}));
  EXPECT_EQ(q["mtp.fc.weight"], (Shape{H, 2 * H}));
  EXPECT_TRUE(q.count("mtp.layers.1.self_attn.q_norm.weight"));
  EXPECT_TRUE(q.count("mtp.layers.0.mlp.experts.0.gate_proj.weight"));
  EXPECT_TRUE(q.count("mtp.layers.0.mlp.shared_expert_gate.weight"));
  EXPECT_FALSE(q.count("mtp.layers.0.linear_attn.in_proj_qkv.weight"));
  qwen["text_config"]["mtp_num_hidden_layers"] = 0;
  qwen.erase("vision_config");
  EXPECT_TRUE(parts_of(config_from(qwen)).empty());
}

TEST(TowersSubConfigs, ABadSizeIsAnErrorNamingTheKey) {
  nlohmann::json qwen = {
      {"model_type", "qwen3_5"}, {"text_config", fixture_config("qwen3_5_dense")}, {"vision_config", {{"depth", 0}}}};
  auto parts = checkpoint_part_tensors(config_from(qwen));
  ASSERT_FALSE(parts.ok());
  EXPECT_NE(parts.error().message.find("'depth'"), std::string::npos) << parts.error().message;
}

// `kiln synth-model` on a small release-form config writes a wrapper checkpoint; `kiln logits`
// loads it, sets the parts it does not run aside and says so (and says nothing of those it runs).
void synth_and_run(const nlohmann::json& config, const std::vector<std::string>& reported,
                   const std::vector<std::string>& run = {}) {
  TempDir tmp;
  const std::string config_path = tmp.path() + "/config.json";
  std::ofstream(config_path) << config.dump(2);
  const std::string model = tmp.path() + "/model";
  auto synth = run_command(std::string(KILN_BINARY) + " synth-model " + config_path + " " + model + " --dtype bf16");
  ASSERT_EQ(synth.exit_code, 0) << synth.output;
  auto logits = run_command(std::string(KILN_BINARY) + " logits " + model + " --ids 1,2,3 --out " + tmp.path() +
                            "/x.npy --device cpu");
  ASSERT_EQ(logits.exit_code, 0) << logits.output;
  for (const auto& part : reported)
    EXPECT_NE(logits.output.find(part + " present"), std::string::npos) << logits.output;
  for (const auto& part : run) EXPECT_EQ(logits.output.find(part), std::string::npos) << logits.output;
  EXPECT_EQ(logits.output.find("error"), std::string::npos) << logits.output;
  auto written = read_model_config(model);
  ASSERT_TRUE(written.ok()) << written.error().message;
  EXPECT_EQ(written->outer_model_type, config["model_type"]);
}

TEST(TowersSynthModel, QwenReleaseFormLoads) {
  // models/configs/release/qwen3.5-0.8b.json with its language model and tower shrunk
  auto release = read_json(release_dir() + "/qwen3.5-0.8b.json");
  release["text_config"] = fixture_config("qwen3_5_dense");
  release["text_config"]["mtp_num_hidden_layers"] = 1;
  auto& vision = release["vision_config"];
  vision["depth"] = 2;
  vision["hidden_size"] = 32;
  vision["intermediate_size"] = 48;
  vision["num_heads"] = 2;
  vision["num_position_embeddings"] = 16;
  vision["out_hidden_size"] = release["text_config"]["hidden_size"];
  release["tie_word_embeddings"] = release["text_config"]["tie_word_embeddings"];
  synth_and_run(release, {"MTP head"});  // the vision encoder is read and used
}

TEST(TowersSynthModel, GemmaReleaseFormLoads) {
  // models/configs/release/gemma4-e2b.json (vision and audio towers, clipped linears) shrunk
  auto release = read_json(release_dir() + "/gemma4-e2b.json");
  release["text_config"] = fixture_config("gemma4_dense");
  auto& vision = release["vision_config"];
  vision["hidden_size"] = 16;
  vision["intermediate_size"] = 24;
  vision["num_hidden_layers"] = 1;
  vision["num_attention_heads"] = 2;
  vision["num_key_value_heads"] = 2;
  vision["head_dim"] = 8;
  vision["global_head_dim"] = 8;
  vision["position_embedding_size"] = 16;
  auto& audio = release["audio_config"];
  audio["hidden_size"] = 16;
  audio["num_hidden_layers"] = 1;
  audio["num_attention_heads"] = 2;
  audio["subsampling_conv_channels"] = {8, 4};
  audio["output_proj_dims"] = 24;
  synth_and_run(release, {"audio encoder"}, {"vision encoder"});
}

}  // namespace
}  // namespace kiln::test
