// Normalizers of tokenizer.json ("normalizer"): text -> text, applied to each stretch of input
// between added tokens. Supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend,
// Strip. Offsets are not tracked: kiln only needs ids.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"

namespace kiln::tokenization {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Writes the normalized form of valid UTF-8 `text` to `out` (which is not `text`).
  virtual Status normalize(std::string_view text, std::string& out) const = 0;
  // A short description for the load log, such as "Sequence[NFC, Replace]".
  virtual std::string describe() const = 0;
};

// nullptr for a null spec; an error naming the type for unsupported ones.
// `depth`: how many Sequences hold this one (refused past kMaxComponentNesting).
Result<std::unique_ptr<Normalizer>> parse_normalizer(const nlohmann::json& spec, int depth = 0);

}  // namespace kiln::tokenization
