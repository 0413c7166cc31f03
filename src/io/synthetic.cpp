#include "io/synthetic.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include <fmt/format.h>

#include <thread>

#include "core/thread_pool.h"

namespace kiln {

namespace {

// splitmix64: a fast, well-mixed generator; one stream per block of elements
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

float uniform01(uint64_t& state) {
  state = mix(state);
  return float((state >> 40) + 1) / float(1ull << 24);  // (0, 1]
}

constexpr int64_t kBlock = 1 << 16;

void fill_block(const SyntheticTensor& t, uint64_t seed, size_t tensor_index, int64_t block, int64_t count,
                DType dtype, char* out) {
  uint64_t state = mix(seed ^ mix(uint64_t(tensor_index) * 0x100000001b3ull + uint64_t(block)));
  for (int64_t i = 0; i < count; ++i) {
    float v = t.a;
    if (t.fill == SyntheticTensor::Fill::normal) {
      // Box-Muller
      const float u1 = uniform01(state), u2 = uniform01(state);
      v = t.a * std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
    } else if (t.fill == SyntheticTensor::Fill::uniform) {
      v = t.a + (t.b - t.a) * uniform01(state);
    }
    if (dtype == DType::bf16) {
      const uint16_t h = f32_to_bf16(v);
      std::memcpy(out + i * 2, &h, 2);
    } else {
      std::memcpy(out + i * 4, &v, 4);
    }
  }
}

const char* safetensors_dtype(DType t) { return t == DType::bf16 ? "BF16" : "F32"; }

}  // namespace

Status write_synthetic_checkpoint(const std::string& out_dir, const nlohmann::json& config,
                                  const std::vector<SyntheticTensor>& tensors, const SyntheticOptions& options) {
  if (options.dtype != DType::bf16 && options.dtype != DType::f32)
    return make_error("synthetic checkpoints are written in bf16 or f32");
  if (::mkdir(out_dir.c_str(), 0755) != 0 && errno != EEXIST)
    return make_error("cannot create {}: {}", out_dir, std::strerror(errno));
  {
    std::ofstream cfg(out_dir + "/config.json");
    cfg << config.dump(2) << "\n";
    if (!cfg) return make_error("cannot write {}/config.json", out_dir);
  }

  // assign tensors to shards in order
  const size_t esize = dtype_size(options.dtype);
  std::vector<std::vector<size_t>> shards(1);
  size_t shard_size = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const size_t bytes = size_t(tensors[i].shape.numel()) * esize;
    if (shard_size > 0 && shard_size + bytes > options.shard_bytes) {
      shards.emplace_back();
      shard_size = 0;
    }
    shards.back().push_back(i);
    shard_size += bytes;
  }

  ThreadPool pool(options.threads > 0 ? options.threads : int(std::max(1u, std::thread::hardware_concurrency())));
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  size_t total = 0;
  std::vector<char> buffer;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = shards.size() == 1 ? "model.safetensors"
                                                 : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1,
                                                               shards.size());
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    header["__metadata__"] = {{"format", "pt"}};
    size_t offset = 0;
    for (size_t i : shards[s]) {
      const size_t bytes = size_t(tensors[i].shape.numel()) * esize;
      std::vector<int64_t> shape;
      for (int d = 0; d < tensors[i].shape.rank(); ++d) shape.push_back(tensors[i].shape[d]);
      header[tensors[i].name] = {{"dtype", safetensors_dtype(options.dtype)},
                                 {"shape", shape},
                                 {"data_offsets", {offset, offset + bytes}}};
      weight_map[tensors[i].name] = name;
      offset += bytes;
    }
    total += offset;
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    const std::string path = out_dir + "/" + name;
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
    if (!f) return make_error("cannot open {} for writing: {}", path, std::strerror(errno));
    const uint64_t len = text.size();
    if (std::fwrite(&len, 8, 1, f.get()) != 1 || std::fwrite(text.data(), 1, text.size(), f.get()) != text.size())
      return make_error("cannot write {}: {}", path, std::strerror(errno));
    for (size_t i : shards[s]) {
      const int64_t n = tensors[i].shape.numel();
      const int64_t blocks = (n + kBlock - 1) / kBlock;
      // generate a slice of blocks in parallel, then write it
      const int64_t blocks_per_pass = 256;
      for (int64_t b0 = 0; b0 < blocks; b0 += blocks_per_pass) {
        const int64_t b1 = std::min(blocks, b0 + blocks_per_pass);
        const int64_t first = b0 * kBlock, last = std::min(n, b1 * kBlock);
        buffer.resize(size_t(last - first) * esize);
        pool.parallel_for(b1 - b0, [&](int64_t begin, int64_t end) {
          for (int64_t b = b0 + begin; b < b0 + end; ++b) {
            const int64_t start = b * kBlock, count = std::min(kBlock, n - start);
            fill_block(tensors[i], options.seed, i, b, count, options.dtype,
                       buffer.data() + size_t(start - first) * esize);
          }
        });
        if (std::fwrite(buffer.data(), 1, buffer.size(), f.get()) != buffer.size())
          return make_error("cannot write {}: {}", path, std::strerror(errno));
      }
    }
    if (std::fflush(f.get()) != 0) return make_error("cannot write {}: {}", path, std::strerror(errno));
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    std::ofstream out(out_dir + "/model.safetensors.index.json");
    out << index.dump(2) << "\n";
    if (!out) return make_error("cannot write {}/model.safetensors.index.json", out_dir);
  }
  return ok_status();
}

}  // namespace kiln
