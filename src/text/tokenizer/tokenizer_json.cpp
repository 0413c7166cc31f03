#include "text/tokenizer/tokenizer_json.h"

#include <cstdio>
#include <filesystem>
#include <memory>

namespace kiln::tokenization {

namespace {

using json = nlohmann::json;

// Builds a DOM for everything except model.vocab and model.merges, which go straight into
// TokenizerJson's vectors.
class TokenizerJsonReader final : public nlohmann::json_sax<json> {
 public:
  explicit TokenizerJsonReader(TokenizerJson& out) : out_(out) {}

  const std::string& error() const { return error_; }

  bool null() override { return value(json(nullptr)); }
  bool boolean(bool v) override { return value(json(v)); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::vocab) return vocab_id(v);
    return value(json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::vocab) return vocab_id(v <= uint64_t(INT64_MAX) ? int64_t(v) : -1);
    return value(json(v));
  }
  bool number_float(number_float_t v, const string_t&) override { return value(json(v)); }
  bool binary(binary_t&) override { return fail("unexpected binary value"); }

  bool string(string_t& v) override {
    if (mode_ == Mode::merges) return legacy_merge(v);
    if (mode_ == Mode::merge_pair) {
      if (pair_parts_.size() >= 2) return fail("a merge pair has more than two parts");
      pair_parts_.push_back(std::move(v));
      return true;
    }
    return value(json(std::move(v)));
  }

  bool key(string_t& k) override {
    if (mode_ == Mode::vocab) {
      vocab_token_ = std::move(k);
      return true;
    }
    key_ = std::move(k);
    return true;
  }

  bool start_object(std::size_t) override {
    ++depth_;
    if (mode_ != Mode::dom) return fail("unexpected object inside model.vocab or model.merges");
    if (depth_ == 3 && model_depth_ == 2 && key_ == "vocab") {
      mode_ = Mode::vocab;
      out_.has_vocab = true;
      return true;
    }
    json* object = open(json::object());
    if (depth_ == 2 && stack_.size() == 2 && key_ == "model") model_depth_ = 2;
    return object != nullptr;
  }

  bool end_object() override {
    --depth_;
    if (mode_ == Mode::vocab) {
      mode_ = Mode::dom;
      vocab_done_ = true;
      return true;
    }
    if (model_depth_ == 2 && depth_ == 1) model_depth_ = 0;
    stack_.pop_back();
    return true;
  }

  bool start_array(std::size_t) override {
    ++depth_;
    if (mode_ == Mode::merges) {
      mode_ = Mode::merge_pair;
      pair_parts_.clear();
      return true;
    }
    if (mode_ != Mode::dom) return fail("unexpected nested array inside model.vocab or model.merges");
    if (depth_ == 3 && model_depth_ == 2 && key_ == "merges") {
      mode_ = Mode::merges;
      out_.has_merges = true;
      return true;
    }
    return open(json::array()) != nullptr;
  }

  bool end_array() override {
    --depth_;
    if (mode_ == Mode::merge_pair) {
      if (pair_parts_.size() != 2) return fail("a merge pair does not have two parts");
      mode_ = Mode::merges;
      return merge(pair_parts_[0], pair_parts_[1]);
    }
    if (mode_ == Mode::merges) {
      mode_ = Mode::dom;
      return true;
    }
    stack_.pop_back();
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    error_ = fmt::format("invalid JSON at byte {}: {}", position, e.what());
    return false;
  }

 private:
  enum class Mode { dom, vocab, merges, merge_pair };

  bool fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }

  // Inserts a value into the current container (or makes it the root); returns where it went.
  json* insert(json&& v) {
    if (stack_.empty()) {
      out_.document = std::move(v);
      return &out_.document;
    }
    json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    json& slot = parent[key_];
    slot = std::move(v);
    return &slot;
  }

  bool value(json&& v) {
    if (mode_ != Mode::dom) return fail("unexpected value inside model.vocab or model.merges");
    insert(std::move(v));
    return true;
  }

  json* open(json&& container) {
    json* where = insert(std::move(container));
    stack_.push_back(where);
    return where;
  }

  bool vocab_id(int64_t id) {
    if (id < 0 || id > INT32_MAX) return fail(fmt::format("model.vocab: token '{}' has an invalid id", vocab_token_));
    out_.vocab.insert_or_assign(vocab_token_, int32_t(id));
    return true;
  }

  bool legacy_merge(const std::string& line) {
    if (line.starts_with("#version")) return true;  // merges.txt headers survive in some files
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
      return fail(fmt::format("model.merges: '{}' is not two tokens separated by one space", line));
    return merge(std::string_view(line).substr(0, space), std::string_view(line).substr(space + 1));
  }

  // The vocabulary comes first in the files HF writes: resolve merges to ids right away, and keep
  // their text only in the unusual opposite order.
  bool merge(std::string_view left, std::string_view right) {
    if (!vocab_done_) {
      unresolved_merges_.emplace_back(left, right);
      return true;
    }
    auto left_id = out_.vocab.find(left);
    auto right_id = out_.vocab.find(right);
    if (!left_id || !right_id)
      return fail(fmt::format("merge {} ('{} {}') uses a token that is not in the vocabulary", out_.merges.size(), left,
                              right));
    out_.merges.emplace_back(*left_id, *right_id);
    return true;
  }

 public:
  bool resolve_pending_merges() {
    vocab_done_ = true;
    for (const auto& [left, right] : unresolved_merges_)
      if (!merge(left, right)) return false;
    unresolved_merges_.clear();
    return true;
  }

 private:
  TokenizerJson& out_;
  std::vector<json*> stack_;  // open containers, innermost last
  std::string key_;           // the key of the next value in the current object
  std::string vocab_token_;
  std::vector<std::string> pair_parts_;
  std::vector<std::pair<std::string, std::string>> unresolved_merges_;  // merges read before the vocabulary
  bool vocab_done_ = false;
  std::string error_;
  Mode mode_ = Mode::dom;
  int depth_ = 0;
  int model_depth_ = 0;  // 2 while inside the top-level "model" object
};

}  // namespace

Result<TokenizerJson> parse_tokenizer_json(std::string_view text) {
  TokenizerJson out;
  TokenizerJsonReader reader(out);
  bool ok = false;
  try {
    ok = json::sax_parse(text, &reader);
  } catch (const std::exception& e) {
    return make_error("{}", e.what());
  }
  if (ok) ok = reader.resolve_pending_merges();
  if (!ok) return make_error("{}", reader.error().empty() ? "invalid JSON" : reader.error());
  if (!out.document.is_object()) return make_error("not a JSON object");
  return out;
}

Result<nlohmann::json> parse_json(std::string_view text, const std::string& name) {
  nlohmann::json document = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded()) return make_error("{}: invalid JSON", name);
  if (!document.is_object()) return make_error("{}: not a JSON object", name);
  return document;
}

Result<std::string> read_file(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) return make_error("{} is a directory, not a file", path);
  std::unique_ptr<FILE, decltype(&std::fclose)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) return make_error("cannot open {}", path);
  // one allocation of the file's size, then chunks for whatever may follow (a growing file)
  std::string content;
  if (std::fseek(file.get(), 0, SEEK_END) == 0) {
    const long size = std::ftell(file.get());
    if (size > 0) content.resize(size_t(size));
    std::rewind(file.get());
  }
  size_t length = std::fread(content.data(), 1, content.size(), file.get());
  content.resize(length);
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file.get())) > 0) content.append(buffer, n);
  if (std::ferror(file.get())) return make_error("cannot read {} (is it a directory?)", path);
  return content;
}

}  // namespace kiln::tokenization
