// kiln's tokenizer: reads a Hugging Face tokenizer.json (plus tokenizer_config.json and
// generation_config.json for bos/eos) and encodes and decodes exactly as HF tokenizers does.
//
// The pipeline is HF's, built from the components the file names:
//   added tokens -> normalizer -> pre-tokenizer -> BPE model -> post-processor   (encode)
//   ids -> token strings -> decoder                                              (decode)
// Components kiln does not implement (WordPiece, Unigram, BertNormalizer, ...) make load() fail
// with a one-line error naming the type. Offsets, truncation, padding and pairs are out of scope.
//
// A Tokenizer is immutable after load and safe to use from several threads (its word cache is
// internally locked).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kiln {

namespace tokenization {
class AddedVocabulary;
class BpeModel;
class Decoder;
class Normalizer;
class PostProcessor;
class PreTokenizer;
struct EncodeScratch;
}  // namespace tokenization

// The text of a model directory's tokenizer files.
struct TokenizerFiles {
  std::string tokenizer_json;
  std::string tokenizer_config_json;    // empty when the file is absent
  std::string generation_config_json;   // empty when the file is absent
  // config.json, read for its eos_token_id when generation_config.json is absent (empty: absent)
  std::string config_json;
  std::string name = "tokenizer.json";  // how error messages call tokenizer.json (its path)
};

class Tokenizer {
 public:
  // Reads MODEL_DIR/tokenizer.json and, when present, tokenizer_config.json and generation_config.json.
  static Result<std::shared_ptr<const Tokenizer>> load(const std::string& model_dir);
  static Result<std::shared_ptr<const Tokenizer>> from_files(const TokenizerFiles& files);
  ~Tokenizer();

  // Fails on text that is not valid UTF-8. With add_special_tokens the post-processor's tokens
  // (Gemma's <bos>) are added; special-token text inside `text` is always matched as the token.
  Result<std::vector<int32_t>> encode(std::string_view text, bool add_special_tokens = false) const;
  // Ids that are not in the vocabulary are skipped (as HF does); bytes that do not form UTF-8
  // decode to U+FFFD.
  Result<std::string> decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // Distinct tokens, added tokens included (HF's get_vocab_size(with_added_tokens=True)).
  int64_t vocab_size() const;
  // The longest token's text in bytes, at least 4. A text of n bytes encodes to at least
  // n / (4 * longest_token_bytes()) tokens (4: the most a normalizer such as NFKC narrows text),
  // so a prompt far over a context can be refused before it is encoded.
  size_t longest_token_bytes() const { return longest_token_bytes_; }
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  // tokenizer_config.json's bos_token (none for Qwen).
  std::optional<int32_t> bos_id() const;
  // tokenizer_config.json's eos_token, then generation_config.json's eos_token_id(s), without repeats.
  // Without generation_config.json, config.json's eos_token_id stands in for it as transformers'
  // GenerationConfig.from_model_config takes it: a wrapper's top-level id, else its text_config's.
  std::vector<int32_t> eos_ids() const;
  // Added tokens marked special (skipped by decode with skip_special_tokens).
  bool is_special(int32_t id) const;

  // One line naming the components in use, for logs.
  std::string describe() const;

 private:
  friend class IncrementalDecoder;
  Tokenizer();

  Status encode_text(std::string_view text, bool at_text_start, std::vector<int32_t>& ids,
                     tokenization::EncodeScratch& scratch) const;
  // The string decode works on for an id; none for unknown ids and (when asked) special ones.
  std::optional<std::string_view> token_for_decoding(int32_t id, bool skip_special_tokens) const;
  Result<std::string> decode_tokens(std::vector<std::string> tokens) const;
  Result<bool> tokens_are_final(const std::vector<std::string>& tokens) const;

  std::unique_ptr<tokenization::AddedVocabulary> added_;
  std::unique_ptr<tokenization::Normalizer> normalizer_;
  std::unique_ptr<tokenization::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<tokenization::BpeModel> model_;
  std::unique_ptr<tokenization::PostProcessor> post_processor_;
  std::unique_ptr<tokenization::Decoder> decoder_;
  int64_t vocab_size_ = 0;
  size_t longest_token_bytes_ = 4;
  std::optional<int32_t> bos_id_;
  std::vector<int32_t> eos_ids_;
};

// Streaming detokenization: push ids as they are generated and get the text that became final.
// Pieces are always valid UTF-8; bytes of an incomplete character (or a <0xNN> byte run that may
// still grow) are held back until they can no longer change. The concatenation of all pieces and
// flush() equals tokenizer.decode(all ids, skip_special_tokens).
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens = false);

  // The text that became final with this id (often empty).
  std::string push(int32_t id);
  // Ends the stream: returns the text still held back and starts a new, empty stream.
  std::string flush();

 private:
  std::string decode_window(bool final_only);

  std::shared_ptr<const Tokenizer> tokenizer_;
  bool skip_special_tokens_;
  // Token strings not yet emitted, and the last emitted token before them: decoding them after it
  // reproduces how they decode in the whole stream (the first token of a stream decodes apart).
  std::optional<std::string> context_;
  std::vector<std::string> window_;
  // Every id of the stream and the bytes emitted, for decoders where that context is not enough.
  std::vector<int32_t> all_ids_;
  size_t emitted_bytes_ = 0;
  bool use_whole_stream_ = false;
};

}  // namespace kiln
