#include "engine/text_generation.h"

namespace kiln::engine {

OutputFormat output_format(const std::string& family, const Tokenizer* tokenizer, const ChatTemplate* chat_template) {
  if (!tokenizer) return {};
  auto has_token = [&](const std::string& token) { return tokenizer->token_to_id(token).has_value(); };
  const ModelFamily* f = family_named(family);
  OutputFormat format = f ? OutputFormat::for_markup(f->chat, has_token) : OutputFormat::for_vocabulary(has_token);
  if (format.tools == ToolFormat::qwen_xml && chat_template) read_qwen_call_body(*chat_template, format);
  return format;
}

OutputFormat chat_output_format(OutputFormat format, const std::string& rendered_prompt, const nlohmann::json* tools) {
  if (tools)
    format.tool_schemas = *tools;
  else
    format.call_open = format.call_close = "";
  std::string_view tail = rendered_prompt;
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.remove_suffix(1);
  const std::string& open = format.think_open;
  format.starts_in_reasoning = !open.empty() && tail.ends_with(open);
  return format;
}

TokenText::TokenText(std::shared_ptr<const Tokenizer> tokenizer, const std::vector<std::string>& kept_markers)
    : tokenizer_(tokenizer), decoder_(tokenizer, /*skip_special_tokens=*/false) {
  for (const auto& marker : kept_markers)
    if (auto id = tokenizer_->token_to_id(marker)) kept_.insert(*id);
}

std::string TokenText::push(int32_t id) {
  if (!tokenizer_->is_special(id)) return decoder_.push(id);
  if (!kept_.count(id)) return "";
  return decoder_.flush() + tokenizer_->id_to_token(id).value_or("");
}

std::string TokenText::flush() {
  return decoder_.flush();
}

TextGeneration::TextGeneration(std::shared_ptr<Generation> generation, std::shared_ptr<const Tokenizer> tokenizer,
                               TextGenerationOptions options)
    : generation_(std::move(generation)),
      tokenizer_(tokenizer),
      stop_(options.stops),
      parser_(options.format),
      one_tool_call_(options.one_tool_call) {
  if (tokenizer) text_ = std::make_unique<TokenText>(tokenizer, options.format.markers());
}

TextGeneration::~TextGeneration() {
  if (!finished_) generation_->cancel();
}

void TextGeneration::add(OutputDelta& into, const OutputDelta& from) {
  into.content += from.content;
  into.reasoning += from.reasoning;
  for (const auto& call : from.tool_calls) {
    if (one_tool_call_ && tool_calls_ > 0) break;
    into.tool_calls.push_back(call);
    ++tool_calls_;
  }
}

bool TextGeneration::next(OutputDelta& delta, std::vector<int32_t>& ids, std::chrono::milliseconds timeout,
                          std::vector<SampledLogprobs>* logprobs) {
  if (finished_) return false;
  Generation::Update update = generation_->wait(timeout);
  for (size_t i = 0; i < update.tokens.size(); ++i) {
    const int32_t id = update.tokens[i];
    ++tokens_;
    ids.push_back(id);
    if (logprobs && i < update.logprobs.size()) logprobs->push_back(std::move(update.logprobs[i]));
    if (!text_) continue;
    add(delta, parser_.push(stop_.push(text_->push(id))));
    if (stop_.stopped()) {
      // the text reached a stop string: nothing after it is wanted
      generation_->cancel();
      finished_ = true;
      reason_ = FinishReason::stop;
      add(delta, parser_.finish());
      return false;
    }
    if (one_tool_call_ && tool_calls_ > 0) {
      // the one call asked for is complete: what the model writes after it is not wanted
      generation_->cancel();
      finished_ = true;
      reason_ = FinishReason::stop;
      return false;
    }
  }
  if (update.finish == FinishReason::running) return true;
  finished_ = true;
  reason_ = update.finish;
  error_ = update.error;
  if (text_) {
    add(delta, parser_.push(stop_.push(text_->flush())));
    if (!stop_.stopped()) add(delta, parser_.push(stop_.flush()));
    add(delta, parser_.finish());
  }
  return false;
}

std::string TextGeneration::token_text(int32_t id) const {
  if (!tokenizer_) return "token_id:" + std::to_string(id);
  auto text = tokenizer_->decode(std::span<const int32_t>(&id, 1));
  return text.ok() ? *text : std::string();
}

std::string TextGeneration::finish_reason() const {
  if (reason_ == FinishReason::stop && tool_calls_ > 0) return "tool_calls";
  return finish_reason_name(reason_);
}

}  // namespace kiln::engine
