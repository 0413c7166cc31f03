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

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
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

// Rows [begin, begin + count) of a tensor's collapsed [rows, cols] view, restacked as one.
Tensor stack(const std::vector<Tensor>& parts) {
  Shape shape = parts.front().shape();
  Shape out_shape;
  {
    std::vector<int64_t> dims{int64_t(parts.size())};
    for (int i = 0; i < shape.rank(); ++i) dims.push_back(shape[i]);
    out_shape = Shape(dims.begin(), dims.end());
  }
  Tensor out = host_tensor(parts.front().dtype(), out_shape);
  const size_t bytes = parts.front().nbytes();
  for (size_t i = 0; i < parts.size(); ++i)
    std::memcpy(static_cast<char*>(out.data()) + i * bytes, parts[i].data(), bytes);
  return out;
}

// Half `which` (0: first rows, 1: last rows) of every matrix of a stack [E, 2I, H].
Tensor split_half(const Tensor& fused, int which) {
  const int64_t e = fused.dim(0), rows = fused.dim(1) / 2, cols = fused.dim(2);
  Tensor out = host_tensor(fused.dtype(), Shape{e, rows, cols});
  const size_t half = size_t(rows * cols) * dtype_size(fused.dtype());
  for (int64_t x = 0; x < e; ++x)
    std::memcpy(static_cast<char*>(out.data()) + size_t(x) * half,
                static_cast<const char*>(fused.data()) + size_t(2 * x + which) * half, half);
  return out;
}

Tensor add_one(const Tensor& t) {
  Tensor f = host_tensor(DType::f32, t.shape());
  convert_host(t, DType::f32, f.data());
  for (int64_t i = 0; i < f.numel(); ++i) f.data_as<float>()[i] += 1.0f;
  Tensor out = host_tensor(t.dtype(), t.shape());
  convert_host(f, t.dtype(), out.data());
  return out;
}

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
  const std::string& type = config.model_type;
  const bool gemma = type.rfind("gemma4", 0) == 0, qwen = type.rfind("qwen3_5", 0) == 0;
  if (!gemma && !qwen) return make_error("kiln quantize does not know model_type '{}' in {}", type, config.path);
  // what kiln logits would refuse to load is refused here, before anything is written
  KILN_TRY(check_model(in_dir));
  KILN_ASSIGN(WeightStore store, WeightStore::open(in_dir));

  // mlx-lm's names: the language model under "language_model." except for flat gemma4_text
  const bool flat = gemma && config.outer_model_type == "gemma4_text";
  const std::string prefix = flat ? "model." : "language_model.model.";
  const std::string head = flat ? "lm_head" : "language_model.lm_head";
  const bool tied = config.text.value("tie_word_embeddings", gemma);
  const bool moe = qwen && config.text.value("num_experts", 0) > 0;

  // Qwen 3.5 as transformers stores it: conv [C, 1, K] and norms as w (mlx-lm holds [C, K, 1], 1 + w)
  bool unsanitized_conv = false;
  for (const auto& name : store.names()) {
    if (!qwen || !ends_with(name, "conv1d.weight")) continue;
    KILN_ASSIGN(Tensor conv, store.get(name));
    unsanitized_conv = unsanitized_conv || conv.dim(-1) != 1;
  }

  std::vector<Planned> plan;
  auto get = [&store](const std::string& name) { return [&store, name]() { return *store.get(name); }; };
  std::map<std::string, std::map<int64_t, std::string>> per_expert;  // "layers.N.mlp.switch_mlp.P" -> expert -> name
  for (const auto& name : store.names()) {
    KILN_ASSIGN(Tensor t, store.get(name));
    if (!is_float(t.dtype())) return make_error("tensor {} is not a float tensor", store.describe(name));
    if (name == "lm_head.weight") {
      if (!tied) plan.push_back({head + ".weight", t.shape(), t.dtype(), get(name), {}});
      continue;
    }
    const auto experts = name.find(".experts.");
    if (experts != std::string::npos && t.rank() == 3 &&
        (ends_with(name, ".gate_up_proj") || ends_with(name, ".down_proj"))) {
      const std::string base = prefix + name.substr(0, experts) + (gemma ? ".experts.switch_glu." : ".switch_mlp.");
      if (ends_with(name, ".down_proj")) {
        plan.push_back({base + "down_proj.weight", t.shape(), t.dtype(), get(name), {}});
      } else {
        const Shape half{t.dim(0), t.dim(1) / 2, t.dim(2)};
        for (int which : {0, 1})
          plan.push_back({base + (which ? "up_proj.weight" : "gate_proj.weight"),
                          half,
                          t.dtype(),
                          [&store, name, which]() { return split_half(*store.get(name), which); },
                          {}});
      }
      continue;
    }
    if (experts != std::string::npos && qwen) {  // layers.N.mlp.experts.E.P.weight
      const std::string rest = name.substr(experts + 9);
      const auto dot = rest.find('.');
      const std::string index = rest.substr(0, dot);
      const int64_t n_experts = config.text.value("num_experts", int64_t(0));
      if (dot == std::string::npos || index.empty() || index.size() > 9 ||
          index.find_first_not_of("0123456789") != std::string::npos || !ends_with(rest, ".weight") || t.rank() != 2)
        return make_error("tensor {} is not an expert's projection (layers.N.mlp.experts.E.PROJ.weight, 2-D)",
                          store.describe(name));
      const int64_t e = std::stoll(index);
      if (e >= n_experts)
        return make_error("tensor {} is expert {}, but config.json has num_experts {}", store.describe(name), e,
                          n_experts);
      const std::string proj = rest.substr(dot + 1, rest.size() - dot - 1 - 7);  // drop ".weight"
      per_expert[name.substr(0, experts) + ".switch_mlp." + proj][e] = name;
      continue;
    }
    std::function<Tensor()> make = get(name);
    Shape shape = t.shape();
    if (qwen && ends_with(name, "conv1d.weight") && unsanitized_conv) {
      shape = Shape{t.dim(0), t.dim(2), t.dim(1)};  // [C, 1, K] -> [C, K, 1]: the same bytes
      make = [&store, name, shape]() { return store.get(name)->reshape(shape); };
    }
    const bool qwen_norm = name == "norm.weight" || ends_with(name, ".input_layernorm.weight") ||
                           ends_with(name, ".post_attention_layernorm.weight") || ends_with(name, ".q_norm.weight") ||
                           ends_with(name, ".k_norm.weight");
    if (qwen && unsanitized_conv && qwen_norm && t.rank() == 1)
      make = [&store, name]() { return add_one(*store.get(name)); };
    plan.push_back({prefix + name, shape, t.dtype(), make, {}});
  }
  for (const auto& [base, parts] : per_expert) {
    std::vector<std::string> names;
    for (int64_t e = 0; e < int64_t(parts.size()); ++e) {
      auto it = parts.find(e);
      if (it == parts.end()) return make_error("{}: expert {} of '{}' is missing", in_dir, e, base);
      names.push_back(it->second);
    }
    KILN_ASSIGN(Tensor first, store.get(names.front()));
    std::vector<int64_t> dims{int64_t(names.size()), first.dim(0), first.dim(1)};
    plan.push_back({prefix + base + ".weight",
                    Shape(dims.begin(), dims.end()),
                    first.dtype(),
                    [&store, names]() {
                      std::vector<Tensor> ts;
                      for (const auto& n : names) ts.push_back(*store.get(n));
                      return stack(ts);
                    },
                    {}});
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
      if ((gemma && ends_with(module, "router.proj")) ||
          (moe && (ends_with(module, "mlp.gate") || ends_with(module, "shared_expert_gate"))))
        spec = QuantSpec{.quantized = true, .bits = 8, .group_size = 64};
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
