#include "text/tokenizer/token_table.h"

#include <algorithm>
#include <bit>

namespace kiln::tokenization {

void TokenTable::reserve(size_t count) {
  const size_t capacity = std::bit_ceil(std::max<size_t>(16, count * 2));
  if (capacity > slots_.size()) rehash(capacity);
}

void TokenTable::rehash(size_t capacity) {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  for (const Slot& slot : old) {
    if (slot.id < 0) continue;
    size_t i = size_t(hash_of(token_at(slot))) & mask_;
    while (slots_[i].id >= 0) i = (i + 1) & mask_;
    slots_[i] = slot;
  }
}

void TokenTable::insert_or_assign(std::string_view token, int32_t id) {
  if ((size_ + 1) * 2 > slots_.size()) rehash(std::max<size_t>(16, slots_.size() * 2));
  const uint64_t hash = hash_of(token);
  const auto tag = uint32_t(hash >> 32);
  size_t i = size_t(hash) & mask_;
  for (;; i = (i + 1) & mask_) {
    Slot& slot = slots_[i];
    if (slot.id < 0) break;
    if (slot.tag == tag && slot.length == token.size() && token_at(slot) == token) {
      slot.id = id;
      max_id_ = std::max(max_id_, id);
      return;
    }
  }
  slots_[i] = Slot{tag, uint32_t(bytes_.size()), uint32_t(token.size()), id};
  bytes_.append(token);
  ++size_;
  max_id_ = std::max(max_id_, id);
}

}  // namespace kiln::tokenization
