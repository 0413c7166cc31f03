#include "convert/quantize_model.h"

#include <fmt/format.h>
#include <fnmatch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "convert/check_model.h"
#include "core/files.h"
#include "core/thread_pool.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "io/weights.h"
#include "models/family.h"
#include "models/mlx_layout.h"
#include "models/model.h"
#include "quant/affine.h"

namespace kiln {

namespace fs = std::filesystem;

Result<QuantOverride> parse_quant_override(const std::string& text) {
  const auto eq = text.rfind('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
    return make_error("override '{}' must read MODULE_GLOB=BITS or MODULE_GLOB=BITS:GROUP", text);
  QuantOverride o;
  o.glob = text.substr(0, eq);
  std::string value = text.substr(eq + 1);
  if (value == "none") return o;
  try {
    const auto colon = value.find(':');
    size_t used = 0;
    o.bits = std::stoi(value.substr(0, colon), &used);
    if (used != (colon == std::string::npos ? value.size() : colon)) throw std::invalid_argument(value);
    if (colon != std::string::npos) {
      o.group_size = std::stoi(value.substr(colon + 1), &used);
      if (used != value.size() - colon - 1) throw std::invalid_argument(value);
    }
  } catch (const std::exception&) {
    return make_error("override '{}': '{}' is not BITS, BITS:GROUP or none", text, value);
  }
  if (o.bits != 0 && !quant::supported_bits(o.bits))
    return make_error("override '{}': {} bits is not supported (2, 3, 4, 5, 6, 8, or none)", text, o.bits);
  if (o.group_size != 0 && !quant::supported_group_size(o.group_size))
    return make_error("override '{}': group size {} is not supported (32, 64, 128)", text, o.group_size);
  return o;
}

namespace {

bool is_float(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

// One tensor of the output, made on demand (a shard at a time).
struct Planned {
  std::string name;  // without ".weight" when quantized: the module path
  Shape shape;
  DType dtype;
  std::function<Tensor()> make;  // the dense host tensor
  QuantSpec quant;
  bool turned_off = false;  // an override left it unquantized
  size_t out_bytes() const {
    if (!quant.quantized) return size_t(shape.numel()) * dtype_size(dtype);
    const size_t groups = size_t(shape.numel() / quant.group_size);
    return size_t(shape.numel()) * size_t(quant.bits) / 8 + 2 * groups * dtype_size(dtype);
  }
};

// The packed codes, scales and biases of a dense tensor.
std::vector<NamedTensor> quantize_tensor(const Planned& p, ThreadPool& pool) {
  const Tensor dense = p.make();
  const int64_t cols = p.shape[-1], rows = p.shape.numel() / cols, groups = cols / p.quant.group_size;
  Shape packed_shape = p.shape, scale_shape = p.shape;
  packed_shape[-1] = cols * p.quant.bits / 32;
  scale_shape[-1] = groups;
  Tensor packed = host_tensor(DType::u32, packed_shape);
  Tensor scales = host_tensor(p.dtype, scale_shape), biases = host_tensor(p.dtype, scale_shape);
  const size_t row_bytes = size_t(cols) * size_t(p.quant.bits) / 8;
  pool.parallel_for(rows, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(cols)), s(static_cast<size_t>(groups)), b(static_cast<size_t>(groups));
    for (int64_t r = begin; r < end; ++r) {
      convert_host(dense.rows_view(r, 1), DType::f32, row.data());
      quant::quantize_row(row.data(), cols, p.quant.bits, p.quant.group_size,
                          static_cast<uint8_t*>(packed.data()) + size_t(r) * row_bytes, s.data(), b.data());
      // stored in the weight's type, rounded to nearest even as mlx casts
      Tensor sv(DType::f32, Shape{groups}, s.data(), nullptr, Device::cpu);
      Tensor bv(DType::f32, Shape{groups}, b.data(), nullptr, Device::cpu);
      convert_host(sv, p.dtype, static_cast<char*>(scales.data()) + size_t(r * groups) * dtype_size(p.dtype));
      convert_host(bv, p.dtype, static_cast<char*>(biases.data()) + size_t(r * groups) * dtype_size(p.dtype));
    }
  });
  return {{p.name + ".weight", packed}, {p.name + ".scales", scales}, {p.name + ".biases", biases}};
}

// Takes back what an unfinished quantize_model_dir wrote (an error, or an exception such as running
// out of memory, midway): the directories it made, or what it put into the empty one it was given.
class PartialOutput {
 public:
  explicit PartialOutput(const std::string& dir) : dir_(dir) {
    std::error_code ec, missing;
    for (fs::path p = fs::absolute(dir, ec).lexically_normal(); !ec && p != p.parent_path(); p = p.parent_path()) {
      if (fs::symlink_status(p, missing).type() != fs::file_type::not_found) break;
      made_ = p;  // the outermost directory create_directories makes
    }
  }
  ~PartialOutput() {
    if (finished_) return;
    std::error_code ec;
    if (!made_.empty()) {
      fs::remove_all(made_, ec);
      return;
    }
    std::vector<fs::path> written;
    for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) written.push_back(it->path());
    for (const auto& path : written) fs::remove_all(path, ec);
  }
  void finish() { finished_ = true; }

 private:
  fs::path dir_, made_;
  bool finished_ = false;
};

const char* kAuxFiles[] = {
    "tokenizer.json",      "tokenizer_config.json", "special_tokens_map.json",  "generation_config.json",
    "chat_template.jinja", "chat_template.json",    "tokenizer.model",          "vocab.json",
    "merges.txt",          "added_tokens.json",     "preprocessor_config.json", "processor_config.json"};

}  // namespace

Result<QuantizeReport> quantize_model_dir(const std::string& in_dir, const std::string& out_dir,
                                          const QuantizeOptions& options) {
  if (!quant::supported_bits(options.bits))
    return make_error("--bits {} is not supported (2, 3, 4, 5, 6, 8)", options.bits);
  if (!quant::supported_group_size(options.group_size))
    return make_error("--group-size {} is not supported (32, 64, 128)", options.group_size);
  // as mlx-lm does, never write into (or over) what is already there; an empty directory is fine
  {
    std::error_code ec;
    const fs::file_status st = fs::status(out_dir, ec);
    if (fs::exists(st) && !fs::is_directory(st))
      return make_error("{} is a file; name a new directory to write", out_dir);
    if (fs::exists(st) && !(fs::is_empty(out_dir, ec) && !ec))
      return make_error("{} already exists and is not an empty directory; name a new one", out_dir);
  }
  KILN_ASSIGN(ModelConfigFile config, read_model_config(in_dir));
  if (config.text.contains("quantization") || config.text.contains("quantization_config"))
    return make_error("{} is already quantized (config.json has a quantization block)", in_dir);
  KILN_ASSIGN(const ModelFamily* family, family_of(config));
  // what kiln logits would refuse to load is refused here, before anything is written
  KILN_TRY(check_model(in_dir));
  KILN_ASSIGN(WeightStore store, WeightStore::open(in_dir));

  // the text model's tensors as mlx-lm names and lays them out; set-aside parts are not written
  KILN_ASSIGN(std::vector<MlxTensor> layout, family->quantize.mlx_layout(config, store));
  std::vector<Planned> plan;
  for (MlxTensor& t : layout) {
    if (!is_float(t.dtype)) return make_error("tensor '{}' is not a float tensor", t.name);
    plan.push_back({t.name, t.shape, t.dtype, std::move(t.make), {}});
  }

  // what to quantize, as mlx-lm decides, then the overrides
  const QuantSpec base_spec{.quantized = true, .bits = options.bits, .group_size = options.group_size};
  nlohmann::json qblock = {{"group_size", options.group_size}, {"bits", options.bits}, {"mode", "affine"}};
  QuantizeReport report;
  std::vector<bool> override_used(options.overrides.size(), false);
  std::string some_module;  // for the message of an override that matches nothing
  for (Planned& p : plan) {
    // convolutions are no Linear layers: mlx-lm never quantizes them
    if (!ends_with(p.name, ".weight") || p.shape.rank() < 2 || ends_with(p.name, ".conv1d.weight")) continue;
    const std::string module = p.name.substr(0, p.name.size() - 7);
    if (some_module.empty()) some_module = module;
    QuantSpec spec{};
    bool indivisible = p.shape[-1] % options.group_size != 0;  // mlx-lm leaves such modules as they are
    if (!indivisible) {
      spec = base_spec;
      if (family->quantize.eight_bit(config, module)) spec = QuantSpec{.quantized = true, .bits = 8, .group_size = 64};
    }
    const QuantOverride* chosen = nullptr;  // the last matching override
    for (size_t i = 0; i < options.overrides.size(); ++i) {
      const QuantOverride& o = options.overrides[i];
      if (fnmatch(o.glob.c_str(), module.c_str(), 0) != 0) continue;
      override_used[i] = true;
      chosen = &o;
      spec = o.bits == 0 ? QuantSpec{}
                         : QuantSpec{.quantized = true,
                                     .bits = o.bits,
                                     .group_size = o.group_size ? o.group_size : options.group_size};
      p.turned_off = o.bits == 0;
      indivisible = false;
    }
    if (spec.quantized && p.shape[-1] % spec.group_size != 0) {
      // a group size asked for by name must fit; the defaults skip what they cannot divide
      if (chosen && chosen->group_size)
        return make_error("override '{}={}:{}': group size {} does not divide the input size {} of '{}'", chosen->glob,
                          chosen->bits, chosen->group_size, chosen->group_size, p.shape[-1], module);
      indivisible = true;
      spec = QuantSpec{};
    }
    if (indivisible && report.indivisible_modules++ == 0) report.indivisible_example = module;
    p.quant = spec;
    if (spec.quantized) {
      p.name = module;
      ++report.quantized_modules;
      if (spec.bits != options.bits || spec.group_size != options.group_size)
        qblock[module] = {{"group_size", spec.group_size}, {"bits", spec.bits}};
    } else if (p.turned_off) {
      qblock[module] = false;
    }
  }
  for (size_t i = 0; i < options.overrides.size(); ++i)
    if (!override_used[i])
      return make_error("override '{}' matches no module of the model (modules are named as in the output, e.g. '{}')",
                        options.overrides[i].glob, some_module);
  std::sort(plan.begin(), plan.end(), [](const Planned& a, const Planned& b) { return a.name < b.name; });

  // shards in name order, each at most shard_bytes (a larger tensor gets one to itself)
  std::vector<std::vector<const Planned*>> shards(1);
  size_t shard_size = 0;
  for (const Planned& p : plan) {
    if (shard_size > 0 && shard_size + p.out_bytes() > options.shard_bytes) {
      shards.emplace_back();
      shard_size = 0;
    }
    shards.back().push_back(&p);
    shard_size += p.out_bytes();
  }

  PartialOutput output(out_dir);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return make_error("cannot create {}: {}", out_dir, ec.message());
  ThreadPool pool(options.threads > 0 ? options.threads : int(std::max(1u, std::thread::hardware_concurrency())));
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1
                                 ? "model.safetensors"
                                 : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<NamedTensor> tensors;
    for (const Planned* p : shards[s]) {
      if (p->quant.quantized) {
        for (auto& t : quantize_tensor(*p, pool)) tensors.push_back(std::move(t));
      } else {
        Tensor t = p->make();
        if (!t.contiguous()) {
          Tensor copy = host_tensor(t.dtype(), t.shape());
          convert_host(t, t.dtype(), copy.data());
          t = copy;
        }
        tensors.push_back({p->name, t});
      }
    }
    for (const auto& t : tensors) {
      weight_map[t.name] = file;
      report.bytes_written += t.tensor.nbytes();
    }
    KILN_TRY(write_safetensors(out_dir + "/" + file, tensors, {{"format", "mlx"}}));
  }
  for (const Planned& p : plan) report.params += p.shape.numel();
  report.bits_per_weight = report.params ? 8.0 * double(report.bytes_written) / double(report.params) : 0.0;

  nlohmann::json index = {{"metadata", {{"total_size", report.bytes_written}, {"total_parameters", report.params}}},
                          {"weight_map", weight_map}};
  {
    std::ofstream out(out_dir + "/model.safetensors.index.json");
    out << index.dump(4) << "\n";
    if (!out) return make_error("cannot write {}/model.safetensors.index.json", out_dir);
  }
  nlohmann::json root = config.root;
  root.erase("_name_or_path");
  root["quantization"] = qblock;
  root["quantization_config"] = qblock;
  {
    std::ofstream out(out_dir + "/config.json");
    out << root.dump(4) << "\n";
    if (!out) return make_error("cannot write {}/config.json", out_dir);
  }
  for (const char* aux : kAuxFiles) {
    const fs::path src = fs::path(in_dir) / aux;
    if (!fs::exists(src)) continue;
    KILN_TRY(require_regular_file_if_present(src.string()));
    fs::copy_file(src, fs::path(out_dir) / aux, fs::copy_options::overwrite_existing, ec);
    if (ec) return make_error("cannot copy {} to {}: {}", src.string(), out_dir, ec.message());
  }
  output.finish();
  return report;
}

}  // namespace kiln
