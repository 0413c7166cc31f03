// Reading tokenizer.json. The file is mostly two huge tables (model.vocab, model.merges: 33 MB
// for Gemma); a streaming (SAX) parse builds the vocabulary map and the merge list (as id pairs)
// directly, and a JSON document only for the small rest, which keeps loading well under a second.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "text/tokenizer/token_table.h"

namespace kiln::tokenization {

struct TokenizerJson {
  nlohmann::json document;  // everything but model.vocab and model.merges
  TokenTable vocab;         // model.vocab (a token listed twice keeps its last id, as in HF)
  // model.merges ("a b" or ["a", "b"]) as pairs of vocab ids, in rank order
  std::vector<std::pair<int32_t, int32_t>> merges;
  bool has_vocab = false;
  bool has_merges = false;
};

// Errors name what is wrong inside the document; the caller prefixes the file.
Result<TokenizerJson> parse_tokenizer_json(std::string_view text);

// Parses a small JSON file that holds an object (tokenizer_config.json, generation_config.json).
Result<nlohmann::json> parse_json(std::string_view text, const std::string& name);

Result<std::string> read_file(const std::string& path);

}  // namespace kiln::tokenization
