// Added tokens (tokenizer.json "added_tokens"): special and user tokens that are cut out of the
// text before the model sees it, leftmost-longest first, as HF's AddedVocabulary does. Tokens
// with normalized=false match the raw input; those with normalized=true match after the
// normalizer ran. lstrip/rstrip swallow adjacent whitespace; single_word tokens only match where
// no word character touches them.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/status.h"
#include "text/tokenizer/token_table.h"

namespace kiln::tokenization {

class Normalizer;

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// A stretch of the text being split: an added token (token_id >= 0) or text in between.
struct TextSplit {
  size_t begin;
  size_t end;
  int32_t token_id;
};

// Byte trie of token contents, for leftmost-longest matching.
class TokenTrie {
 public:
  TokenTrie();
  void add(std::string_view content, int32_t value);
  bool empty() const { return nodes_.size() == 1; }
  // The longest token starting at `at`: its value and end, or value -1.
  std::pair<int32_t, size_t> longest_match(std::string_view text, size_t at) const;
  // Whether any token starts with this byte (a fast filter).
  bool can_start_with(unsigned char byte) const { return first_bytes_[byte]; }

 private:
  struct Node {
    int32_t value = -1;
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
  };
  int32_t child(int32_t node, unsigned char byte) const;
  std::vector<Node> nodes_;
  std::array<bool, 256> first_bytes_{};
};

class AddedVocabulary {
 public:
  // `normalizer` gives the matching form of normalized tokens (may be null).
  static Result<AddedVocabulary> create(std::vector<AddedToken> tokens, const Normalizer* normalizer);

  // Splits `text` by the tokens of one pass: before normalization (`normalized` false) or after.
  void split(std::string_view text, bool normalized, std::vector<TextSplit>& out) const;
  bool has_normalized_tokens() const { return !normalized_trie_.empty(); }

  std::optional<int32_t> token_to_id(std::string_view content) const;
  // The token's text for decoding (its normalized form for normalized tokens).
  std::optional<std::string_view> id_to_token(int32_t id) const;
  bool is_special_token(std::string_view content) const {
    return special_contents_.find(content) != special_contents_.end();
  }
  bool is_special_id(int32_t id) const { return special_ids_.contains(id); }
  size_t size() const { return tokens_.size(); }
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  std::vector<AddedToken> tokens_;
  TokenIdMap id_of_content_;
  std::unordered_map<int32_t, std::string> decoded_form_;  // id -> content (normalized form if normalized)
  std::unordered_set<std::string, StringHash, std::equal_to<>> special_contents_;
  std::unordered_set<int32_t> special_ids_;
  TokenTrie raw_trie_;  // values: index into tokens_
  TokenTrie normalized_trie_;
};

}  // namespace kiln::tokenization
