// Streaming detokenization. Pending tokens form a window that is emitted as a whole once the
// decoder says its text is final (see Decoder::is_final): until then a ByteLevel window ends
// inside a UTF-8 character, or a ByteFallback window ends in a byte run. The window is decoded
// after the last emitted token, and that token's own text is cut off again, so that first-token
// rules (Metaspace, Strip) apply only where they apply in the whole stream. Should a decoder ever
// make that cut disagree with its output, the decoder falls back to decoding the whole stream.
#include "text/tokenizer/tokenizer.h"

namespace kiln {

IncrementalDecoder::IncrementalDecoder(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens)
    : tokenizer_(std::move(tokenizer)), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDecoder::push(int32_t id) {
  all_ids_.push_back(id);
  auto token = tokenizer_->token_for_decoding(id, skip_special_tokens_);
  if (!token) return {};  // unknown or skipped: decode leaves it out too
  window_.emplace_back(*token);
  return decode_window(/*final_only=*/true);
}

std::string IncrementalDecoder::flush() {
  std::string rest = decode_window(/*final_only=*/false);
  context_.reset();
  window_.clear();
  all_ids_.clear();
  emitted_bytes_ = 0;
  use_whole_stream_ = false;
  return rest;
}

std::string IncrementalDecoder::decode_window(bool final_only) {
  if (window_.empty()) return {};
  if (!use_whole_stream_) {
    std::vector<std::string> tokens;
    tokens.reserve(window_.size() + 1);
    if (context_) tokens.push_back(*context_);
    tokens.insert(tokens.end(), window_.begin(), window_.end());
    if (final_only) {
      auto final = tokenizer_->tokens_are_final(tokens);
      if (!final.ok() || !*final) return {};
    }
    auto text = tokenizer_->decode_tokens(std::move(tokens));
    auto context_text = context_ ? tokenizer_->decode_tokens({*context_}) : Result<std::string>(std::string());
    if (text.ok() && context_text.ok() && text->starts_with(*context_text)) {
      std::string piece = text->substr(context_text->size());
      context_ = window_.back();
      window_.clear();
      emitted_bytes_ += piece.size();
      return piece;
    }
    use_whole_stream_ = true;
  }
  std::vector<std::string> tokens;
  for (int32_t id : all_ids_)
    if (auto token = tokenizer_->token_for_decoding(id, skip_special_tokens_)) tokens.emplace_back(*token);
  if (final_only) {
    auto final = tokenizer_->tokens_are_final(tokens);
    if (!final.ok() || !*final) return {};
  }
  auto text = tokenizer_->decode_tokens(std::move(tokens));
  // hold on rather than emit text that would contradict (or split a character of) what was emitted
  if (!text.ok() || text->size() < emitted_bytes_) return {};
  if (emitted_bytes_ < text->size() && (static_cast<unsigned char>((*text)[emitted_bytes_]) & 0xC0) == 0x80) return {};
  std::string piece = text->substr(emitted_bytes_);
  emitted_bytes_ = text->size();
  window_.clear();
  return piece;
}

}  // namespace kiln
