// The BPE model of HF tokenizers (models/bpe): a word (one pre-tokenized piece) starts as one
// symbol per character, or its <0xNN> byte tokens (byte_fallback), or unk; then the pair of
// adjacent symbols with the lowest merge rank is merged, leftmost first, until no pair has a
// merge. A priority queue over a linked list of symbols does this in O(n log n) per word, and a
// cache of word -> ids skips it for words seen before.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"
#include "text/tokenizer/token_table.h"

namespace kiln::tokenization {

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

// Open-addressing map from a pair of token ids to (merge rank, merged id): the BPE inner loop.
class MergeTable {
 public:
  struct Merge {
    uint32_t rank;
    int32_t new_id;
  };
  void reserve(size_t count);
  // Later insertions of the same pair win, as HF's HashMap collect does.
  void insert(int32_t left, int32_t right, Merge merge);
  const Merge* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = pack(left, right);
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.key == key) return &slot.merge;
      if (slot.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key = kEmpty;
    Merge merge{};
  };
  static uint64_t pack(int32_t left, int32_t right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }
  size_t slot_of(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  void grow();

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

// Reusable buffers of one encode call.
struct BpeScratch {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    uint32_t length;  // bytes of the word it covers; 0 once merged into its left neighbour
  };
  struct Candidate {
    uint32_t rank;
    uint32_t position;
    int32_t new_id;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::string token;  // for lookups with a prefix/suffix
};

class BpeModel {
 public:
  // `merges` are the pairs of tokenizer.json's model.merges as vocab ids, in rank order.
  static Result<std::unique_ptr<BpeModel>> create(TokenTable vocab,
                                                  const std::vector<std::pair<int32_t, int32_t>>& merges,
                                                  BpeOptions options);

  // Appends the ids of one pre-tokenized piece.
  Status tokenize(std::string_view word, std::vector<int32_t>& ids, BpeScratch& scratch) const;

  std::optional<int32_t> token_to_id(std::string_view token) const { return token_to_id_.find(token); }
  // nullopt for ids that are not in the vocabulary
  std::optional<std::string_view> id_to_token(int32_t id) const {
    if (id < 0 || size_t(id) >= id_to_token_.size() || id_to_token_[size_t(id)].data() == nullptr) return std::nullopt;
    return id_to_token_[size_t(id)];
  }
  size_t vocab_size() const { return token_to_id_.size(); }
  // The longest token's string in bytes: no token stands for more bytes of text than this.
  size_t longest_token_bytes() const {
    size_t longest = 0;
    for (std::string_view token : id_to_token_) longest = std::max(longest, token.size());
    return longest;
  }
  size_t merge_count() const { return merges_.size(); }
  const BpeOptions& options() const { return options_; }

 private:
  BpeModel() = default;
  Status merge_word(std::string_view word, std::vector<int32_t>& ids, BpeScratch& scratch) const;
  // The id of the single-character symbol at the given code point, or -1.
  int32_t char_id(char32_t c) const {
    if (c < dense_char_ids_.size()) return dense_char_ids_[c];
    auto it = sparse_char_ids_.find(c);
    return it == sparse_char_ids_.end() ? -1 : it->second;
  }

  BpeOptions options_;
  TokenTable token_to_id_;
  std::vector<std::string_view> id_to_token_;  // into token_to_id_; null data for ids without a token
  MergeTable merges_;
  // Single code point tokens, for the common case without prefix/suffix.
  std::vector<int32_t> dense_char_ids_;  // code points below 0x10000
  std::unordered_map<char32_t, int32_t> sparse_char_ids_;
  std::array<int32_t, 256> byte_fallback_ids_{};  // <0xNN> tokens, -1 where absent
  std::optional<int32_t> unk_id_;

  // Word -> ids of words seen before, shared by all callers. HF's limits: words under 256 bytes,
  // at most 10,000 entries (then the cache stops growing).
  static constexpr size_t kCacheMaxWordBytes = 256;
  static constexpr size_t kCacheCapacity = 10000;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace kiln::tokenization
