#include "text/tokenizer/added_vocabulary.h"

#include <algorithm>

#include "text/tokenizer/normalizers.h"
#include "text/tokenizer/unicode.h"

namespace kiln::tokenization {

TokenTrie::TokenTrie() : nodes_(1) {}

int32_t TokenTrie::child(int32_t node, unsigned char byte) const {
  const auto& children = nodes_[size_t(node)].children;
  auto it = std::lower_bound(children.begin(), children.end(), byte,
                             [](const std::pair<unsigned char, int32_t>& c, unsigned char b) { return c.first < b; });
  return it != children.end() && it->first == byte ? it->second : -1;
}

void TokenTrie::add(std::string_view content, int32_t value) {
  if (content.empty()) return;
  first_bytes_[static_cast<unsigned char>(content[0])] = true;
  int32_t node = 0;
  for (char c : content) {
    const auto byte = static_cast<unsigned char>(c);
    int32_t next = child(node, byte);
    if (next < 0) {
      next = int32_t(nodes_.size());
      nodes_.emplace_back();
      auto& children = nodes_[size_t(node)].children;
      children.insert(std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t(-1))),
                      {byte, next});
    }
    node = next;
  }
  nodes_[size_t(node)].value = value;
}

std::pair<int32_t, size_t> TokenTrie::longest_match(std::string_view text, size_t at) const {
  std::pair<int32_t, size_t> best{-1, at};
  int32_t node = 0;
  for (size_t i = at; i < text.size(); ++i) {
    node = child(node, static_cast<unsigned char>(text[i]));
    if (node < 0) break;
    if (nodes_[size_t(node)].value >= 0) best = {nodes_[size_t(node)].value, i + 1};
  }
  return best;
}

Result<AddedVocabulary> AddedVocabulary::create(std::vector<AddedToken> tokens, const Normalizer* normalizer) {
  AddedVocabulary vocabulary;
  vocabulary.tokens_ = std::move(tokens);
  std::string normalized_content;
  for (size_t i = 0; i < vocabulary.tokens_.size(); ++i) {
    const AddedToken& token = vocabulary.tokens_[i];
    if (token.content.empty()) continue;  // HF ignores empty tokens
    if (token.id < 0) return make_error("added token '{}' has no valid id", token.content);
    vocabulary.id_of_content_.insert_or_assign(token.content, token.id);
    std::string matched_form = token.content;
    if (token.normalized && normalizer != nullptr) {
      KILN_TRY(normalizer->normalize(token.content, normalized_content));
      matched_form = normalized_content;
    }
    vocabulary.decoded_form_.insert_or_assign(token.id, matched_form);
    if (token.special) {
      vocabulary.special_contents_.insert(token.content);
      vocabulary.special_ids_.insert(token.id);
    }
    (token.normalized ? vocabulary.normalized_trie_ : vocabulary.raw_trie_).add(matched_form, int32_t(i));
  }
  return vocabulary;
}

namespace {

bool ends_with_word(std::string_view text) {
  if (text.empty()) return false;
  size_t end = text.size();
  return is_word_character(previous_code_point(text, end));
}

bool starts_with_word(std::string_view text) {
  if (text.empty()) return false;
  size_t offset = 0;
  return is_word_character(next_code_point(text, offset));
}

// Start of the whitespace run that ends `text` (text.size() when there is none).
size_t trailing_space_start(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    size_t previous = end;
    if (!is_white_space(previous_code_point(text, previous))) break;
    end = previous;
  }
  return end;
}

size_t leading_space_length(std::string_view text) {
  size_t offset = 0;
  while (offset < text.size()) {
    size_t next = offset;
    if (!is_white_space(next_code_point(text, next))) break;
    offset = next;
  }
  return offset;
}

}  // namespace

void AddedVocabulary::split(std::string_view text, bool normalized, std::vector<TextSplit>& out) const {
  out.clear();
  if (text.empty()) return;
  const TokenTrie& trie = normalized ? normalized_trie_ : raw_trie_;
  if (trie.empty()) {
    out.push_back({0, text.size(), -1});
    return;
  }
  size_t split_start = 0;  // end of the previous token: where the next split starts
  size_t at = 0;
  while (at < text.size()) {
    if (!trie.can_start_with(static_cast<unsigned char>(text[at]))) {
      ++at;
      continue;
    }
    const auto [index, match_end] = trie.longest_match(text, at);
    if (index < 0) {
      ++at;
      continue;
    }
    const AddedToken& token = tokens_[size_t(index)];
    size_t start = at;
    size_t stop = match_end;
    // the next match is searched from the end of this one, whether or not this one is used
    at = match_end;
    if (token.single_word) {
      const bool space_before = start == 0 || !ends_with_word(text.substr(0, start));
      const bool space_after = stop == text.size() || !starts_with_word(text.substr(stop));
      if (!space_before || !space_after) continue;
    }
    // only reachable after an rstrip token swallowed the start of this match
    if (start < split_start) continue;
    if (token.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), split_start);
    if (token.rstrip) stop += leading_space_length(text.substr(stop));
    if (split_start < start) out.push_back({split_start, start, -1});
    out.push_back({start, stop, token.id});
    split_start = stop;
  }
  if (split_start != text.size()) out.push_back({split_start, text.size(), -1});
}

std::optional<int32_t> AddedVocabulary::token_to_id(std::string_view content) const {
  auto it = id_of_content_.find(content);
  if (it == id_of_content_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string_view> AddedVocabulary::id_to_token(int32_t id) const {
  auto it = decoded_form_.find(id);
  if (it == decoded_form_.end()) return std::nullopt;
  return it->second;
}

}  // namespace kiln::tokenization
