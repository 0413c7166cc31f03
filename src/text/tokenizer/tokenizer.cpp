#include "text/tokenizer/tokenizer.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <unordered_set>

#include "core/files.h"
#include "text/tokenizer/added_vocabulary.h"
#include "text/tokenizer/bpe.h"
#include "text/tokenizer/component_json.h"
#include "text/tokenizer/decoders.h"
#include "text/tokenizer/normalizers.h"
#include "text/tokenizer/post_processors.h"
#include "text/tokenizer/pre_tokenizers.h"
#include "text/tokenizer/tokenizer_json.h"
#include "text/tokenizer/unicode.h"

namespace kiln {

namespace tokenization {

// Buffers reused across the pieces of one encode call.
struct EncodeScratch {
  std::vector<TextSplit> raw_splits;
  std::vector<TextSplit> normalized_splits;
  std::string normalized;
  Pieces text_piece;
  Pieces pieces;
  BpeScratch bpe;
};

}  // namespace tokenization

using namespace tokenization;
using json = nlohmann::json;

namespace {

Result<std::unique_ptr<BpeModel>> build_model(const json& spec, TokenizerJson& parsed) {
  if (spec.is_object() && spec.contains("type") && !spec["type"].is_string())
    return make_error("model.type {} is not a string", spec["type"].dump());
  const std::string type = type_of(spec);
  if (type != "BPE" && !(type.empty() && parsed.has_merges))
    return make_error("unsupported model type '{}' (kiln implements BPE)", type.empty() ? "?" : type);
  if (!parsed.has_vocab) return make_error("model has no vocab");
  if (!parsed.has_merges) return make_error("model has no merges");
  if (parsed.vocab.size() == 0) return make_error("model.vocab is empty");
  // ids index a table of max id + 1 entries: a stray huge id must not allocate gigabytes
  if (uint64_t(parsed.vocab.max_id()) >= 4 * uint64_t(parsed.vocab.size()) + 65536)
    return make_error("model.vocab: ids reach {} for {} tokens", parsed.vocab.max_id(), parsed.vocab.size());
  if (spec.contains("dropout") && spec["dropout"].is_number() && spec["dropout"].get<double>() > 0)
    return make_error("BPE dropout is not supported (it randomizes encoding)");
  BpeOptions options;
  if (spec.contains("unk_token") && spec["unk_token"].is_string())
    options.unk_token = spec["unk_token"].get<std::string>();
  options.continuing_subword_prefix = string_field(spec, "continuing_subword_prefix");
  options.end_of_word_suffix = string_field(spec, "end_of_word_suffix");
  options.fuse_unk = bool_field(spec, "fuse_unk", false);
  options.byte_fallback = bool_field(spec, "byte_fallback", false);
  options.ignore_merges = bool_field(spec, "ignore_merges", false);
  return BpeModel::create(std::move(parsed.vocab), parsed.merges, std::move(options));
}

Result<std::vector<AddedToken>> parse_added_tokens(const json& spec) {
  std::vector<AddedToken> tokens;
  if (spec.is_null()) return tokens;
  if (!spec.is_array()) return make_error("added_tokens is not a list");
  for (const json& entry : spec) {
    AddedToken token;
    if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string() || !entry.contains("id") ||
        !entry["id"].is_number_integer())
      return make_error("added token {} has no content or id", entry.dump());
    token.content = entry["content"].get<std::string>();
    const int64_t id = entry["id"].get<int64_t>();
    if (id < 0 || id > INT32_MAX) return make_error("added token '{}' has an invalid id {}", token.content, id);
    token.id = int32_t(id);
    token.special = bool_field(entry, "special", false);
    token.single_word = bool_field(entry, "single_word", false);
    token.lstrip = bool_field(entry, "lstrip", false);
    token.rstrip = bool_field(entry, "rstrip", false);
    // HF's default: special tokens match the raw text, others the normalized text
    token.normalized = bool_field(entry, "normalized", !token.special);
    tokens.push_back(std::move(token));
  }
  return tokens;
}

// tokenizer_config.json writes a token as "text" or as {"content": "text", ...}.
std::optional<std::string> config_token(const json& config, const char* field) {
  auto it = config.find(field);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

Result<std::shared_ptr<const Tokenizer>> Tokenizer::load(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_directory(model_dir, error)) return make_error("model directory {} does not exist", model_dir);
  const fs::path dir(model_dir);
  TokenizerFiles files;
  files.name = (dir / "tokenizer.json").string();
  if (!fs::exists(dir / "tokenizer.json", error)) return make_error("{} has no tokenizer.json", model_dir);
  KILN_TRY(require_regular_file_if_present(files.name));
  KILN_ASSIGN(files.tokenizer_json, tokenization::read_file(files.name));
  for (auto [name, content] : {std::pair{"tokenizer_config.json", &files.tokenizer_config_json},
                               std::pair{"generation_config.json", &files.generation_config_json}}) {
    if (!fs::exists(dir / name, error)) continue;
    KILN_TRY(require_regular_file_if_present((dir / name).string()));
    KILN_ASSIGN(*content, tokenization::read_file((dir / name).string()));
    // (an empty string stands for an absent file below)
    if (content->empty()) return make_error("{} is empty, not a JSON object", (dir / name).string());
  }
  if (files.generation_config_json.empty() && fs::is_regular_file(dir / "config.json", error)) {
    KILN_ASSIGN(files.config_json, tokenization::read_file((dir / "config.json").string()));
  }
  return from_files(files);
}

Result<std::shared_ptr<const Tokenizer>> Tokenizer::from_files(const TokenizerFiles& files) {
  const auto start = std::chrono::steady_clock::now();
  std::shared_ptr<Tokenizer> tokenizer(new Tokenizer());
  auto build = [&]() -> Status {
    KILN_ASSIGN(TokenizerJson parsed, parse_tokenizer_json(files.tokenizer_json));
    const json& document = parsed.document;
    auto section = [&](const char* name) { return document.contains(name) ? document[name] : json(); };
    for (const char* ignored : {"truncation", "padding"})
      if (!section(ignored).is_null())
        spdlog::warn("{}: '{}' is set; kiln never truncates or pads", files.name, ignored);
    KILN_ASSIGN(tokenizer->model_, build_model(section("model"), parsed));
    KILN_ASSIGN(tokenizer->normalizer_, parse_normalizer(section("normalizer")));
    KILN_ASSIGN(tokenizer->pre_tokenizer_, parse_pre_tokenizer(section("pre_tokenizer")));
    KILN_ASSIGN(tokenizer->post_processor_, parse_post_processor(section("post_processor")));
    KILN_ASSIGN(tokenizer->decoder_, parse_decoder(section("decoder")));
    KILN_ASSIGN(auto added_tokens, parse_added_tokens(section("added_tokens")));
    KILN_ASSIGN(auto added, AddedVocabulary::create(std::move(added_tokens), tokenizer->normalizer_.get()));
    tokenizer->added_ = std::make_unique<AddedVocabulary>(std::move(added));
    // HF's get_vocab_size(with_added_tokens=True): added tokens the model does not know count extra
    std::unordered_set<std::string_view> extra;
    for (const AddedToken& token : tokenizer->added_->tokens())
      if (!token.content.empty() && !tokenizer->model_->token_to_id(token.content)) extra.insert(token.content);
    tokenizer->vocab_size_ = int64_t(tokenizer->model_->vocab_size() + extra.size());
    // an unknown character becomes one token of up to 4 bytes
    tokenizer->longest_token_bytes_ = std::max<size_t>(4, tokenizer->model_->longest_token_bytes());
    for (const AddedToken& token : tokenizer->added_->tokens())
      tokenizer->longest_token_bytes_ = std::max(tokenizer->longest_token_bytes_, token.content.size());
    return ok_status();
  };
  Status built = ok_status();
  try {
    built = build();
  } catch (const std::exception& e) {
    built = make_error("malformed: {}", e.what());
  }
  if (!built) return make_error("{}: {}", files.name, one_line(built.error().message));

  // bos/eos from tokenizer_config.json and generation_config.json, both optional
  json config = json::object();
  if (!files.tokenizer_config_json.empty()) {
    KILN_ASSIGN(config, parse_json(files.tokenizer_config_json, "tokenizer_config.json"));
  }
  json generation = json::object();
  const char* eos_source = "generation_config.json";
  if (!files.generation_config_json.empty()) {
    KILN_ASSIGN(generation, parse_json(files.generation_config_json, "generation_config.json"));
  } else if (!files.config_json.empty()) {
    // config.json's ids as GenerationConfig.from_model_config reads them: the top level's, else the
    // text_config's (a wrapper's); a config.json that does not parse is the model loader's to report
    const json model = json::parse(files.config_json, nullptr, false);
    eos_source = "config.json";
    auto id_of = [](const json& j) { return j.is_object() && j.contains("eos_token_id") ? j["eos_token_id"] : json(); };
    if (json top = id_of(model); !top.is_null())
      generation["eos_token_id"] = top;
    else if (model.is_object() && model.contains("text_config"))
      if (json text = id_of(model["text_config"]); !text.is_null()) generation["eos_token_id"] = text;
  }
  auto resolve = [&](const std::optional<std::string>& token, const char* field) -> std::optional<int32_t> {
    if (!token) return std::nullopt;
    auto id = tokenizer->token_to_id(*token);
    if (!id) spdlog::warn("tokenizer_config.json: {} '{}' is not in the vocabulary", field, *token);
    return id;
  };
  tokenizer->bos_id_ = resolve(config_token(config, "bos_token"), "bos_token");
  if (auto eos = resolve(config_token(config, "eos_token"), "eos_token")) tokenizer->eos_ids_.push_back(*eos);
  if (generation.is_object() && generation.contains("eos_token_id")) {
    const json& ids = generation["eos_token_id"];
    for (const json& id : ids.is_array() ? ids : json::array({ids})) {
      // an id the tokenizer lacks is kept: the model's (padded) vocabulary may still produce it
      if (id.is_null()) continue;
      const int64_t raw = id.is_number_integer() ? id.get<int64_t>() : -1;
      if (raw < 0 || raw > INT32_MAX) {
        spdlog::warn("{}: eos_token_id {} is not a token id; it is ignored", eos_source, id.dump());
        continue;
      }
      const auto value = int32_t(raw);
      if (std::find(tokenizer->eos_ids_.begin(), tokenizer->eos_ids_.end(), value) == tokenizer->eos_ids_.end())
        tokenizer->eos_ids_.push_back(value);
    }
  }
  // tokenizer.json's post-processor decides which special tokens encode adds; only without one do
  // tokenizer_config.json's add_bos_token / add_eos_token (the slow tokenizers' flags) apply
  if (!tokenizer->post_processor_ && config.is_object()) {
    std::vector<int32_t> before;
    std::vector<int32_t> after;
    if (bool_field(config, "add_bos_token", false) && tokenizer->bos_id_) before.push_back(*tokenizer->bos_id_);
    if (bool_field(config, "add_eos_token", false) && !tokenizer->eos_ids_.empty())
      after.push_back(tokenizer->eos_ids_.front());
    if (!before.empty() || !after.empty())
      tokenizer->post_processor_ =
          std::make_unique<SurroundProcessor>(std::move(before), std::move(after), "tokenizer_config add_bos/add_eos");
  }

  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("tokenizer: loaded {} in {:.0f} ms: {}", files.name, ms, tokenizer->describe());
  return std::shared_ptr<const Tokenizer>(std::move(tokenizer));
}

std::string Tokenizer::describe() const {
  auto name = [](const auto& component) { return component ? component->describe() : std::string("none"); };
  return fmt::format(
      "BPE ({} tokens, {} merges, {} added tokens{}); normalizer {}; pre-tokenizer {}; decoder {}; "
      "post-processor {}",
      model_->vocab_size(), model_->merge_count(), added_->size(),
      model_->options().byte_fallback ? ", byte fallback" : "", name(normalizer_), name(pre_tokenizer_), name(decoder_),
      name(post_processor_));
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (const size_t bad = find_invalid_utf8(text); bad != kNoPosition)
    return make_error("text is not valid UTF-8 (ill-formed byte 0x{:02X} at offset {})",
                      static_cast<unsigned char>(text[bad]), bad);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  EncodeScratch scratch;
  // 1. added tokens that match the raw text; 2. normalize what lies between them; 3. added tokens
  // that match normalized text; 4. pre-tokenize and run the model on what remains
  added_->split(text, /*normalized=*/false, scratch.raw_splits);
  for (const TextSplit& split : scratch.raw_splits) {
    if (split.token_id >= 0) {
      ids.push_back(split.token_id);
      continue;
    }
    std::string_view segment = text.substr(split.begin, split.end - split.begin);
    if (normalizer_) {
      KILN_TRY(normalizer_->normalize(segment, scratch.normalized));
      segment = scratch.normalized;
    }
    if (!added_->has_normalized_tokens()) {
      KILN_TRY(encode_text(segment, split.begin == 0, ids, scratch));
      continue;
    }
    added_->split(segment, /*normalized=*/true, scratch.normalized_splits);
    for (const TextSplit& inner : scratch.normalized_splits) {
      if (inner.token_id >= 0) {
        ids.push_back(inner.token_id);
        continue;
      }
      KILN_TRY(encode_text(segment.substr(inner.begin, inner.end - inner.begin), split.begin == 0 && inner.begin == 0,
                           ids, scratch));
    }
  }
  if (add_special_tokens && post_processor_) post_processor_->add_special_tokens(ids);
  return ids;
}

Status Tokenizer::encode_text(std::string_view text, bool at_text_start, std::vector<int32_t>& ids,
                              EncodeScratch& scratch) const {
  if (text.empty()) return ok_status();
  if (!pre_tokenizer_) return model_->tokenize(text, ids, scratch.bpe);
  scratch.text_piece.clear();
  scratch.text_piece.add(text);
  scratch.text_piece.first_at_text_start = at_text_start;
  KILN_TRY(pre_tokenizer_->apply(scratch.text_piece, scratch.pieces));
  for (size_t i = 0; i < scratch.pieces.size(); ++i) KILN_TRY(model_->tokenize(scratch.pieces[i], ids, scratch.bpe));
  return ok_status();
}

std::optional<std::string_view> Tokenizer::token_for_decoding(int32_t id, bool skip_special_tokens) const {
  auto token = added_->id_to_token(id);
  if (!token) token = model_->id_to_token(id);
  if (!token || (skip_special_tokens && added_->is_special_token(*token))) return std::nullopt;
  return token;
}

Result<std::string> Tokenizer::decode_tokens(std::vector<std::string> tokens) const {
  std::string text;
  if (!decoder_) {
    // HF joins with spaces when there is no decoder
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) text += ' ';
      text += tokens[i];
    }
    return text;
  }
  KILN_TRY(decoder_->decode_chain(tokens));
  for (const std::string& piece : tokens) text += piece;
  return text;
}

Result<bool> Tokenizer::tokens_are_final(const std::vector<std::string>& tokens) const {
  if (!decoder_) return true;
  return decoder_->is_final(tokens);
}

Result<std::string> Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids)
    if (auto token = token_for_decoding(id, skip_special_tokens)) tokens.emplace_back(*token);
  return decode_tokens(std::move(tokens));
}

int64_t Tokenizer::vocab_size() const {
  return vocab_size_;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = added_->token_to_id(token)) return id;
  return model_->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  auto token = token_for_decoding(id, false);
  if (!token) return std::nullopt;
  return std::string(*token);
}

std::optional<int32_t> Tokenizer::bos_id() const {
  return bos_id_;
}

std::vector<int32_t> Tokenizer::eos_ids() const {
  return eos_ids_;
}

bool Tokenizer::is_special(int32_t id) const {
  return added_->is_special_id(id);
}

}  // namespace kiln
