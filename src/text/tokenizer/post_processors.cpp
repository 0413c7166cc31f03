#include "text/tokenizer/post_processors.h"

#include <fmt/format.h>

#include "text/tokenizer/component_json.h"

namespace kiln::tokenization {

namespace {

class NoSpecialTokensProcessor final : public PostProcessor {
 public:
  void add_special_tokens(std::vector<int32_t>&) const override {}
  std::string describe() const override { return "ByteLevel"; }
};

class SequenceProcessor final : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> steps) : steps_(std::move(steps)) {}
  void add_special_tokens(std::vector<int32_t>& ids) const override {
    for (const auto& step : steps_) step->add_special_tokens(ids);
  }
  std::string describe() const override {
    std::vector<std::string> names;
    for (const auto& step : steps_) names.push_back(step->describe());
    return fmt::format("Sequence[{}]", fmt::join(names, ", "));
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

// TemplateProcessing's "single" template: a list of {"SpecialToken": {"id": NAME}} and
// {"Sequence": {"id": "A"}} pieces; NAME resolves through "special_tokens" to a list of ids.
Result<std::unique_ptr<PostProcessor>> parse_template(const nlohmann::json& spec) {
  auto single = spec.find("single");
  if (single == spec.end() || !single->is_array()) return make_error("TemplateProcessing has no 'single' template");
  const nlohmann::json special_tokens = spec.value("special_tokens", nlohmann::json::object());
  std::vector<int32_t> before;
  std::vector<int32_t> after;
  bool sequence_seen = false;
  for (const auto& piece : *single) {
    if (piece.contains("Sequence")) {
      const std::string id = string_field(piece["Sequence"], "id");
      if (id != "A") return make_error("TemplateProcessing: the single template uses sequence '{}'", id);
      if (sequence_seen) return make_error("TemplateProcessing: the single template repeats the sequence");
      sequence_seen = true;
      continue;
    }
    if (!piece.contains("SpecialToken"))
      return make_error("TemplateProcessing: unknown template piece {}", piece.dump());
    const std::string name = string_field(piece["SpecialToken"], "id");
    auto token = special_tokens.find(name);
    if (token == special_tokens.end() || !token->contains("ids") || !(*token)["ids"].is_array())
      return make_error("TemplateProcessing: special token '{}' is not defined", name);
    for (const auto& id : (*token)["ids"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        return make_error("TemplateProcessing: special token '{}' has an invalid id", name);
      (sequence_seen ? after : before).push_back(int32_t(id.get<int64_t>()));
    }
  }
  if (!sequence_seen) return make_error("TemplateProcessing: the single template has no sequence");
  return std::unique_ptr<PostProcessor>(
      new SurroundProcessor(std::move(before), std::move(after), "TemplateProcessing"));
}

// BertProcessing / RobertaProcessing: "cls": [token, id] before, "sep": [token, id] after.
Result<std::unique_ptr<PostProcessor>> parse_cls_sep(const nlohmann::json& spec, const std::string& type) {
  auto id_of = [&](const char* field) -> Result<int32_t> {
    auto it = spec.find(field);
    if (it == spec.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer())
      return make_error("{}: '{}' must be [token, id]", type, field);
    return int32_t((*it)[1].get<int64_t>());
  };
  KILN_ASSIGN(int32_t cls, id_of("cls"));
  KILN_ASSIGN(int32_t sep, id_of("sep"));
  return std::unique_ptr<PostProcessor>(new SurroundProcessor({cls}, {sep}, type));
}

}  // namespace

Result<std::unique_ptr<PostProcessor>> parse_post_processor(const nlohmann::json& spec, int depth) {
  if (spec.is_null()) return std::unique_ptr<PostProcessor>();
  const std::string type = type_of(spec);
  if (type == "TemplateProcessing") return parse_template(spec);
  if (type == "ByteLevel") return std::unique_ptr<PostProcessor>(new NoSpecialTokensProcessor());
  if (type == "BertProcessing" || type == "RobertaProcessing") return parse_cls_sep(spec, type);
  if (type == "Sequence") {
    if (depth >= kMaxComponentNesting)
      return make_error("post_processor Sequences nested deeper than {}", kMaxComponentNesting);
    auto it = spec.find("processors");
    if (it == spec.end() || !it->is_array()) return make_error("post_processor Sequence has no 'processors' list");
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (const auto& step_spec : *it) {
      KILN_ASSIGN(auto step, parse_post_processor(step_spec, depth + 1));
      if (step) steps.push_back(std::move(step));
    }
    return std::unique_ptr<PostProcessor>(new SequenceProcessor(std::move(steps)));
  }
  return make_error("unsupported post_processor type '{}'", type.empty() ? spec.dump() : type);
}

}  // namespace kiln::tokenization
