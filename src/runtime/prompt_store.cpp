#include "runtime/prompt_store.h"

#include <fmt/format.h>
#include <openssl/evp.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

namespace kiln {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'P', 'C', '0', '1'};
constexpr int kFormat = 1;
constexpr size_t kDigestBytes = 32;
constexpr const char* kSuffix = ".state";
// A header is mostly its tokens (a few bytes each as JSON): this bounds what a corrupt length
// makes us allocate, far above any context.
constexpr uint64_t kMostHeaderBytes = uint64_t(1) << 30;
// A temporary file this old is a write a crash cut short (one being written now is younger).
constexpr auto kStaleTemporary = std::chrono::hours(1);

using Digest = std::array<unsigned char, kDigestBytes>;

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
    ok_ = ctx_ && EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) == 1;
  }
  void update(const void* data, size_t n) { ok_ = ok_ && EVP_DigestUpdate(ctx_.get(), data, n) == 1; }
  void update(std::string_view s) { update(s.data(), s.size()); }
  // Nothing when OpenSSL failed.
  std::optional<Digest> finish() {
    Digest d;
    unsigned int length = 0;
    if (!ok_ || EVP_DigestFinal_ex(ctx_.get(), d.data(), &length) != 1 || length != kDigestBytes) return std::nullopt;
    return d;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx_;
  bool ok_ = false;
};

std::string hex(const Digest& d) {
  std::string out;
  for (unsigned char c : d) out += fmt::format("{:02x}", c);
  return out;
}

std::array<unsigned char, 8> little_endian(uint64_t v) {
  std::array<unsigned char, 8> b;
  for (int i = 0; i < 8; ++i) b[size_t(i)] = static_cast<unsigned char>(v >> (8 * i));
  return b;
}

uint64_t read_little_endian(const unsigned char* b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[i];
  return v;
}

// An entry's file name: the SHA-256 of its tokens (as little-endian int32).
std::string entry_name(std::span<const int32_t> tokens) {
  Sha256 sha;
  for (int32_t t : tokens) {
    const auto b = little_endian(uint32_t(t));
    sha.update(b.data(), 4);
  }
  const auto d = sha.finish();
  return (d ? hex(*d) : std::string("unhashed")) + kSuffix;
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// One plain tensor of a layer's state, viewed as [slots, elements a slot].
struct Piece {
  std::string name;
  Tensor slots;
  bool ring = false;  // an attention ring's: slot p holds position p until the ring wraps
};

std::vector<Piece> layer_pieces(const LayerState& l) {
  std::vector<Piece> out;
  const auto by_slot = [](const Tensor& t, int64_t slots) { return t.reshape(Shape{slots, t.numel() / slots}); };
  if (l.kv.capacity > 0) {
    const int64_t capacity = l.kv.capacity;
    for (const auto& [name, t] : {std::pair<std::string, const Tensor*>{"k", &l.kv.k}, {"v", &l.kv.v}}) {
      const std::vector<Tensor> parts = stored_pieces(*t);
      static constexpr const char* kParts[] = {".codes", ".scales", ".biases"};
      for (size_t i = 0; i < parts.size(); ++i)
        out.push_back({parts.size() == 1 ? name : name + kParts[i], by_slot(parts[i], capacity), true});
    }
    out.push_back({"slot_pos", by_slot(l.kv.slot_pos, capacity), true});
  }
  if (l.conv.numel()) out.push_back({"conv", by_slot(l.conv, l.conv.rows()), false});
  if (l.recurrent.numel()) out.push_back({"recurrent", by_slot(l.recurrent, l.recurrent.rows()), false});
  return out;
}

// The rows of a piece a state of `length` tokens uses: a ring that never wrapped holds them in its
// first slots; a ring that wrapped, and any other state, whole.
int64_t rows_kept(const Piece& p, int64_t length) {
  return p.ring ? std::min(p.slots.rows(), length) : p.slots.rows();
}

struct PieceHeader {
  std::string name;
  DType dtype = DType::u8;
  int64_t rows = 0, cols = 0;
  uint64_t bytes = 0;
};

struct FileHeader {
  std::vector<int32_t> tokens;
  int64_t length = 0, rope_offset = 0;
  std::vector<std::vector<PieceHeader>> layers;
  uint64_t file_bytes = 0;  // what the header and the blobs add up to, the checksum included
};

std::optional<int64_t> integer(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX)) return std::nullopt;
  return it->get<int64_t>();
}

std::optional<DType> dtype_named(std::string_view name) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::u32, DType::i64, DType::u8, DType::i8})
    if (dtype_name(t) == name) return t;
  return std::nullopt;
}

// A count in a JSON object: -1 when it is missing or not a non-negative integer.
int64_t count(const nlohmann::json& j, const char* key) {
  const auto n = integer(j, key);
  return n && *n >= 0 ? *n : -1;
}

Result<PieceHeader> parse_piece(const nlohmann::json& p, size_t layer) {
  if (!p.is_object()) return make_error("its header's layer {} has a malformed piece", layer);
  const auto name = p.find("name"), dtype = p.find("dtype");
  const int64_t rows = count(p, "rows"), cols = count(p, "cols"), bytes = count(p, "bytes");
  if (name == p.end() || !name->is_string() || dtype == p.end() || !dtype->is_string() || rows < 0 || cols < 0 ||
      bytes < 0)
    return make_error("its header's layer {} has a malformed piece", layer);
  PieceHeader piece{.name = name->get<std::string>(), .rows = rows, .cols = cols, .bytes = uint64_t(bytes)};
  const auto type = dtype_named(dtype->get<std::string>());
  if (!type) return make_error("its piece {} of layer {} has an unknown dtype", piece.name, layer);
  piece.dtype = *type;
  int64_t expected = 0;
  if (__builtin_mul_overflow(rows, cols, &expected) ||
      __builtin_mul_overflow(expected, int64_t(dtype_size(piece.dtype)), &expected) || expected != bytes)
    return make_error("its piece {} of layer {} declares {} bytes for {} × {} {}", piece.name, layer, bytes, rows, cols,
                      dtype_name(piece.dtype));
  return piece;
}

Result<FileHeader> parse_header(std::string_view text, uint64_t header_bytes, const std::string& fingerprint) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error("its header is not a JSON object");
  const auto format = integer(j, "format");
  if (!format) return make_error("its header has no format version");
  if (*format != kFormat) return make_error("it is of format {} (this kiln reads {})", *format, kFormat);
  const auto fp = j.find("fingerprint");
  if (fp == j.end() || !fp->is_string() || fp->get<std::string>() != fingerprint)
    return make_error("it was written for another model or backend");
  FileHeader h;
  const auto tokens = j.find("tokens");
  if (tokens == j.end() || !tokens->is_array() || tokens->empty()) return make_error("its header has no tokens");
  for (const auto& t : *tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < INT32_MIN || t.get<int64_t>() > INT32_MAX)
      return make_error("its header's tokens are not 32-bit integers");
    h.tokens.push_back(int32_t(t.get<int64_t>()));
  }
  const auto length = integer(j, "length"), rope_offset = integer(j, "rope_offset");
  if (!length || *length != int64_t(h.tokens.size()))
    return make_error("its header's length is not its {} tokens", h.tokens.size());
  if (!rope_offset) return make_error("its header has no rope_offset");
  h.length = *length;
  h.rope_offset = *rope_offset;
  const auto layers = j.find("layers");
  if (layers == j.end() || !layers->is_array()) return make_error("its header has no layers");
  uint64_t total = sizeof kMagic + 8 + header_bytes + kDigestBytes;
  for (const auto& layer : *layers) {
    if (!layer.is_array()) return make_error("its header's layer {} is not a list of pieces", h.layers.size());
    auto& pieces = h.layers.emplace_back();
    for (const auto& p : layer) {
      KILN_ASSIGN(PieceHeader piece, parse_piece(p, h.layers.size() - 1));
      if (__builtin_add_overflow(total, piece.bytes, &total)) return make_error("its pieces overflow a file's size");
      pieces.push_back(std::move(piece));
    }
  }
  h.file_bytes = total;
  return h;
}

// Reads the magic, the header's length and the header into `sha`, and checks the file's size
// against what the header describes.
Result<FileHeader> read_header(std::FILE* f, uint64_t file_bytes, const std::string& fingerprint, Sha256* sha) {
  unsigned char start[sizeof kMagic + 8];
  if (std::fread(start, 1, sizeof start, f) != sizeof start) return make_error("it is shorter than a header");
  if (std::memcmp(start, kMagic, sizeof kMagic) != 0) return make_error("it is not a kiln prompt cache file");
  const uint64_t header_bytes = read_little_endian(start + sizeof kMagic);
  if (header_bytes > kMostHeaderBytes || header_bytes > file_bytes - sizeof start)
    return make_error("its header length {} exceeds the file", header_bytes);
  std::string text(size_t(header_bytes), '\0');
  if (std::fread(text.data(), 1, text.size(), f) != text.size()) return make_error("its header cannot be read");
  if (sha) {
    sha->update(start, sizeof start);
    sha->update(text);
  }
  KILN_ASSIGN(FileHeader h, parse_header(text, header_bytes, fingerprint));
  if (h.file_bytes != file_bytes)
    return make_error("it holds {} bytes where its header describes {} (truncated?)", file_bytes, h.file_bytes);
  return h;
}

std::optional<uint64_t> size_of(std::FILE* f) {
  struct stat st {};
  if (::fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return uint64_t(st.st_size);
}

// Checks that a file's pieces fit the state they would be loaded into.
Status check_fits(const FileHeader& h, const SequenceState& state) {
  if (h.length >= state.max_context())
    return make_error("it holds {} tokens; the sequence holds {}", h.length, state.max_context());
  if (h.layers.size() != state.layers().size())
    return make_error("it has {} layers; the model has {}", h.layers.size(), state.layers().size());
  for (size_t l = 0; l < h.layers.size(); ++l) {
    const std::vector<Piece> pieces = layer_pieces(state.layers()[l]);
    const auto& stored = h.layers[l];
    if (stored.size() != pieces.size())
      return make_error("layer {} has {} pieces; the model's has {}", l, stored.size(), pieces.size());
    for (size_t i = 0; i < pieces.size(); ++i) {
      const PieceHeader& s = stored[i];
      const Piece& p = pieces[i];
      if (s.name != p.name || s.dtype != p.slots.dtype() || s.cols != p.slots.cols())
        return make_error("layer {} piece {} is {} [{}] of {}; the model's is {} [{}] of {}", l, i, s.name, s.cols,
                          dtype_name(s.dtype), p.name, p.slots.cols(), dtype_name(p.slots.dtype()));
      // a ring that wrapped holds positions in slots of its own capacity
      const bool whole = !p.ring || s.rows < h.length;
      if (whole ? s.rows != p.slots.rows() : s.rows > p.slots.rows())
        return make_error("layer {} {} has {} rows; the model's has {}", l, p.name, s.rows, p.slots.rows());
    }
  }
  return ok_status();
}

// Reads a whole file into host tensors, one a piece, checking its checksum, then fills the state.
Status read_into(std::FILE* f, const std::string& fingerprint, SequenceState& state, Backend& backend, bool& corrupt) {
  corrupt = false;
  const auto file_bytes = size_of(f);
  if (!file_bytes) return make_error("it is not a regular file");
  Sha256 sha;
  auto header = read_header(f, *file_bytes, fingerprint, &sha);
  if (!header.ok()) {
    corrupt = true;
    return header.error();
  }
  const FileHeader& h = *header;
  KILN_TRY(check_fits(h, state));
  std::vector<Tensor> blobs;
  for (const auto& layer : h.layers)
    for (const PieceHeader& p : layer) {
      Tensor host = host_tensor(p.dtype, Shape{p.rows, p.cols});
      if (std::fread(host.data(), 1, p.bytes, f) != p.bytes) {
        corrupt = true;
        return make_error("its piece {} cannot be read", p.name);
      }
      sha.update(host.data(), p.bytes);
      blobs.push_back(std::move(host));
    }
  Digest stored;
  const auto computed = sha.finish();
  if (std::fread(stored.data(), 1, stored.size(), f) != stored.size()) {
    corrupt = true;
    return make_error("its checksum cannot be read");
  }
  if (!computed) return make_error("OpenSSL's SHA-256 failed");
  if (*computed != stored) {
    corrupt = true;
    return make_error("its checksum does not match its contents");
  }
  state.reset(backend);
  size_t next = 0;
  for (size_t l = 0; l < h.layers.size(); ++l)
    for (const Piece& p : layer_pieces(state.layers()[l])) {
      const Tensor& host = blobs[next++];
      Tensor rows = p.slots.rows_view(0, host.rows());
      backend.copy(host, rows);
    }
  backend.synchronize();  // the host tensors go when this returns
  state.set_length(h.length);
  state.set_rope_offset(h.rope_offset);
  return backend.status();
}

std::string mib(size_t bytes) {
  return fmt::format("{:.1f} MiB", double(bytes) / double(1 << 20));
}

}  // namespace

Result<std::string> model_fingerprint(const std::string& model_dir) {
  Sha256 sha;
  const auto field = [&](std::string_view s) {
    const auto n = little_endian(s.size());
    sha.update(n.data(), n.size());
    sha.update(s);
  };
  for (const char* name : {"config.json", "kv_config.json"}) {
    const fs::path path = fs::path(model_dir) / name;
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      if (std::string_view(name) == "config.json") return make_error("cannot read {}", path.string());
      continue;
    }
    field(name);
    field(std::string(std::istreambuf_iterator<char>(in), {}));
  }
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::directory_iterator it(model_dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".safetensors") files.push_back(it->path());
  if (ec) return make_error("cannot list {}: {}", model_dir, ec.message());
  std::sort(files.begin(), files.end());
  constexpr uint64_t kSample = uint64_t(64) << 10;
  for (const fs::path& path : files) {
    File f(std::fopen(path.c_str(), "rb"));
    const auto size = f ? size_of(f.get()) : std::nullopt;
    if (!size) return make_error("cannot read {}", path.string());
    unsigned char length[8];
    if (*size < 8 || std::fread(length, 1, 8, f.get()) != 8)
      return make_error("{} is shorter than a header", path.string());
    const uint64_t header_bytes = read_little_endian(length);
    if (header_bytes > *size - 8)
      return make_error("{}: its header length {} exceeds the file", path.string(), header_bytes);
    std::string header(size_t(header_bytes), '\0');
    if (std::fread(header.data(), 1, header.size(), f.get()) != header.size())
      return make_error("cannot read {}'s header", path.string());
    field(path.filename().string());
    const auto n = little_endian(*size);
    sha.update(n.data(), n.size());
    field(header);
    // samples of the data at its start, end and two points between
    const uint64_t begin = 8 + header_bytes, data = *size - begin, sample = std::min(kSample, data);
    std::string bytes(size_t(sample), '\0');
    for (uint64_t i = 0; i < 4; ++i) {
      const uint64_t offset = begin + (data - sample) * i / 3;
      if (::fseeko(f.get(), off_t(offset), SEEK_SET) != 0 ||
          std::fread(bytes.data(), 1, bytes.size(), f.get()) != bytes.size())
        return make_error("cannot read {} at byte {}", path.string(), offset);
      sha.update(bytes);
    }
  }
  const auto d = sha.finish();
  if (!d) return make_error("could not fingerprint {} (OpenSSL's SHA-256 failed)", model_dir);
  return hex(*d);
}

PromptStore::PromptStore(const PromptStoreOptions& options, fs::path directory)
    : options_(options), directory_(std::move(directory)) {}

Result<std::unique_ptr<PromptStore>> PromptStore::open(const PromptStoreOptions& options) {
  if (options.dir.empty()) return make_error("the prompt cache directory is not named");
  Sha256 sha;
  sha.update(options.fingerprint);
  const auto d = sha.finish();
  if (!d) return make_error("could not hash the prompt cache's fingerprint (OpenSSL's SHA-256 failed)");
  // a directory a fingerprint: two models (or backends) sharing DIR never see each other's files
  const fs::path directory = fs::path(options.dir) / hex(*d).substr(0, 32);
  std::error_code ec;
  fs::create_directories(directory, ec);
  if (ec) return make_error("cannot create the prompt cache directory {}: {}", directory.string(), ec.message());
  if (!fs::is_directory(directory, ec)) return make_error("{} is not a directory", directory.string());
  if (::access(directory.c_str(), R_OK | W_OK | X_OK) != 0)
    return make_error("the prompt cache directory {} is not writable: {}", directory.string(), std::strerror(errno));
  std::unique_ptr<PromptStore> store(new PromptStore(options, directory));
  store->index_directory();
  spdlog::info("prompt cache directory {}: {} entries, {} of {}", directory.string(), store->entries(),
               mib(store->bytes()), mib(options.budget_bytes));
  store->thread_ = std::thread([p = store.get()] { p->writer(); });
  return store;
}

PromptStore::~PromptStore() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void PromptStore::index_directory() {
  const auto now = fs::file_time_type::clock::now();
  std::error_code ec;
  std::lock_guard lock(mutex_);
  for (fs::directory_iterator it(directory_, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& path = it->path();
    const std::string name = path.filename().string();
    std::error_code file_ec;
    if (name.ends_with(".tmp")) {
      const auto written = it->last_write_time(file_ec);
      if (!file_ec && now - written > kStaleTemporary) fs::remove(path, file_ec);
      continue;
    }
    if (!name.ends_with(kSuffix)) continue;
    File f(std::fopen(path.c_str(), "rb"));
    const auto size = f ? size_of(f.get()) : std::nullopt;
    auto header = size ? read_header(f.get(), *size, options_.fingerprint, nullptr)
                       : Result<FileHeader>(make_error("it cannot be read as a file"));
    if (header.ok() && name != entry_name(header->tokens))
      header = make_error("its name is not the hash of its tokens");
    if (!header.ok()) {
      spdlog::warn("prompt cache: skipping {}: {}", path.string(), header.error().message);
      continue;
    }
    const auto used = it->last_write_time(file_ec);
    index_bytes_ += header->file_bytes;
    index_[name] = Indexed{.tokens = std::move(header->tokens), .bytes = header->file_bytes, .used = used};
  }
  if (ec) spdlog::warn("prompt cache: cannot list {}: {}", directory_.string(), ec.message());
  evict_locked();
}

std::optional<PromptStore::Entry> PromptStore::find(std::span<const int32_t> tokens,
                                                    const std::function<bool(int64_t)>& usable, int64_t longer_than) {
  std::lock_guard lock(mutex_);
  const std::string* best = nullptr;
  size_t best_tokens = 0;
  for (const auto& [name, e] : index_) {
    const size_t n = e.tokens.size();
    if (n >= tokens.size() || int64_t(n) <= longer_than || (best && n <= best_tokens)) continue;
    if (!std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin())) continue;
    if (usable && !usable(int64_t(n))) continue;
    best = &name;
    best_tokens = n;
  }
  if (!best) return std::nullopt;
  return Entry{.name = *best, .tokens = int64_t(best_tokens)};
}

Status PromptStore::load(const Entry& entry, SequenceState& state, Backend& backend) {
  const fs::path path = directory_ / entry.name;
  File f;
  {
    // opened under the lock: the writer's eviction cannot remove it between the check and the open
    std::lock_guard lock(mutex_);
    if (!index_.count(entry.name)) return make_error("{} is no longer in the prompt cache", path.string());
    f.reset(std::fopen(path.c_str(), "rb"));
  }
  bool corrupt = false;
  Status read = f ? read_into(f.get(), options_.fingerprint, state, backend, corrupt)
                  : Status(make_error("it cannot be opened: {}", std::strerror(errno)));
  if (!read) {
    spdlog::warn("prompt cache: not loading {}: {}{}", path.string(), read.error().message,
                 corrupt ? " (removed)" : "");
    std::lock_guard lock(mutex_);
    if (auto it = index_.find(entry.name); it != index_.end()) {
      index_bytes_ -= it->second.bytes;
      index_.erase(it);
    }
    std::error_code ec;
    if (corrupt) fs::remove(path, ec);
    return make_error("{}: {}", path.string(), read.error().message);
  }
  const auto now = fs::file_time_type::clock::now();
  std::error_code ec;
  fs::last_write_time(path, now, ec);
  std::lock_guard lock(mutex_);
  if (auto it = index_.find(entry.name); it != index_.end()) it->second.used = now;
  spdlog::debug("prompt cache: {} tokens resumed from {}", entry.tokens, path.string());
  return ok_status();
}

void PromptStore::save(std::span<const int32_t> tokens, const SequenceState& state, Backend& backend) {
  if (tokens.empty() || state.length() != int64_t(tokens.size())) return;
  Pending p{.name = entry_name(tokens)};
  {
    std::lock_guard lock(mutex_);
    if (auto it = index_.find(p.name); it != index_.end()) {
      // seen again: it stays among the recently used
      const auto now = fs::file_time_type::clock::now();
      std::error_code ec;
      fs::last_write_time(directory_ / p.name, now, ec);
      it->second.used = now;
      return;
    }
    if (writing_.count(p.name)) return;
  }
  // the header (and so the file's size) before any copy, so that nothing is copied for a save that
  // is dropped. Only this thread queues entries: none for these tokens can appear meanwhile.
  p.tokens.assign(tokens.begin(), tokens.end());
  nlohmann::json layers = nlohmann::json::array();
  std::vector<Piece> pieces;
  size_t blob_bytes = 0;
  for (const LayerState& l : state.layers()) {
    nlohmann::json layer = nlohmann::json::array();
    for (Piece& piece : layer_pieces(l)) {
      const int64_t rows = rows_kept(piece, state.length());
      const size_t bytes = size_t(rows * piece.slots.cols()) * dtype_size(piece.slots.dtype());
      layer.push_back({{"name", piece.name},
                       {"dtype", std::string(dtype_name(piece.slots.dtype()))},
                       {"rows", rows},
                       {"cols", piece.slots.cols()},
                       {"bytes", bytes}});
      blob_bytes += bytes;
      piece.slots = piece.slots.rows_view(0, rows);
      pieces.push_back(std::move(piece));
    }
    layers.push_back(std::move(layer));
  }
  p.header =
      nlohmann::json{{"format", kFormat},        {"fingerprint", options_.fingerprint}, {"tokens", p.tokens},
                     {"length", state.length()}, {"rope_offset", state.rope_offset()},  {"layers", std::move(layers)}}
          .dump();
  p.bytes = sizeof kMagic + 8 + p.header.size() + blob_bytes + kDigestBytes;
  {
    std::lock_guard lock(mutex_);
    if (p.bytes > options_.budget_bytes) {
      spdlog::debug("prompt cache: a state of {} tokens ({}) exceeds the directory's budget", tokens.size(),
                    mib(p.bytes));
      return;
    }
    if (pending_bytes_ > 0 && pending_bytes_ + blob_bytes > options_.max_pending_bytes) {
      spdlog::debug("prompt cache: a state of {} tokens is not written: {} already wait", tokens.size(),
                    mib(pending_bytes_));
      return;
    }
    writing_.insert(p.name);
    pending_bytes_ += blob_bytes;
  }
  for (const Piece& piece : pieces) {
    Tensor host = host_tensor(piece.slots.dtype(), Shape{piece.slots.rows(), piece.slots.cols()});
    backend.copy(piece.slots, host);
    p.blobs.push_back(std::move(host));
  }
  backend.synchronize();
  std::lock_guard lock(mutex_);
  if (Status copied = backend.status(); !copied) {
    writing_.erase(p.name);
    pending_bytes_ -= blob_bytes;
    drained_.notify_all();
    return;
  }
  queue_.push_back(std::move(p));
  wake_.notify_one();
}

void PromptStore::flush() {
  std::unique_lock lock(mutex_);
  drained_.wait(lock, [&] { return writing_.empty(); });
}

size_t PromptStore::bytes() const {
  std::lock_guard lock(mutex_);
  return index_bytes_;
}

size_t PromptStore::entries() const {
  std::lock_guard lock(mutex_);
  return index_.size();
}

void PromptStore::writer() {
  for (;;) {
    Pending p;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued is written
      p = std::move(queue_.front());
      queue_.pop_front();
    }
    const Status written = write_file(p);
    if (!written) spdlog::warn("prompt cache: {}", written.error().message);
    size_t blob_bytes = 0;
    for (const Tensor& blob : p.blobs) blob_bytes += blob.nbytes();
    p.blobs.clear();
    {
      std::lock_guard lock(mutex_);
      writing_.erase(p.name);
      pending_bytes_ -= blob_bytes;
      if (written) {
        index_bytes_ += p.bytes;
        index_[p.name] =
            Indexed{.tokens = std::move(p.tokens), .bytes = p.bytes, .used = fs::file_time_type::clock::now()};
        evict_locked();
      }
    }
    drained_.notify_all();
  }
}

Status PromptStore::write_file(const Pending& p) const {
  const fs::path path = directory_ / p.name;
  // named for this process, so that two servers sharing a directory never write the same file
  const fs::path temporary = directory_ / fmt::format("{}.{}.tmp", p.name, ::getpid());
  File f(std::fopen(temporary.c_str(), "wb"));
  if (!f) return make_error("cannot create {}: {}", temporary.string(), std::strerror(errno));
  Sha256 sha;
  const auto put = [&](const void* data, size_t n) {
    sha.update(data, n);
    return std::fwrite(data, 1, n, f.get()) == n;
  };
  const auto header_bytes = little_endian(p.header.size());
  bool ok = put(kMagic, sizeof kMagic) && put(header_bytes.data(), header_bytes.size()) &&
            put(p.header.data(), p.header.size());
  for (const Tensor& blob : p.blobs) ok = ok && put(blob.data(), blob.nbytes());
  const auto digest = sha.finish();
  ok = ok && digest && std::fwrite(digest->data(), 1, digest->size(), f.get()) == digest->size();
  // on disk before it takes the entry's name: a crash leaves the old name or the whole file
  ok = ok && std::fflush(f.get()) == 0 && ::fsync(fileno(f.get())) == 0;
  const int error = errno;
  ok = std::fclose(f.release()) == 0 && ok;
  std::error_code ec;
  if (!ok) {
    fs::remove(temporary, ec);
    return make_error("cannot write {}: {}", temporary.string(), std::strerror(error ? error : errno));
  }
  fs::rename(temporary, path, ec);
  if (ec) {
    fs::remove(temporary, ec);
    return make_error("cannot rename {} to {}: {}", temporary.string(), path.filename().string(), ec.message());
  }
  return ok_status();
}

void PromptStore::evict_locked() {
  while (index_bytes_ > options_.budget_bytes && !index_.empty()) {
    auto oldest = std::min_element(index_.begin(), index_.end(),
                                   [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
    std::error_code ec;
    fs::remove(directory_ / oldest->first, ec);
    index_bytes_ -= oldest->second.bytes;
    index_.erase(oldest);
  }
}

}  // namespace kiln
