#include "text/tokenizer/bpe.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

#include "text/tokenizer/unicode.h"

namespace kiln::tokenization {

void MergeTable::reserve(size_t count) {
  const size_t capacity = std::bit_ceil(std::max<size_t>(16, count * 2));
  if (capacity <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  shift_ = 64 - std::countr_zero(capacity);
  size_ = 0;
  for (const Slot& slot : old)
    if (slot.key != kEmpty) insert(int32_t(slot.key >> 32), int32_t(uint32_t(slot.key)), slot.merge);
}

void MergeTable::grow() {
  reserve(std::max<size_t>(16, slots_.size()));
}

void MergeTable::insert(int32_t left, int32_t right, Merge merge) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const uint64_t key = pack(left, right);
  for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
    Slot& slot = slots_[i];
    if (slot.key == key) {
      slot.merge = merge;
      return;
    }
    if (slot.key == kEmpty) {
      slot.key = key;
      slot.merge = merge;
      ++size_;
      return;
    }
  }
}

Result<std::unique_ptr<BpeModel>> BpeModel::create(TokenTable vocab,
                                                   const std::vector<std::pair<int32_t, int32_t>>& merges,
                                                   BpeOptions options) {
  std::unique_ptr<BpeModel> model(new BpeModel());
  model->options_ = std::move(options);
  model->token_to_id_ = std::move(vocab);
  model->id_to_token_.assign(size_t(model->token_to_id_.max_id() + 1), std::string_view());
  model->token_to_id_.for_each([&](std::string_view token, int32_t id) { model->id_to_token_[size_t(id)] = token; });

  const bool plain = model->options_.continuing_subword_prefix.empty() && model->options_.end_of_word_suffix.empty();
  model->dense_char_ids_.assign(plain ? 0x10000 : 0, -1);
  if (plain) {
    model->token_to_id_.for_each([&](std::string_view token, int32_t id) {
      // only tokens of one character (at most 4 bytes) can be initial symbols
      if (token.empty() || token.size() > 4 || utf8_length(static_cast<unsigned char>(token[0])) != token.size() ||
          !is_valid_utf8(token))
        return;
      size_t offset = 0;
      const char32_t c = next_code_point(token, offset);
      if (c < 0x10000)
        model->dense_char_ids_[c] = id;
      else
        model->sparse_char_ids_[c] = id;
    });
  }
  model->byte_fallback_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    auto id = model->token_to_id(fmt::format("<0x{:02X}>", b));
    if (id) model->byte_fallback_ids_[size_t(b)] = *id;
  }
  if (model->options_.unk_token) model->unk_id_ = model->token_to_id(*model->options_.unk_token);

  // merges: (left id, right id) -> (rank, id of left + right without the right's prefix)
  const size_t prefix_length = model->options_.continuing_subword_prefix.size();
  model->merges_.reserve(merges.size());
  std::string merged;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto [left_id, right_id] = merges[rank];
    const auto left = model->id_to_token(left_id);
    const auto right = model->id_to_token(right_id);
    if (!left || !right) return make_error("merge {} uses an id without a token", rank);
    merged.assign(*left);
    merged.append(right->substr(std::min(prefix_length, right->size())));
    auto merged_id = model->token_to_id(merged);
    if (!merged_id)
      return make_error("merge {} ('{} {}') makes '{}', which is not in the vocabulary", rank, *left, *right, merged);
    model->merges_.insert(left_id, right_id, {uint32_t(rank), *merged_id});
  }
  return model;
}

Status BpeModel::tokenize(std::string_view word, std::vector<int32_t>& ids, BpeScratch& scratch) const {
  if (word.empty()) return ok_status();
  if (options_.ignore_merges) {
    if (auto id = token_to_id(word)) {
      ids.push_back(*id);
      return ok_status();
    }
  }
  const bool cacheable = word.size() < kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return ok_status();
    }
  }
  const size_t first = ids.size();
  KILN_TRY(merge_word(word, ids, scratch));
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.try_emplace(std::string(word), ids.begin() + first, ids.end());
  }
  return ok_status();
}

Status BpeModel::merge_word(std::string_view word, std::vector<int32_t>& ids, BpeScratch& scratch) const {
  auto& symbols = scratch.symbols;
  symbols.clear();
  auto add_symbol = [&](int32_t id, uint32_t length) {
    const int32_t index = int32_t(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back({id, index - 1, -1, length});
  };

  // 1. one symbol per character (its token, its byte tokens, or unk)
  const bool plain = !dense_char_ids_.empty();
  // an unk symbol not yet added (id -1: none), which grows over unknown characters with fuse_unk
  struct PendingUnk {
    int32_t id = -1;
    uint32_t length = 0;
  } pending_unk;
  size_t offset = 0;
  while (offset < word.size()) {
    const size_t start = offset;
    const char32_t c = next_code_point(word, offset);
    const uint32_t length = uint32_t(offset - start);
    int32_t id = -1;
    std::string_view token = word.substr(start, length);
    if (plain) {
      id = char_id(c);
    } else {
      scratch.token.clear();
      if (start > 0) scratch.token += options_.continuing_subword_prefix;
      scratch.token += token;
      if (offset == word.size()) scratch.token += options_.end_of_word_suffix;
      token = scratch.token;
      if (auto found = token_to_id(token)) id = *found;
    }
    if (id >= 0) {
      if (pending_unk.id >= 0) {
        add_symbol(pending_unk.id, pending_unk.length);
        pending_unk.id = -1;
      }
      add_symbol(id, length);
      continue;
    }
    if (options_.byte_fallback) {
      const bool all_bytes_known = std::all_of(
          token.begin(), token.end(), [&](char b) { return byte_fallback_ids_[static_cast<unsigned char>(b)] >= 0; });
      if (all_bytes_known) {
        for (char b : token) add_symbol(byte_fallback_ids_[static_cast<unsigned char>(b)], 1);
        continue;
      }
    }
    if (options_.unk_token) {
      if (!unk_id_) return make_error("the unk token '{}' is not in the vocabulary", *options_.unk_token);
      if (pending_unk.id >= 0 && options_.fuse_unk) {
        pending_unk.length += length;
      } else {
        if (pending_unk.id >= 0) add_symbol(pending_unk.id, pending_unk.length);
        pending_unk = {*unk_id_, length};
      }
    }
    // without an unk token an unknown character is dropped, as in HF
  }
  if (pending_unk.id >= 0) add_symbol(pending_unk.id, pending_unk.length);

  // 2. merge the lowest-ranked pair (leftmost on ties) until none is left
  auto& heap = scratch.heap;
  heap.clear();
  auto later = [](const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.position > b.position;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const MergeTable::Merge* m = merges_.find(symbols[i].id, symbols[i + 1].id))
      heap.push_back({m->rank, uint32_t(i), m->new_id});
  }
  std::make_heap(heap.begin(), heap.end(), later);
  auto push = [&](uint32_t position) {
    const BpeScratch::Symbol& left = symbols[position];
    if (const MergeTable::Merge* m = merges_.find(left.id, symbols[size_t(left.next)].id)) {
      heap.push_back({m->rank, position, m->new_id});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const BpeScratch::Candidate top = heap.back();
    heap.pop_back();
    BpeScratch::Symbol& left = symbols[top.position];
    if (left.length == 0 || left.next < 0) continue;
    BpeScratch::Symbol& right = symbols[size_t(left.next)];
    // a stale entry: the pair at this position changed since it was queued. HF compares only the
    // merged id, not the rank; so do we, to produce the same ids in every corner case.
    const MergeTable::Merge* current = merges_.find(left.id, right.id);
    if (current == nullptr || current->new_id != top.new_id) continue;
    left.id = top.new_id;
    left.length += right.length;
    left.next = right.next;
    right.length = 0;
    if (left.next >= 0) symbols[size_t(left.next)].prev = int32_t(top.position);
    if (left.prev >= 0) push(uint32_t(left.prev));
    if (left.next >= 0) push(top.position);
  }
  for (const BpeScratch::Symbol& symbol : symbols)
    if (symbol.length != 0) ids.push_back(symbol.id);
  return ok_status();
}

}  // namespace kiln::tokenization
