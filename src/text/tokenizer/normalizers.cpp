#include "text/tokenizer/normalizers.h"

#include <fmt/format.h>

#include <vector>

#include "text/tokenizer/component_json.h"
#include "text/tokenizer/unicode.h"

namespace kiln::tokenization {

namespace {

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  Status normalize(std::string_view text, std::string& out) const override {
    out.assign(text);
    std::string next;
    for (const auto& step : steps_) {
      KILN_TRY(step->normalize(out, next));
      out.swap(next);
    }
    return ok_status();
  }
  std::string describe() const override {
    std::vector<std::string> names;
    for (const auto& step : steps_) names.push_back(step->describe());
    return fmt::format("Sequence[{}]", fmt::join(names, ", "));
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  UnicodeNormalizer(NormalizationForm form, std::string name) : form_(form), name_(std::move(name)) {}
  Status normalize(std::string_view text, std::string& out) const override {
    return normalize_unicode(text, form_, out);
  }
  std::string describe() const override { return name_; }

 private:
  NormalizationForm form_;
  std::string name_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  Status normalize(std::string_view text, std::string& out) const override { return lowercase(text, out); }
  std::string describe() const override { return "Lowercase"; }
};

// Replaces every match of a pattern with a literal.
class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  Status normalize(std::string_view text, std::string& out) const override {
    out.clear();
    size_t copied = 0;
    KILN_TRY(pattern_.for_each_match(text, [&](size_t begin, size_t end) {
      out.append(text.substr(copied, begin - copied));
      out.append(content_);
      copied = end;
    }));
    out.append(text.substr(copied));
    return ok_status();
  }
  std::string describe() const override { return "Replace"; }

 private:
  Pattern pattern_;
  std::string content_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  Status normalize(std::string_view text, std::string& out) const override {
    out.clear();
    if (!text.empty()) out = prefix_;  // HF prepends to non-empty text only
    out.append(text);
    return ok_status();
  }
  std::string describe() const override { return "Prepend"; }

 private:
  std::string prefix_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  Status normalize(std::string_view text, std::string& out) const override {
    size_t begin = 0;
    size_t end = text.size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!is_white_space(next_code_point(text, next))) break;
        begin = next;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t previous = end;
        if (!is_white_space(previous_code_point(text, previous))) break;
        end = previous;
      }
    }
    out.assign(text.substr(begin, end - begin));
    return ok_status();
  }
  std::string describe() const override { return "Strip"; }

 private:
  bool left_;
  bool right_;
};

}  // namespace

Result<std::unique_ptr<Normalizer>> parse_normalizer(const nlohmann::json& spec, int depth) {
  if (spec.is_null()) return std::unique_ptr<Normalizer>();
  const std::string type = type_of(spec);
  if (type == "Sequence") {
    if (depth >= kMaxComponentNesting)
      return make_error("normalizer Sequences nested deeper than {}", kMaxComponentNesting);
    auto it = spec.find("normalizers");
    if (it == spec.end() || !it->is_array()) return make_error("normalizer Sequence has no 'normalizers' list");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& step_spec : *it) {
      KILN_ASSIGN(auto step, parse_normalizer(step_spec, depth + 1));
      if (step) steps.push_back(std::move(step));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
  }
  if (type == "NFC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalizationForm::nfc, type));
  if (type == "NFD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalizationForm::nfd, type));
  if (type == "NFKC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalizationForm::nfkc, type));
  if (type == "NFKD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalizationForm::nfkd, type));
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
  if (type == "Replace") {
    KILN_ASSIGN(Pattern pattern, parse_pattern(spec.value("pattern", nlohmann::json()), "normalizer Replace"));
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(pattern), string_field(spec, "content")));
  }
  if (type == "Prepend") return std::unique_ptr<Normalizer>(new PrependNormalizer(string_field(spec, "prepend")));
  if (type == "Strip")
    return std::unique_ptr<Normalizer>(
        new StripNormalizer(bool_field(spec, "strip_left", true), bool_field(spec, "strip_right", true)));
  return make_error("unsupported normalizer type '{}'", type.empty() ? spec.dump() : type);
}

}  // namespace kiln::tokenization
