// Bad model directories: each gives a one-line error that names the file or tensor at fault,
// from the library and from the CLI (non-zero exit), never a crash.
#include <sys/stat.h>

#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "test_util.h"

namespace kiln::test {
namespace {

std::string load_error(const std::string& dir) {
  CpuBackend backend(1);
  auto model = load_model(dir, backend);
  if (model.ok()) return "";
  return model.error().message;
}

void expect_one_line(const std::string& message) {
  EXPECT_FALSE(message.empty());
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Rewrites the fixture's single safetensors file with `edit` applied to its tensors.
void rewrite_tensors(const std::string& dir, const std::function<void(std::vector<NamedTensor>&)>& edit) {
  const std::string path = dir + "/model.safetensors";
  std::vector<NamedTensor> tensors;
  {
    auto file = SafetensorsFile::open(path);
    ASSERT_TRUE(file.ok());
    for (const auto& info : (*file)->tensors()) {
      auto view = (*file)->view(info);
      ASSERT_TRUE(view.ok());
      Tensor copy = host_tensor(view->dtype(), view->shape());
      std::memcpy(copy.data(), view->data(), view->nbytes());
      tensors.push_back({info.name, copy});
    }
  }
  edit(tensors);
  ASSERT_TRUE(write_safetensors(path, tensors).ok());
}

TEST(LoaderErrors, MissingWeights) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("gemma4_dense");
  std::filesystem::remove(dir + "/model.safetensors");
  const auto error = load_error(dir);
  expect_one_line(error);
  EXPECT_NE(error.find("no model.safetensors"), std::string::npos) << error;
}

TEST(LoaderErrors, MissingShard) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("gemma4_keqv");  // sharded
  std::filesystem::remove(dir + "/model-00002-of-00002.safetensors");
  const auto error = load_error(dir);
  expect_one_line(error);
  EXPECT_NE(error.find("model-00002-of-00002.safetensors"), std::string::npos) << error;
  EXPECT_NE(error.find("missing"), std::string::npos) << error;
}

TEST(LoaderErrors, TruncatedFile) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("gemma4_dense");
  const auto bytes = read_file(dir + "/model.safetensors");
  write_file(dir + "/model.safetensors", bytes.substr(0, bytes.size() / 2));
  const auto error = load_error(dir);
  expect_one_line(error);
  EXPECT_NE(error.find("model.safetensors is truncated"), std::string::npos) << error;
}

TEST(LoaderErrors, TinyFile) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("gemma4_dense");
  write_file(dir + "/model.safetensors", "abc");
  const auto error = load_error(dir);
  expect_one_line(error);
  EXPECT_NE(error.find("model.safetensors"), std::string::npos) << error;
}

TEST(LoaderErrors, CorruptHeader) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("gemma4_dense");
  auto bytes = read_file(dir + "/model.safetensors");
  for (size_t i = 8; i < 40; ++i) bytes[i] = '#';
  write_file(dir + "/model.safetensors", bytes);
  const auto error = load_error(dir);
  expect_one_line(error);
  EXPECT_NE(error.find("corrupt"), std::string::npos) << error;
  EXPECT_NE(error.find("model.safetensors"), std::string::npos) << error;
}

TEST(LoaderErrors, ImpossibleHeaderLength) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("gemma4_dense");
  auto bytes = read_file(dir + "/model.safetensors");
  const uint64_t huge = uint64_t(1) << 40;
  std::memcpy(bytes.data(), &huge, 8);
  write_file(dir + "/model.safetensors", bytes);
  const auto error = load_error(dir);
  expect_one_line(error);
  EXPECT_NE(error.find("header length"), std::string::npos) << error;
}

// Rewrites the header of a safetensors file with `edit`, which may also change the data section
// after it, as a hand-edited or hostile file would have them.
void edit_header(const std::string& path, const std::function<void(nlohmann::json&, std::string&)>& edit) {
  const std::string bytes = read_file(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  std::string data = bytes.substr(8 + n);
  edit(header, data);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t len = text.size();
  write_file(path, std::string(reinterpret_cast<const char*>(&len), 8) + text + data);
}

std::string open_error(const std::string& path) {
  auto file = SafetensorsFile::open(path);
  return file.ok() ? "" : file.error().message;
}

// As the safetensors library requires: sorted by offset, the tensors cover the data section
// exactly, so that no two share bytes and no bytes go unaccounted for.
TEST(LoaderErrors, TensorsMustTileTheDataSection) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("qwen3_5_dense");
  const std::string path = dir + "/model.safetensors", saved = read_file(path);
  const std::string moved = "model.layers.0.mlp.down_proj.weight";
  // one tensor's range moved onto the start of another's: it would read the other's bytes
  edit_header(path, [&](nlohmann::json& h, std::string&) {
    const uint64_t begin = h[moved]["data_offsets"][0], end = h[moved]["data_offsets"][1];
    ASSERT_GT(begin, 0u);
    h[moved]["data_offsets"] = {0, end - begin};
  });
  auto error = open_error(path);
  expect_one_line(error);
  EXPECT_NE(error.find(path + ": tensor '"), std::string::npos) << error;
  EXPECT_NE(error.find("overlaps"), std::string::npos) << error;
  EXPECT_EQ(load_error(dir), error);
  // a tensor dropped from the header leaves its bytes as a gap
  write_file(path, saved);
  edit_header(path, [&](nlohmann::json& h, std::string&) { h.erase(moved); });
  error = open_error(path);
  expect_one_line(error);
  EXPECT_NE(error.find("leaves a gap after"), std::string::npos) << error;
  // bytes past the last tensor
  write_file(path, saved);
  edit_header(path, [](nlohmann::json&, std::string& data) { data += std::string(24, 'x'); });
  error = open_error(path);
  expect_one_line(error);
  EXPECT_NE(error.find(path + " has 24 bytes after the last tensor"), std::string::npos) << error;
  // kiln's own writer tiles exactly, empty tensors included
  const Tensor empty = host_tensor(DType::f32, Shape{0, 4}), four = host_tensor(DType::bf16, Shape{2, 2});
  ASSERT_TRUE(write_safetensors(tmp.path() + "/own.safetensors", {{"a", empty}, {"b", four}, {"c", empty}}).ok());
  EXPECT_EQ(open_error(tmp.path() + "/own.safetensors"), "");
}

// Shapes whose element or byte counts overflow, or that are not counts at all, name the tensor
// rather than wrapping around to a size that happens to match.
TEST(LoaderErrors, HeaderShapesThatDoNotCount) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("qwen3_5_dense");
  const std::string path = dir + "/model.safetensors", saved = read_file(path);
  const std::string name = "model.layers.0.mlp.down_proj.weight";
  const uint64_t big = uint64_t(1) << 62;
  struct Case {
    std::function<void(nlohmann::json&, std::string&)> edit;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {[&](nlohmann::json& h, std::string&) {
         h[name]["shape"] = {big, big};
       },
       "overflows"},
      // 2^63 + 128 elements of 2 bytes wrap around to 256 bytes
      {[&](nlohmann::json& h, std::string& data) {
         h["extra.weight"] = {
             {"dtype", "BF16"}, {"shape", {big + 64, 2}}, {"data_offsets", {data.size(), data.size() + 256}}};
         data += std::string(256, '\0');
       },
       "'extra.weight' has shape [4611686018427387968, 2], whose size in bytes overflows"},
      {[&](nlohmann::json& h, std::string&) {
         h[name]["shape"] = {-1, 2};
       },
       "negative dimension -1"},
      {[&](nlohmann::json& h, std::string&) {
         h[name]["shape"] = {uint64_t(1) << 63, 2};
       },
       "past the largest size"},
      {[&](nlohmann::json& h, std::string&) {
         h[name]["shape"] = {64.5, 96};
       },
       "64.5 that is not an integer"},
      {[&](nlohmann::json& h, std::string&) { h[name]["data_offsets"][0] = -8; }, "data offset -8"},
      // named plainly, not in the JSON library's words
      {[&](nlohmann::json& h, std::string&) { h[name] = 5; }, "has a header entry that is not an object"},
      {[&](nlohmann::json& h, std::string&) { h[name].erase("dtype"); }, "has no 'dtype' in its header entry"},
      {[&](nlohmann::json& h, std::string&) { h[name]["dtype"] = 16; }, "has a dtype 16 that is not a string"},
  };
  for (const Case& c : cases) {
    write_file(path, saved);
    edit_header(path, c.edit);
    const auto error = open_error(path);
    expect_one_line(error);
    EXPECT_NE(error.find(c.needle), std::string::npos) << error;
    EXPECT_NE(error.find(path + ": tensor '"), std::string::npos) << error;
    EXPECT_EQ(error.find("json.exception"), std::string::npos) << error;
  }
}

TEST(LoaderErrors, ShapeDisagreesWithConfig) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("gemma4_dense");
  rewrite_tensors(dir, [](std::vector<NamedTensor>& tensors) {
    for (auto& t : tensors)
      if (t.name == "model.layers.1.self_attn.q_proj.weight") t.tensor = host_tensor(DType::f32, Shape{64, 64});
  });
  const auto error = load_error(dir);
  expect_one_line(error);
  EXPECT_NE(error.find("'model.layers.1.self_attn.q_proj.weight'"), std::string::npos) << error;
  EXPECT_NE(error.find("[64, 64]"), std::string::npos) << error;
}

TEST(LoaderErrors, MissingTensor) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("qwen3_5_dense");
  rewrite_tensors(dir, [](std::vector<NamedTensor>& tensors) {
    std::erase_if(tensors, [](const NamedTensor& t) { return t.name == "model.layers.2.linear_attn.A_log"; });
  });
  const auto error = load_error(dir);
  expect_one_line(error);
  EXPECT_NE(error.find("layers.2.linear_attn.A_log"), std::string::npos) << error;
}

TEST(LoaderErrors, IntegerTensorWhereFloatsBelong) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("qwen3_5_dense");
  rewrite_tensors(dir, [](std::vector<NamedTensor>& tensors) {
    for (auto& t : tensors)
      if (t.name == "model.norm.weight") t.tensor = host_tensor(DType::i32, t.tensor.shape());
  });
  const auto error = load_error(dir);
  expect_one_line(error);
  EXPECT_NE(error.find("model.norm.weight"), std::string::npos) << error;
}

TEST(LoaderErrors, UnknownModelType) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("gemma4_dense");
  auto config = read_json(dir + "/config.json");
  config["model_type"] = "llama";
  write_file(dir + "/config.json", config.dump());
  const auto error = load_error(dir);
  expect_one_line(error);
  EXPECT_NE(error.find("unsupported model_type 'llama'"), std::string::npos) << error;
  EXPECT_NE(error.find("config.json"), std::string::npos) << error;
}

TEST(LoaderErrors, ConfigNotJson) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("gemma4_dense");
  write_file(dir + "/config.json", "{ not json");
  const auto error = load_error(dir);
  expect_one_line(error);
  EXPECT_NE(error.find("config.json is not valid JSON"), std::string::npos) << error;
}

TEST(LoaderErrors, ConfigFieldOfWrongType) {
  TempDir tmp;
  const auto dir = tmp.copy_fixture("qwen3_5_dense");
  auto config = read_json(dir + "/config.json");
  config["hidden_size"] = "sixty-four";
  write_file(dir + "/config.json", config.dump());
  const auto error = load_error(dir);
  expect_one_line(error);
  EXPECT_NE(error.find("'hidden_size' must be an integer"), std::string::npos) << error;
}

// Values that used to pass the config checks and crash later (a rotary table past the head,
// a division by a zero width, a window of zero taps, two head dims sharing one rotary table).
TEST(LoaderErrors, ConfigValuesOutOfRange) {
  struct Case {
    std::string fixture;
    std::function<void(nlohmann::json&)> edit;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"qwen3_5_dense", [](nlohmann::json& c) { c["rope_parameters"]["partial_rotary_factor"] = 1.5; },
       "partial_rotary_factor 1.5"},
      {"qwen3_5_dense", [](nlohmann::json& c) { c["intermediate_size"] = 0; }, "intermediate size"},
      {"qwen3_5_dense", [](nlohmann::json& c) { c["linear_conv_kernel_dim"] = 0; }, "linear_conv_kernel_dim"},
      {"qwen3_5_dense", [](nlohmann::json& c) { c["rms_norm_eps"] = -1; }, "rms_norm_eps"},
      {"gemma4_dense", [](nlohmann::json& c) { c["intermediate_size"] = 0; }, "intermediate size"},
      {"gemma4_dense", [](nlohmann::json& c) { c["sliding_window"] = 0; }, "sliding_window"},
      {"gemma4_dense", [](nlohmann::json& c) { c["per_layer_config"]["2"]["head_dim"] = 0; }, "one head_dim"},
      {"gemma4_dense", [](nlohmann::json& c) { c["final_logit_softcapping"] = 0; }, "final_logit_softcapping"},
      // integers past an int: they were cut to 32 bits (2^59 + 4 heads loaded as 4) or wrapped
      {"qwen3_5_dense", [](nlohmann::json& c) { c["num_attention_heads"] = (int64_t(1) << 59) + 4; },
       "'num_attention_heads' is 576460752303423492, beyond"},
      {"qwen3_5_dense", [](nlohmann::json& c) { c["linear_num_value_heads"] = (int64_t(1) << 32) + 4; },
       "'linear_num_value_heads' is 4294967300, beyond"},
      {"qwen3_5_dense", [](nlohmann::json& c) { c["head_dim"] = uint64_t(1) << 63; }, "'head_dim' is"},
      {"gemma4_dense", [](nlohmann::json& c) { c["vocab_size"] = 1e30; }, "'vocab_size' is"},
      // read as no rope_parameters at all
      {"qwen3_5_dense", [](nlohmann::json& c) { c["rope_parameters"] = "default"; },
       "'rope_parameters' must be an object, got \"default\""},
      {"gemma4_dense", [](nlohmann::json& c) { c["rope_parameters"] = nlohmann::json::array({1}); },
       "'rope_parameters' must be an object, got [1]"},
  };
  for (const Case& c : cases) {
    TempDir tmp;
    const auto dir = tmp.copy_fixture(c.fixture);
    auto config = read_json(dir + "/config.json");
    c.edit(config.contains("text_config") ? config["text_config"] : config);
    write_file(dir + "/config.json", config.dump());
    const auto error = load_error(dir);
    expect_one_line(error);
    EXPECT_NE(error.find(c.needle), std::string::npos) << error;
  }
}

TEST(LoaderErrors, NotAModelDirectory) {
  const auto error = load_error("/nonexistent/kiln-model");
  expect_one_line(error);
  EXPECT_NE(error.find("config.json"), std::string::npos) << error;
}

TEST(LoaderErrors, TokenOutsideVocabulary) {
  CpuBackend backend(1);
  auto model = load_model(fixture_path("gemma4_dense"), backend);
  ASSERT_TRUE(model.ok());
  auto state = (*model)->new_sequence(16);
  ASSERT_TRUE(state.ok());
  const std::vector<int32_t> ids = {1, 2, 100000};
  SeqChunk chunk{.state = state->get(), .tokens = ids};
  auto logits = (*model)->forward(std::span<const SeqChunk>(&chunk, 1), LogitRows::all);
  ASSERT_FALSE(logits.ok());
  EXPECT_NE(logits.error().message.find("100000"), std::string::npos);
  EXPECT_EQ((*state)->length(), 0) << "a refused batch must leave the sequence untouched";
}

TEST(LoaderErrors, ContextOverflow) {
  CpuBackend backend(1);
  auto model = load_model(fixture_path("qwen3_5_dense"), backend);
  ASSERT_TRUE(model.ok());
  auto state = (*model)->new_sequence(4);
  ASSERT_TRUE(state.ok());
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5};
  SeqChunk chunk{.state = state->get(), .tokens = ids};
  auto logits = (*model)->forward(std::span<const SeqChunk>(&chunk, 1), LogitRows::all);
  ASSERT_FALSE(logits.ok());
  EXPECT_NE(logits.error().message.find("context"), std::string::npos);
}

// The CLI turns each of these into one "kiln: error: ..." line and a non-zero exit.
TEST(LoaderErrors, CliReportsOneLineAndFails) {
  TempDir tmp;
  const auto truncated = tmp.copy_fixture("gemma4_dense");
  const auto bytes = read_file(truncated + "/model.safetensors");
  write_file(truncated + "/model.safetensors", bytes.substr(0, bytes.size() - 100));
  const std::string out = tmp.path() + "/out.npy", bundled = source_dir() + "/models/kiln-kjv-31m";
  // a FIFO where a file belongs would block a reader forever
  std::filesystem::create_directory(tmp.path() + "/fifo");
  const auto fifo_model = tmp.copy_fixture("gemma4_dense", "fifo/model");
  std::filesystem::remove(fifo_model + "/model.safetensors");
  ASSERT_EQ(::mkfifo((fifo_model + "/model.safetensors").c_str(), 0600), 0);
  const auto fifo_config = tmp.copy_fixture("gemma4_dense", "fifo/config");
  std::filesystem::remove(fifo_config + "/config.json");
  ASSERT_EQ(::mkfifo((fifo_config + "/config.json").c_str(), 0600), 0);
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"logits " + truncated + " --ids 1,2,3 --out " + out, "model.safetensors is truncated"},
           {"logits /nonexistent --ids 1,2,3 --out " + out, "config.json"},
           {"logits " + fixture_path("gemma4_dense") + " --ids 1,x,3 --out " + out, "'x' is not a token id"},
           {"logits " + fixture_path("gemma4_dense") + " --ids 1,2,99999 --out " + out, "99999"},
           {"logits " + fixture_path("gemma4_dense") + " --ids 1,2 --out /nonexistent/dir/out.npy", "out.npy"},
           {"logits " + fixture_path("gemma4_dense") + " --ids 1,2 --out " + out + " --threads 100000", "--threads"},
           {"generate " + fixture_path("gemma4_dense") + " --ids 1,2 --temp nan", "'nan' is not a finite number"},
           {"generate " + fixture_path("gemma4_dense") + " --ids 1,2 --max-tokens 0", "must be positive, got 0"},
           {"generate " + fixture_path("gemma4_dense") + " --ids 1,2 --prompt hi", "excludes"},
           {"generate " + fixture_path("gemma4_dense") + " --ids 1,2 --logit-bias 5", "is not ID=BIAS"},
           {"generate " + fixture_path("gemma4_dense") + " --ids 1,2 --logit-bias 5=101", "is not ID=BIAS"},
           {"generate " + fixture_path("gemma4_dense") + " --ids 1,2 --logit-bias 99999=1", "outside the vocabulary"},
           {"logits " + fifo_model + " --ids 1,2 --out " + out, "model.safetensors is not a regular file"},
           {"logits " + fifo_config + " --ids 1,2 --out " + out, "config.json is not a regular file"},
           {"tokenize " + bundled + " --file " + tmp.path(), "is a directory"},
           {"quantize " + fixture_path("qwen3_5_dense") + " " + tmp.path() + "/q --override 'model.layers.0.mlp=8'",
            "matches no module"},
           {"quantize " + fixture_path("qwen3_5_dense") + " " + bundled + "/config.json", "is a file"},
           {"logits " + fixture_path("qwen3_5_dense") + " --ids 1,2 --out " + out + " --threads 0x", "--threads"},
           {"logit " + fixture_path("qwen3_5_dense"), "unknown command 'logit'; the commands are logits,"},
       }) {
    auto r = run_command("timeout 120 " + std::string(KILN_BINARY) + " " + args);  // a blocked read fails
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_EQ(r.output.rfind("kiln: error: ", 0), 0u) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
  }
}

TEST(CliSampling, LogitBiasSteersGreedyIds) {
  const std::string base = std::string(KILN_BINARY) + " generate " + fixture_path("gemma4_dense") +
                           " --ids 1,2,3 --max-tokens 3 --temp 0 --device cpu";
  const auto steered = run_command(base + " --logit-bias 7=100", false);
  ASSERT_EQ(steered.exit_code, 0) << steered.output;
  EXPECT_EQ(steered.output, "[7,7,7]\n");
  const auto plain = run_command(base, false);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const std::string first = plain.output.substr(1, plain.output.find_first_of(",]") - 1);
  const auto banned = run_command(base + " --logit-bias " + first + "=-100", false);
  ASSERT_EQ(banned.exit_code, 0) << banned.output;
  EXPECT_NE(banned.output.substr(1, banned.output.find_first_of(",]") - 1), first) << plain.output << banned.output;
}

}  // namespace
}  // namespace kiln::test
