// Pre-tokenizers of tokenizer.json ("pre_tokenizer"): split normalized text into the pieces the
// model tokenizes one by one (and may rewrite them, as ByteLevel does). Supported: Sequence,
// Split, ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kiln::tokenization {

// A list of pieces stored back to back in one buffer (no allocation per piece).
class Pieces {
 public:
  void clear() {
    bytes_.clear();
    ends_.clear();
  }
  // Empty pieces are dropped, as HF drops empty splits.
  void add(std::string_view piece) {
    if (piece.empty()) return;
    bytes_.append(piece);
    ends_.push_back(uint32_t(bytes_.size()));
  }
  // Builds a piece from several parts (for pre-tokenizers that rewrite text).
  std::string& open_piece() { return bytes_; }
  void close_piece() {
    const uint32_t begin = ends_.empty() ? 0 : ends_.back();
    if (bytes_.size() > begin) ends_.push_back(uint32_t(bytes_.size()));
  }
  size_t size() const { return ends_.size(); }
  std::string_view operator[](size_t i) const {
    const uint32_t begin = i == 0 ? 0 : ends_[i - 1];
    return std::string_view(bytes_).substr(begin, ends_[i] - begin);
  }

  // Whether the first piece starts where the input text starts (Metaspace's prepend_scheme
  // "first" only prepends there).
  bool first_at_text_start = false;

 private:
  std::string bytes_;
  std::vector<uint32_t> ends_;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // `out` is cleared first; it is not `in`.
  virtual Status apply(const Pieces& in, Pieces& out) const = 0;
  virtual std::string describe() const = 0;
};

// `depth`: how many Sequences hold this one (refused past kMaxComponentNesting).
Result<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const nlohmann::json& spec, int depth = 0);

}  // namespace kiln::tokenization
