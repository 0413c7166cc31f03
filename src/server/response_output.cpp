// The Responses API's output items and stream events as a generation's deltas arrive, and the
// store of responses that previous_response_id continues (responses.h); the endpoints are in
// responses.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "server/handlers.h"
#include "server/responses.h"

namespace kiln::server {

using nlohmann::json;

namespace {

bool whitespace(const std::string& text) {
  return std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isspace(c); });
}

}  // namespace

// ---- the output ----

std::string ResponseOutput::event(const char* type, json data) {
  if (!events_) return {};
  data["type"] = type;
  data["sequence_number"] = sequence_++;
  return fmt::format("event: {}\ndata: {}\n\n", type, data.dump(-1, ' ', false, json::error_handler_t::replace));
}

void ResponseOutput::add(const OutputDelta& delta, std::string& events) {
  if (!delta.reasoning.empty()) text(Kind::reasoning, delta.reasoning, events);
  if (!delta.content.empty()) text(Kind::message, delta.content, events);
  for (const ToolCall& call : delta.tool_calls) function_call(call, events);
}

void ResponseOutput::finish(bool incomplete, std::string& events) {
  held_.clear();
  const char* status = incomplete ? "incomplete" : "completed";
  close(status, events);
  if (!items_.empty()) return;
  open(Kind::message, events);
  close(status, events);
}

void ResponseOutput::text(Kind kind, const std::string& text, std::string& events) {
  if (open_ == kind) {
    held_.clear();
    write(text, events);
    return;
  }
  if (held_kind_ != kind) held_.clear();
  held_ += text;
  held_kind_ = kind;
  if (whitespace(held_)) return;
  close("completed", events);
  open(kind, events);
  write(std::exchange(held_, {}), events);
}

void ResponseOutput::open(Kind kind, std::string& events) {
  open_ = kind;
  id_ = random_id(kind == Kind::message ? "msg_" : "rs_");
  written_.clear();
  const size_t index = items_.size();
  json item = kind == Kind::message ? json{{"id", id_},
                                           {"type", "message"},
                                           {"status", "in_progress"},
                                           {"role", "assistant"},
                                           {"content", json::array()}}
                                    : json{{"id", id_},
                                           {"type", "reasoning"},
                                           {"status", "in_progress"},
                                           {"summary", json::array()},
                                           {"content", json::array()}};
  events += event("response.output_item.added", {{"output_index", index}, {"item", std::move(item)}});
  events += event("response.content_part.added",
                  {{"item_id", id_}, {"output_index", index}, {"content_index", 0}, {"part", part("")}});
}

void ResponseOutput::write(const std::string& text, std::string& events) {
  written_ += text;
  json data = {{"item_id", id_}, {"output_index", items_.size()}, {"content_index", 0}, {"delta", text}};
  if (open_ == Kind::message) {
    data["logprobs"] = json::array();
    events += event("response.output_text.delta", std::move(data));
  } else {
    events += event("response.reasoning_text.delta", std::move(data));
  }
}

void ResponseOutput::close(const char* status, std::string& events) {
  if (open_ == Kind::none) return;
  const size_t index = items_.size();
  json done = {{"item_id", id_}, {"output_index", index}, {"content_index", 0}, {"text", written_}};
  json item;
  if (open_ == Kind::message) {
    done["logprobs"] = json::array();
    events += event("response.output_text.done", std::move(done));
    item = {{"id", id_},
            {"type", "message"},
            {"status", status},
            {"role", "assistant"},
            {"content", json::array({part(written_)})}};
  } else {
    events += event("response.reasoning_text.done", std::move(done));
    item = {{"id", id_},
            {"type", "reasoning"},
            {"status", status},
            {"summary", json::array()},
            {"content", json::array({part(written_)})}};
  }
  events += event("response.content_part.done",
                  {{"item_id", id_}, {"output_index", index}, {"content_index", 0}, {"part", part(written_)}});
  events += event("response.output_item.done", {{"output_index", index}, {"item", item}});
  items_.push_back(std::move(item));
  open_ = Kind::none;
}

json ResponseOutput::part(const std::string& text) const {
  if (open_ == Kind::message)
    return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}};
  return {{"type", "reasoning_text"}, {"text", text}};
}

void ResponseOutput::function_call(const ToolCall& call, std::string& events) {
  held_.clear();
  close("completed", events);
  const size_t index = items_.size();
  json item = {{"id", random_id("fc_")},        {"type", "function_call"}, {"status", "in_progress"},
               {"call_id", random_id("call_")}, {"name", call.name},       {"arguments", ""}};
  events += event("response.output_item.added", {{"output_index", index}, {"item", item}});
  events += event("response.function_call_arguments.delta",
                  {{"item_id", item["id"]}, {"output_index", index}, {"delta", call.arguments}});
  events +=
      event("response.function_call_arguments.done",
            {{"item_id", item["id"]}, {"output_index", index}, {"name", call.name}, {"arguments", call.arguments}});
  item["arguments"] = call.arguments;
  item["status"] = "completed";
  events += event("response.output_item.done", {{"output_index", index}, {"item", item}});
  items_.push_back(std::move(item));
}

// ---- the store ----

void ResponseStore::put(const std::string& id, Entry entry) {
  const size_t bytes = entry.response.dump(-1, ' ', false, json::error_handler_t::replace).size() +
                       entry.messages.dump(-1, ' ', false, json::error_handler_t::replace).size();
  auto shared = std::make_shared<const Entry>(std::move(entry));
  std::lock_guard lock(mutex_);
  if (auto it = entries_.find(id); it != entries_.end()) {
    bytes_ -= it->second.bytes;
    order_.erase(it->second.at);
    entries_.erase(it);
  }
  order_.push_back(id);
  entries_[id] = Slot{.entry = std::move(shared), .bytes = bytes, .at = std::prev(order_.end())};
  bytes_ += bytes;
  // the oldest go; the newest stays even when it alone is over the byte limit
  while (order_.size() > 1 && (order_.size() > kMaxEntries || bytes_ > kMaxBytes)) {
    auto oldest = entries_.find(order_.front());
    bytes_ -= oldest->second.bytes;
    entries_.erase(oldest);
    order_.pop_front();
  }
}

std::shared_ptr<const ResponseStore::Entry> ResponseStore::get(const std::string& id) const {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.entry;
}

size_t ResponseStore::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  bytes_ -= it->second.bytes;
  order_.erase(it->second.at);
  entries_.erase(it);
  return true;
}

}  // namespace kiln::server
