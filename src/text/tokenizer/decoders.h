// Decoders of tokenizer.json ("decoder"): token strings -> text, as HF's decode_chain (each step
// maps a list of strings to a list of strings; the results are joined). Supported: Sequence,
// ByteLevel, ByteFallback, Fuse, Replace, Strip, Metaspace.
//
// For streaming, each step also says whether the text of a token list is final, i.e. cannot
// change when more tokens follow: a ByteLevel list ending inside a multi-byte character is not,
// nor a ByteFallback list ending with a <0xNN> token (its byte run may grow and change meaning).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace kiln::tokenization {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual Status decode_chain(std::vector<std::string>& tokens) const = 0;
  // Whether decoding `tokens` (this step's input) gives text that no later token can change.
  virtual Result<bool> is_final(const std::vector<std::string>& tokens) const { return true; }
  virtual std::string describe() const = 0;
};

// `depth`: how many Sequences hold this one (refused past kMaxComponentNesting).
Result<std::unique_ptr<Decoder>> parse_decoder(const nlohmann::json& spec, int depth = 0);

}  // namespace kiln::tokenization
