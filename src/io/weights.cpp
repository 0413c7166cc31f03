#include "io/weights.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/files.h"

namespace kiln {

namespace {

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string basename_of(const std::string& path) {
  auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

}  // namespace

std::string canonical_weight_name(const std::string& name) {
  std::string n = name;
  for (const char* prefix : {"model.language_model.", "language_model.model.", "language_model.", "model."}) {
    if (starts_with(n, prefix)) {
      n = n.substr(std::strlen(prefix));
      break;
    }
  }
  return n;
}

Result<WeightStore> WeightStore::open(const std::string& dir, const std::vector<std::string>& sidecars) {
  WeightStore store;
  store.dir_ = dir;
  std::vector<std::string> files;
  std::map<std::string, std::string> expected_file;  // from the index: tensor -> file
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";

  if (file_exists(index_path)) {
    KILN_TRY(require_regular_file_if_present(index_path));
    std::ifstream in(index_path);
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(in);
      const auto& map = index.at("weight_map");
      if (!map.is_object()) return make_error("{}: 'weight_map' must be an object", index_path);
      std::set<std::string> unique;
      for (auto it = map.begin(); it != map.end(); ++it) {
        std::string f = it.value().get<std::string>();
        if (f.find('/') != std::string::npos || f == "..")
          return make_error("{}: shard name '{}' must be a plain file name", index_path, f);
        expected_file[it.key()] = f;
        if (unique.insert(f).second) files.push_back(f);
      }
    } catch (const nlohmann::json::exception& e) {
      return make_error("{} is corrupt: {}", index_path, e.what());
    }
    if (files.empty()) return make_error("{} lists no tensors", index_path);
  } else if (file_exists(single)) {
    files.push_back("model.safetensors");
  } else {
    return make_error("no model.safetensors or model.safetensors.index.json in {}", dir);
  }

  bool any_mlx = false, any_other = false;
  for (const auto& f : files) {
    auto path = dir + "/" + f;
    if (!file_exists(path)) {
      if (!expected_file.empty()) return make_error("missing file {} (listed in model.safetensors.index.json)", path);
      return make_error("missing file {}", path);
    }
    KILN_ASSIGN(auto file, SafetensorsFile::open(path));
    for (const auto& info : file->tensors()) {
      if (!expected_file.empty()) {
        auto it = expected_file.find(info.name);
        if (it == expected_file.end() || it->second != f) continue;  // the index decides where a tensor lives
      }
      std::string canonical = canonical_weight_name(info.name);
      if (store.entries_.count(canonical))
        return make_error("tensor '{}' appears twice in {} (as '{}')", canonical, dir, info.name);
      store.entries_[canonical] = Entry{file, &info};
      store.total_bytes_ += info.nbytes;
      // mlx's "language_model." against transformers' "model." prefixes; unprefixed names (a tower
      // under mlx-vlm's "vision_tower.", "mtp.", "lm_head.") tell neither
      if (starts_with(info.name, "language_model."))
        any_mlx = true;
      else if (canonical != info.name)
        any_other = true;
    }
  }
  for (const auto& [name, f] : expected_file) {
    std::string canonical = canonical_weight_name(name);
    if (!store.entries_.count(canonical))
      return make_error("model.safetensors.index.json lists '{}' in {}, but that file does not contain it", name, f);
  }
  store.mlx_prefixed_ = any_mlx && !any_other;

  std::vector<std::string> opened;  // a sidecar named twice (by its own name and by config.json) opens once
  for (const auto& f : sidecars) {
    if (f.empty() || f.find('/') != std::string::npos || f == ".." ||
        std::find(files.begin(), files.end(), f) != files.end() || !file_exists(dir + "/" + f) ||
        std::find(opened.begin(), opened.end(), f) != opened.end())
      continue;
    opened.push_back(f);
    KILN_ASSIGN(auto file, SafetensorsFile::open(dir + "/" + f));
    for (const auto& info : file->tensors()) {
      std::string canonical = canonical_weight_name(info.name);
      if (store.entries_.count(canonical))
        return make_error("tensor '{}' of {} is also in the model's main files", info.name, f);
      store.entries_[canonical] = Entry{file, &info, f};
    }
  }
  return store;
}

size_t WeightStore::used_bytes() const {
  size_t bytes = 0;
  for (const auto& name : used_) bytes += entries_.at(name).info->nbytes;
  return bytes;
}

std::string WeightStore::sidecar_of(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? std::string() : it->second.sidecar;
}

std::string WeightStore::describe(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return "'" + name + "'";
  return "'" + it->second.info->name + "' in " + basename_of(it->second.file->path());
}

Result<Tensor> WeightStore::get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return make_error("missing tensor '{}' in {}", name, dir_);
  used_.insert(name);
  return it->second.file->view(*it->second.info);
}

Result<Tensor> WeightStore::get(const std::string& name, const Shape& expected) const {
  KILN_ASSIGN(Tensor t, get(name));
  if (t.shape() != expected)
    return make_error("tensor {} has shape {}, but config.json implies {}", describe(name), t.shape().str(),
                      expected.str());
  return t;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

std::vector<std::string> WeightStore::unused() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_)
    if (!used_.count(name)) out.push_back(name);
  return out;
}

}  // namespace kiln
