#include "models/image_processor.h"

#include <filesystem>
#include <fstream>

namespace kiln {

Result<std::string> expand_image_placeholders(std::string_view text, const ImagePlaceholder& p,
                                              std::span<const ProcessedImage> images) {
  if (p.token.empty()) return make_error("the image placeholder token is empty");
  std::vector<size_t> at;
  for (size_t pos = text.find(p.token); pos != std::string_view::npos; pos = text.find(p.token, pos + p.token.size()))
    at.push_back(pos);
  if (at.size() != images.size())
    return make_error("the prompt holds {} image placeholder{} ({}) for {} image{}", at.size(),
                      at.size() == 1 ? "" : "s", p.token, images.size(), images.size() == 1 ? "" : "s");
  std::string out;
  size_t from = 0;
  for (size_t i = 0; i < at.size(); ++i) {
    out.append(text.substr(from, at[i] - from));
    out += p.begin;
    for (int64_t k = 0; k < images[i].soft_tokens; ++k) out += p.token;
    out += p.end;
    from = at[i] + p.token.size();
  }
  out.append(text.substr(from));
  return out;
}

Result<std::vector<int64_t>> find_image_runs(std::span<const int32_t> ids, const ImagePlaceholder& p,
                                             std::span<const ProcessedImage> images) {
  struct Run {
    int64_t offset, length;
  };
  std::vector<Run> runs;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] != p.token_id) continue;
    if (i > 0 && ids[i - 1] == p.token_id) {
      ++runs.back().length;
    } else {
      runs.push_back({int64_t(i), 1});
    }
  }
  if (runs.size() != images.size())
    return make_error("the ids hold {} run{} of the image token {} ({}) for {} image{}", runs.size(),
                      runs.size() == 1 ? "" : "s", p.token_id, p.token, images.size(), images.size() == 1 ? "" : "s");
  std::vector<int64_t> offsets;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].length != images[i].soft_tokens)
      return make_error("image {} fills {} soft tokens, but the run of image tokens at id {} is {} long", i + 1,
                        images[i].soft_tokens, runs[i].offset, runs[i].length);
    offsets.push_back(runs[i].offset);
  }
  return offsets;
}

namespace {

Result<nlohmann::json> read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return make_error("cannot open {}", path.string());
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return make_error("{} is not a JSON object", path.string());
  return j;
}

}  // namespace

Result<ImageProcessorSettings> read_image_processor_settings(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  ImageProcessorSettings s;
  if (const auto path = dir / "processor_config.json"; std::filesystem::exists(path)) {
    KILN_ASSIGN(nlohmann::json j, read_json_file(path));
    if (j.contains("image_processor")) {
      if (!j["image_processor"].is_object()) return make_error("{}: image_processor is not an object", path.string());
      s.values = j["image_processor"];
      s.source = path.string();
      return s;
    }
  }
  if (const auto path = dir / "preprocessor_config.json"; std::filesystem::exists(path)) {
    KILN_ASSIGN(s.values, read_json_file(path));
    s.source = path.string();
  }
  return s;
}

std::string tokenizer_token(const std::string& model_dir, const std::string& key, const std::string& fallback) {
  const auto path = std::filesystem::path(model_dir) / "tokenizer_config.json";
  if (!std::filesystem::exists(path)) return fallback;
  auto j = read_json_file(path);
  if (!j.ok() || !j->contains(key) || !(*j)[key].is_string()) return fallback;
  return (*j)[key].get<std::string>();
}

Status read_pixel_scaling(ConfigReader& r, PixelScaling& s) {
  s.rescale = r.get_bool("do_rescale", s.rescale);
  s.rescale_factor = r.get_float("rescale_factor", s.rescale_factor);
  s.normalize = r.get_bool("do_normalize", s.normalize);
  KILN_TRY(r.status());
  for (const char* key : {"image_mean", "image_std"}) {
    if (!r.has(key)) continue;
    const nlohmann::json& v = r.json().at(key);
    std::array<double, 3>& dst = std::string_view(key) == "image_mean" ? s.mean : s.std;
    if (v.is_number()) {
      dst.fill(v.get<double>());
    } else if (v.is_array() && v.size() == 3 && v[0].is_number() && v[1].is_number() && v[2].is_number()) {
      for (size_t c = 0; c < 3; ++c) dst[c] = v[c].get<double>();
    } else {
      return make_error("{}: {} must be a number or three numbers", r.where(), key);
    }
  }
  if (s.rescale && !(s.rescale_factor > 0)) return make_error("{}: rescale_factor must be positive", r.where());
  for (double v : s.std)
    if (s.normalize && v == 0) return make_error("{}: image_std holds a zero", r.where());
  return ok_status();
}

Status check_bicubic(ConfigReader& r) {
  if (!r.has("resample")) return ok_status();
  const int64_t resample = r.get_int("resample");
  KILN_TRY(r.status());
  if (resample != 3)
    return make_error("{}: resample {} is not supported (kiln resizes with bicubic, PIL's 3)", r.where(), resample);
  return ok_status();
}

Result<int32_t> image_token_id(const ModelConfigFile& config, int32_t fallback) {
  for (const nlohmann::json* j : {&config.root, &config.text}) {
    if (!j->contains("image_token_id") || (*j)["image_token_id"].is_null()) continue;
    const nlohmann::json& v = (*j)["image_token_id"];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      return make_error("{}: image_token_id must be a token id", config.path);
    return int32_t(v.get<int64_t>());
  }
  return fallback;
}

}  // namespace kiln
