#include "engine/output_parser.h"

#include "engine/json_text.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string_view>

namespace kiln::engine {

using nlohmann::json;

namespace {

std::string trim_newlines(std::string s) {
  while (!s.empty() && (s.front() == '\n' || s.front() == ' ')) s.erase(s.begin());
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// The longest suffix of `text` that is a proper prefix of `marker`.
size_t partial_marker(const std::string& text, const std::string& marker) {
  if (marker.empty()) return 0;
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (text.compare(text.size() - n, n, marker, 0, n) == 0) return n;
  return 0;
}

// The JSON type a tool's schema gives an argument ("" when unknown).
std::string argument_type(const json& tools, const std::string& function, const std::string& argument) {
  if (!tools.is_array()) return "";
  for (const auto& tool : tools) {
    const json& f = tool.contains("function") ? tool["function"] : tool;
    if (!f.is_object() || string_field(f, "name") != function) continue;
    const json* schema = f.contains("parameters")     ? &f["parameters"]
                         : f.contains("input_schema") ? &f["input_schema"]
                                                      : nullptr;
    if (!schema || !schema->is_object() || !schema->contains("properties")) return "";
    const json& props = (*schema)["properties"];
    if (props.is_object() && props.contains(argument) && props[argument].is_object())
      return string_field(props[argument], "type");
    return "";
  }
  return "";
}

// The model's output is read no deeper than a request may nest: deeper JSON stays text (a JSON
// value is copied and written out recursively).
json typed_value(const std::string& text, const std::string& type) {
  if (type == "string" || nesting_depth(text) > kMaxNesting) return text;
  auto parsed = json::parse(text, nullptr, false);
  if (parsed.is_discarded()) return text;
  return parsed;
}

Result<ToolCall> parse_qwen_xml(const std::string& body, const json& tools) {
  const size_t f = body.find("<function=");
  if (f == std::string::npos) return make_error("no <function=...> in the tool call");
  const size_t name_end = body.find('>', f);
  if (name_end == std::string::npos) return make_error("unterminated <function=...>");
  ToolCall call;
  call.name = trim_newlines(body.substr(f + 10, name_end - f - 10));
  json args = json::object();
  size_t at = name_end + 1;
  for (;;) {
    const size_t p = body.find("<parameter=", at);
    if (p == std::string::npos) break;
    const size_t key_end = body.find('>', p);
    if (key_end == std::string::npos) return make_error("unterminated <parameter=...>");
    const std::string key = trim_newlines(body.substr(p + 11, key_end - p - 11));
    size_t value_end = body.find("</parameter>", key_end);
    const size_t next = body.find("<parameter=", key_end);
    if (value_end == std::string::npos || (next != std::string::npos && next < value_end)) {
      value_end = next != std::string::npos ? next : body.find("</function>", key_end);
      if (value_end == std::string::npos) value_end = body.size();
    }
    std::string value = body.substr(key_end + 1, value_end - key_end - 1);
    if (!value.empty() && value.front() == '\n') value.erase(value.begin());
    if (!value.empty() && value.back() == '\n') value.pop_back();
    args[key] = typed_value(value, argument_type(tools, call.name, key));
    at = value_end;
  }
  call.arguments = args.dump();
  return call;
}

Result<ToolCall> parse_hermes_json(const std::string& body) {
  if (nesting_depth(body) > kMaxNesting) return make_error("the tool call nests deeper than {} levels", kMaxNesting);
  auto parsed = json::parse(body, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("name") || !parsed["name"].is_string())
    return make_error("the tool call is not a JSON object with a name");
  ToolCall call;
  call.name = parsed["name"].get<std::string>();
  json args = parsed.contains("arguments") ? parsed["arguments"] : json::object();
  if (args.is_string() && nesting_depth(args.get_ref<const std::string&>()) <= kMaxNesting) {
    auto inner = json::parse(args.get<std::string>(), nullptr, false);
    if (!inner.is_discarded()) args = inner;
  }
  call.arguments = args.dump();
  return call;
}

// Gemma 4's argument syntax: JSON with bare keys and strings quoted by <|"|>.
class GemmaArguments {
 public:
  explicit GemmaArguments(const std::string& text) : s_(text) {}

  Result<json> value() {
    skip_space();
    if (at("<|\"|>")) {
      i_ += 5;
      const size_t end = s_.find("<|\"|>", i_);
      if (end == std::string::npos) return make_error("unterminated string");
      std::string out = s_.substr(i_, end - i_);
      i_ = end + 5;
      return json(out);
    }
    if (i_ < s_.size() && s_[i_] == '{') return object();
    if (i_ < s_.size() && s_[i_] == '[') return array();
    const size_t start = i_;
    while (i_ < s_.size() && s_[i_] != ',' && s_[i_] != '}' && s_[i_] != ']') ++i_;
    const std::string raw = trim_newlines(s_.substr(start, i_ - start));
    auto parsed = json::parse(raw, nullptr, false);
    return parsed.is_discarded() ? json(raw) : parsed;
  }

  Result<json> object() {
    if (++depth_ > 64) return make_error("arguments nested too deeply");
    ++i_;  // {
    json out = json::object();
    for (;;) {
      skip_space();
      if (i_ >= s_.size()) return make_error("unterminated object");
      if (s_[i_] == '}') {
        ++i_;
        break;
      }
      std::string key;
      if (at("<|\"|>")) {
        KILN_ASSIGN(json k, value());
        key = k.get<std::string>();
      } else {
        const size_t colon = s_.find(':', i_);
        if (colon == std::string::npos) return make_error("a key without a value");
        key = trim_newlines(s_.substr(i_, colon - i_));
        i_ = colon;
      }
      skip_space();
      if (i_ >= s_.size() || s_[i_] != ':') return make_error("expected ':' after key {}", key);
      ++i_;
      KILN_ASSIGN(json v, value());
      out[key] = std::move(v);
      skip_space();
      if (i_ < s_.size() && s_[i_] == ',') ++i_;
    }
    --depth_;
    return out;
  }

  Result<json> array() {
    if (++depth_ > 64) return make_error("arguments nested too deeply");
    ++i_;  // [
    json out = json::array();
    for (;;) {
      skip_space();
      if (i_ >= s_.size()) return make_error("unterminated array");
      if (s_[i_] == ']') {
        ++i_;
        break;
      }
      KILN_ASSIGN(json v, value());
      out.push_back(std::move(v));
      skip_space();
      if (i_ < s_.size() && s_[i_] == ',') ++i_;
    }
    --depth_;
    return out;
  }

 private:
  bool at(const char* token) const { return s_.compare(i_, std::strlen(token), token) == 0; }
  void skip_space() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  std::string s_;
  size_t i_ = 0;
  int depth_ = 0;
};

Result<ToolCall> parse_gemma(const std::string& body) {
  std::string text = trim_newlines(body);
  if (text.rfind("call:", 0) != 0) return make_error("the tool call does not start with call:");
  const size_t brace = text.find('{');
  ToolCall call;
  call.name = trim_newlines(text.substr(5, brace == std::string::npos ? std::string::npos : brace - 5));
  if (call.name.empty()) return make_error("the tool call has no name");
  if (brace == std::string::npos) {
    call.arguments = "{}";
    return call;
  }
  GemmaArguments parser(text.substr(brace));
  KILN_ASSIGN(json args, parser.object());
  call.arguments = args.dump();
  return call;
}

}  // namespace

Result<ToolCall> parse_tool_call(ToolFormat format, const std::string& body, const json& tools) {
  const std::string text = trim_newlines(body);
  if (format == ToolFormat::gemma) return parse_gemma(text);
  if (text.rfind("<function=", 0) == 0) return parse_qwen_xml(text, tools);
  return parse_hermes_json(text);
}

OutputFormat OutputFormat::for_vocabulary(const std::function<bool(const std::string&)>& has_token) {
  OutputFormat f;
  if (has_token("<|tool_call>") || has_token("<|channel>")) {
    f.tools = ToolFormat::gemma;
    f.think_open = "<|channel>thought";
    f.think_close = "<channel|>";
    f.call_open = "<|tool_call>";
    f.call_close = "<tool_call|>";
    return f;
  }
  if (has_token("<think>") && has_token("</think>")) {
    f.think_open = "<think>";
    f.think_close = "</think>";
  }
  if (has_token("<tool_call>") && has_token("</tool_call>")) {
    f.tools = ToolFormat::qwen_xml;  // or JSON: parse_tool_call tells them apart by the body
    f.call_open = "<tool_call>";
    f.call_close = "</tool_call>";
  }
  return f;
}

OutputFormat OutputFormat::for_markup(const ChatMarkup& markup,
                                      const std::function<bool(const std::string&)>& has_token) {
  // a marker is in the vocabulary as a token of its own, or as one of the family's kept tokens
  // followed by text (Gemma 4's "<|channel>thought")
  auto known = [&](const std::string& marker) {
    if (marker.empty()) return false;
    if (has_token(marker)) return true;
    for (const auto& token : markup.kept_tokens)
      if (marker.rfind(token, 0) == 0 && has_token(token)) return true;
    return false;
  };
  OutputFormat f;
  if (known(markup.think_open) && known(markup.think_close)) {
    f.think_open = markup.think_open;
    f.think_close = markup.think_close;
  }
  if (markup.tool_calls != ToolCallSyntax::none && known(markup.call_open) && known(markup.call_close)) {
    f.call_open = markup.call_open;
    f.call_close = markup.call_close;
    switch (markup.tool_calls) {
      case ToolCallSyntax::qwen_xml:
        f.tools = ToolFormat::qwen_xml;
        break;
      case ToolCallSyntax::hermes_json:
        f.tools = ToolFormat::hermes_json;
        break;
      case ToolCallSyntax::gemma:
        f.tools = ToolFormat::gemma;
        break;
      case ToolCallSyntax::none:
        break;
    }
  } else if (markup.tool_calls == ToolCallSyntax::gemma && !f.think_open.empty()) {
    f.tools = ToolFormat::gemma;  // Gemma's reasoning alone: its kept tokens and answer separator
  }
  return f;
}

std::vector<std::string> OutputFormat::markers() const {
  std::vector<std::string> out;
  for (const std::string* m : {&think_open, &think_close, &call_open, &call_close})
    if (!m->empty()) out.push_back(*m);
  if (tools == ToolFormat::gemma) {
    out.push_back("<|channel>");  // think_open is this token followed by the text "thought"
    out.push_back("<|\"|>");
  }
  return out;
}

void read_qwen_call_body(const ChatTemplate& tmpl, OutputFormat& format) {
  ChatRequest probe;
  probe.messages = nlohmann::ordered_json::parse(
      R"([{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
          "function": {"name": "probe_fn", "arguments": {"a": 1}}}]}])");
  probe.tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "probe_fn", "parameters": {"type": "object",
          "properties": {"a": {"type": "integer"}}}}}])");
  probe.add_generation_prompt = false;
  auto text = tmpl.render(probe);
  format.tools = ToolFormat::qwen_xml;
  format.json_before_name.clear(), format.json_after_name.clear();
  if (!text.ok() || text->find("probe_fn") == std::string::npos ||
      text->find("<function=probe_fn>") != std::string::npos)
    return;
  format.tools = ToolFormat::hermes_json;
  // The call is the last thing rendered (a system prompt may name the marker and the tool before
  // it). Only a short, one-line text on each side of the name is taken as the form.
  const size_t open = format.call_open.empty() ? std::string::npos : text->rfind(format.call_open);
  if (open == std::string::npos) return;
  constexpr std::string_view kName = "probe_fn", kArguments = "{\"a\"";
  const size_t body = open + format.call_open.size(), name = text->find(kName, body);
  const size_t arguments = name == std::string::npos ? name : text->find(kArguments, name);
  if (arguments == std::string::npos) return;
  const size_t name_end = name + kName.size();
  std::string before = text->substr(body, name - body), after = text->substr(name_end, arguments - name_end);
  while (!after.empty() && std::isspace(static_cast<unsigned char>(after.back()))) after.pop_back();
  // a newline may open the body (Qwen 3: `<tool_call>\n{"name": "`), none may follow
  const std::string_view head = std::string_view(before).substr(before.starts_with('\n') ? 1 : 0);
  if (before.size() > 32 || after.empty() || after.size() > 32 || head.find('\n') != head.npos ||
      after.find('\n') != std::string::npos)
    return;
  format.json_before_name = std::move(before);
  format.json_after_name = std::move(after);
}

std::string OutputFormat::call_opening(const std::string& function) const {
  switch (tools) {
    case ToolFormat::none:
      return "";
    case ToolFormat::gemma:
      return call_open + "call:" + function;  // the model writes the `{` (its tokens may join what follows)
    case ToolFormat::qwen_xml:
      return call_open + "\n" + (function.empty() ? "" : "<function=" + function + ">\n");
    case ToolFormat::hermes_json: {
      if (function.empty() || json_before_name.empty()) return call_open + "\n";
      const std::string quoted = nlohmann::json(function).dump();  // the name as a JSON string
      return call_open + json_before_name + quoted.substr(1, quoted.size() - 2) + json_after_name;
    }
  }
  return "";
}

std::string OutputFormat::answer_separator() const {
  return tools == ToolFormat::gemma ? "" : "\n\n";  // Qwen: `</think>\n\n` then the answer
}

OutputParser::OutputParser(OutputFormat format) : format_(std::move(format)) {
  if (format_.starts_in_reasoning && !format_.think_close.empty()) mode_ = Mode::reasoning;
}

OutputDelta OutputParser::push(const std::string& text) {
  buffer_ += text;
  OutputDelta out;
  scan(out, false);
  return out;
}

OutputDelta OutputParser::finish() {
  OutputDelta out;
  scan(out, true);
  if (mode_ == Mode::call) out.content += format_.call_open + call_;
  call_.clear();
  mode_ = Mode::content;
  return out;
}

void OutputParser::scan(OutputDelta& out, bool final) {
  for (;;) {
    if (mode_ == Mode::content) {
      while (strip_newlines_ && !buffer_.empty() && buffer_.front() == '\n') buffer_.erase(buffer_.begin());
      if (!buffer_.empty()) strip_newlines_ = false;
      size_t best = std::string::npos;
      const std::string* marker = nullptr;
      for (const std::string* m : {&format_.think_open, &format_.call_open}) {
        if (m->empty()) continue;
        const size_t p = buffer_.find(*m);
        if (p < best) best = p, marker = m;
      }
      if (marker) {
        out.content += buffer_.substr(0, best);
        buffer_.erase(0, best + marker->size());
        mode_ = marker == &format_.think_open ? Mode::reasoning : Mode::call;
        continue;
      }
      size_t keep = 0;
      if (!final)
        keep = std::max(partial_marker(buffer_, format_.think_open), partial_marker(buffer_, format_.call_open));
      out.content += buffer_.substr(0, buffer_.size() - keep);
      buffer_.erase(0, buffer_.size() - keep);
      return;
    }
    if (mode_ == Mode::reasoning) {
      const size_t p = buffer_.find(format_.think_close);
      if (p != std::string::npos) {
        out.reasoning += buffer_.substr(0, p);
        buffer_.erase(0, p + format_.think_close.size());
        // the answer starts after the blank line that follows the reasoning
        strip_newlines_ = true;
        mode_ = Mode::content;
        continue;
      }
      const size_t keep = final ? 0 : partial_marker(buffer_, format_.think_close);
      out.reasoning += buffer_.substr(0, buffer_.size() - keep);
      buffer_.erase(0, buffer_.size() - keep);
      return;
    }
    // a tool call: collected until its closing marker
    const size_t p = buffer_.find(format_.call_close);
    if (p != std::string::npos) {
      call_ += buffer_.substr(0, p);
      buffer_.erase(0, p + format_.call_close.size());
      auto call = parse_tool_call(format_.tools, call_, format_.tool_schemas);
      if (call.ok()) {
        out.tool_calls.push_back(std::move(call).value());
      } else {
        out.content += format_.call_open + call_ + format_.call_close;
      }
      call_.clear();
      mode_ = Mode::content;
      continue;
    }
    const size_t keep = final ? 0 : partial_marker(buffer_, format_.call_close);
    call_ += buffer_.substr(0, buffer_.size() - keep);
    buffer_.erase(0, buffer_.size() - keep);
    return;
  }
}

}  // namespace kiln::engine
