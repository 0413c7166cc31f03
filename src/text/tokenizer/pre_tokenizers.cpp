#include "text/tokenizer/pre_tokenizers.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "text/tokenizer/component_json.h"
#include "text/tokenizer/regex.h"
#include "text/tokenizer/unicode.h"

namespace kiln::tokenization {

namespace {

enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

// A stretch of a piece: a match of the split pattern, or the text between matches.
struct Span {
  size_t begin;
  size_t end;
  bool is_match;
};

Result<SplitBehavior> parse_behavior(const std::string& name) {
  if (name == "Removed") return SplitBehavior::removed;
  if (name == "Isolated") return SplitBehavior::isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (name == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (name == "Contiguous") return SplitBehavior::contiguous;
  return make_error("unsupported split behavior '{}'", name);
}

// Spans covering all of `piece`, from the matches of a pattern (HF's Pattern::find_matches).
Status find_spans(const Pattern& pattern, std::string_view piece, bool invert, std::vector<Span>& spans) {
  spans.clear();
  size_t previous = 0;
  KILN_TRY(pattern.for_each_match(piece, [&](size_t begin, size_t end) {
    if (previous != begin) spans.push_back({previous, begin, invert});
    spans.push_back({begin, end, !invert});
    previous = end;
  }));
  if (previous != piece.size()) spans.push_back({previous, piece.size(), invert});
  return ok_status();
}

// Spans from a character predicate: each matching character is a match of its own.
template <typename Predicate>
void find_char_spans(std::string_view piece, Predicate matches, std::vector<Span>& spans) {
  spans.clear();
  size_t last = 0;
  size_t offset = 0;
  while (offset < piece.size()) {
    const size_t start = offset;
    const char32_t c = next_code_point(piece, offset);
    if (!matches(c)) continue;
    if (last < start) spans.push_back({last, start, false});
    spans.push_back({start, offset, true});
    last = offset;
  }
  if (last < piece.size()) spans.push_back({last, piece.size(), false});
}

// Turns spans into pieces according to the behavior (HF's NormalizedString::split). Returns
// whether the first piece added starts at offset 0 of `piece`.
bool add_splits(std::string_view piece, const std::vector<Span>& spans, SplitBehavior behavior, Pieces& out) {
  struct Split {
    size_t begin;
    size_t end;
    bool remove;
  };
  std::vector<Split> splits;
  splits.reserve(spans.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::isolated:
      for (const Span& s : spans) splits.push_back({s.begin, s.end, false});
      break;
    case SplitBehavior::removed:
      for (const Span& s : spans) splits.push_back({s.begin, s.end, s.is_match});
      break;
    case SplitBehavior::contiguous:
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !splits.empty())
          splits.back().end = s.end;
        else
          splits.push_back({s.begin, s.end, false});
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::merged_with_previous:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !splits.empty())
          splits.back().end = s.end;
        else
          splits.push_back({s.begin, s.end, false});
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::merged_with_next:
      // the mirror image: walk backwards, merging a match into the split after it
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !splits.empty())
          splits.back().begin = it->begin;
        else
          splits.push_back({it->begin, it->end, false});
        previous_match = it->is_match;
      }
      std::reverse(splits.begin(), splits.end());
      break;
  }
  bool first = true;
  bool first_at_start = false;
  for (const Split& s : splits) {
    if (s.remove || s.begin == s.end) continue;
    if (first) first_at_start = s.begin == 0;
    first = false;
    out.add(piece.substr(s.begin, s.end - s.begin));
  }
  return first_at_start;
}

// Applies a per-piece split function and keeps track of where the first piece starts.
template <typename SplitPiece>
Status split_each(const Pieces& in, Pieces& out, SplitPiece split_piece) {
  out.clear();
  out.first_at_text_start = false;
  for (size_t i = 0; i < in.size(); ++i) {
    const size_t before = out.size();
    KILN_ASSIGN(bool starts_at_zero, split_piece(in[i]));
    if (i == 0 && before == 0 && out.size() > 0) out.first_at_text_start = in.first_at_text_start && starts_at_zero;
  }
  return ok_status();
}

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  Status apply(const Pieces& in, Pieces& out) const override {
    if (steps_.empty()) {
      out = in;
      return ok_status();
    }
    Pieces buffer;
    // alternate between two buffers so that the last step writes to `out`
    const Pieces* source = &in;
    for (size_t i = 0; i < steps_.size(); ++i) {
      Pieces* target = (steps_.size() - 1 - i) % 2 == 0 ? &out : &buffer;
      KILN_TRY(steps_[i]->apply(*source, *target));
      source = target;
    }
    return ok_status();
  }
  std::string describe() const override {
    std::vector<std::string> names;
    for (const auto& step : steps_) names.push_back(step->describe());
    return fmt::format("Sequence[{}]", fmt::join(names, ", "));
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  Status apply(const Pieces& in, Pieces& out) const override {
    std::vector<Span> spans;
    return split_each(in, out, [&](std::string_view piece) -> Result<bool> {
      KILN_TRY(find_spans(pattern_, piece, invert_, spans));
      return add_splits(piece, spans, behavior_, out);
    });
  }
  std::string describe() const override { return pattern_.is_literal() ? "Split(string)" : "Split(regex)"; }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// GPT-2's byte-level pre-tokenizer: optionally a space in front and GPT-2's own regex split, then
// every byte becomes a printable character of the byte-level alphabet.
class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::optional<Pattern> gpt2_split)
      : add_prefix_space_(add_prefix_space), gpt2_split_(std::move(gpt2_split)) {}
  Status apply(const Pieces& in, Pieces& out) const override {
    Pieces split;
    const Pieces* source = &in;
    if (add_prefix_space_ || gpt2_split_) {
      std::vector<Span> spans;
      std::string prefixed;
      KILN_TRY(split_each(in, split, [&](std::string_view piece) -> Result<bool> {
        if (add_prefix_space_ && piece.front() != ' ') {
          prefixed.assign(" ");
          prefixed.append(piece);
          piece = prefixed;
        }
        if (!gpt2_split_) {
          split.add(piece);
          return true;
        }
        KILN_TRY(find_spans(*gpt2_split_, piece, false, spans));
        return add_splits(piece, spans, SplitBehavior::isolated, split);
      }));
      source = &split;
    }
    const ByteLevelAlphabet& alphabet = byte_level_alphabet();
    out.clear();
    out.first_at_text_start = source->first_at_text_start;
    for (size_t i = 0; i < source->size(); ++i) {
      std::string& bytes = out.open_piece();
      for (char b : (*source)[i]) bytes += alphabet.utf8_of_byte[static_cast<unsigned char>(b)];
      out.close_piece();
    }
    return ok_status();
  }
  std::string describe() const override { return gpt2_split_ ? "ByteLevel(regex)" : "ByteLevel"; }

 private:
  bool add_prefix_space_;
  std::optional<Pattern> gpt2_split_;
};

enum class PrependScheme { always, first, never };

// SentencePiece's whitespace handling: spaces become the replacement character (usually U+2581),
// which is prepended to the text and starts each word.
class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  Status apply(const Pieces& in, Pieces& out) const override {
    std::string replaced;
    std::vector<Span> spans;
    size_t piece_index = 0;
    return split_each(in, out, [&](std::string_view piece) -> Result<bool> {
      const bool at_text_start = piece_index++ == 0 && in.first_at_text_start;
      replaced.clear();
      for (char c : piece) {
        if (c == ' ')
          replaced += replacement_;
        else
          replaced += c;
      }
      const bool prepend = scheme_ == PrependScheme::always || (scheme_ == PrependScheme::first && at_text_start);
      if (prepend && !replaced.starts_with(replacement_)) replaced.insert(0, replacement_);
      if (!split_) {
        out.add(replaced);
        return true;
      }
      KILN_TRY(find_spans(Pattern::literal(replacement_), replaced, false, spans));
      return add_splits(replaced, spans, SplitBehavior::merged_with_next, out);
    });
  }
  std::string describe() const override { return "Metaspace"; }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class DigitsPreTokenizer final : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual_digits) : individual_digits_(individual_digits) {}
  Status apply(const Pieces& in, Pieces& out) const override {
    std::vector<Span> spans;
    return split_each(in, out, [&](std::string_view piece) -> Result<bool> {
      find_char_spans(piece, is_numeric, spans);
      return add_splits(piece, spans, individual_digits_ ? SplitBehavior::isolated : SplitBehavior::contiguous, out);
    });
  }
  std::string describe() const override { return "Digits"; }

 private:
  bool individual_digits_;
};

// Whitespace: runs of word characters and runs of other non-space characters (regex crate \w).
class WhitespacePreTokenizer final : public PreTokenizer {
 public:
  explicit WhitespacePreTokenizer(Pattern words) : words_(std::move(words)) {}
  Status apply(const Pieces& in, Pieces& out) const override {
    std::vector<Span> spans;
    return split_each(in, out, [&](std::string_view piece) -> Result<bool> {
      KILN_TRY(find_spans(words_, piece, /*invert=*/true, spans));
      return add_splits(piece, spans, SplitBehavior::removed, out);
    });
  }
  std::string describe() const override { return "Whitespace"; }

 private:
  Pattern words_;
};

class WhitespaceSplitPreTokenizer final : public PreTokenizer {
 public:
  Status apply(const Pieces& in, Pieces& out) const override {
    std::vector<Span> spans;
    return split_each(in, out, [&](std::string_view piece) -> Result<bool> {
      find_char_spans(piece, is_white_space, spans);
      return add_splits(piece, spans, SplitBehavior::removed, out);
    });
  }
  std::string describe() const override { return "WhitespaceSplit"; }
};

}  // namespace

Result<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const nlohmann::json& spec, int depth) {
  if (spec.is_null()) return std::unique_ptr<PreTokenizer>();
  const std::string type = type_of(spec);
  if (type == "Sequence") {
    if (depth >= kMaxComponentNesting)
      return make_error("pre_tokenizer Sequences nested deeper than {}", kMaxComponentNesting);
    auto it = spec.find("pretokenizers");
    if (it == spec.end() || !it->is_array()) return make_error("pre_tokenizer Sequence has no 'pretokenizers' list");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const auto& step_spec : *it) {
      KILN_ASSIGN(auto step, parse_pre_tokenizer(step_spec, depth + 1));
      if (step) steps.push_back(std::move(step));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(steps)));
  }
  if (type == "Split") {
    KILN_ASSIGN(Pattern pattern, parse_pattern(spec.value("pattern", nlohmann::json()), "pre_tokenizer Split"));
    KILN_ASSIGN(SplitBehavior behavior, parse_behavior(string_field(spec, "behavior", "Isolated")));
    return std::unique_ptr<PreTokenizer>(
        new SplitPreTokenizer(std::move(pattern), behavior, bool_field(spec, "invert", false)));
  }
  if (type == "ByteLevel") {
    std::optional<Pattern> gpt2_split;
    if (bool_field(spec, "use_regex", true)) {
      KILN_ASSIGN(gpt2_split,
                  Pattern::regex(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"));
    }
    return std::unique_ptr<PreTokenizer>(
        new ByteLevelPreTokenizer(bool_field(spec, "add_prefix_space", true), std::move(gpt2_split)));
  }
  if (type == "Metaspace") {
    std::string replacement = string_field(spec, "replacement", "\u2581");
    PrependScheme scheme = bool_field(spec, "add_prefix_space", true) ? PrependScheme::always : PrependScheme::never;
    if (spec.contains("prepend_scheme")) {
      const std::string name = string_field(spec, "prepend_scheme");
      if (name == "always") {
        scheme = PrependScheme::always;
      } else if (name == "first") {
        scheme = PrependScheme::first;
      } else if (name == "never") {
        scheme = PrependScheme::never;
      } else {
        return make_error("unsupported Metaspace prepend_scheme '{}'", name);
      }
    }
    return std::unique_ptr<PreTokenizer>(
        new MetaspacePreTokenizer(std::move(replacement), scheme, bool_field(spec, "split", true)));
  }
  if (type == "Digits")
    return std::unique_ptr<PreTokenizer>(new DigitsPreTokenizer(bool_field(spec, "individual_digits", false)));
  if (type == "Whitespace") {
    KILN_ASSIGN(Pattern words, Pattern::regex(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]+|)"
                                              R"([^\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}\p{White_Space}]+)"));
    return std::unique_ptr<PreTokenizer>(new WhitespacePreTokenizer(std::move(words)));
  }
  if (type == "WhitespaceSplit") return std::unique_ptr<PreTokenizer>(new WhitespaceSplitPreTokenizer());
  return make_error("unsupported pre_tokenizer type '{}'", type.empty() ? spec.dump() : type);
}

}  // namespace kiln::tokenization
