// The parts of the OpenAI Responses API under its endpoints (handlers.h): input items read as
// the chat messages the chat template takes, the output items a generation's deltas make (with
// the stream's events), and the store of responses that previous_response_id continues.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>

#include "server/service.h"

namespace kiln::server {

// Appends the chat messages of Responses items to `messages`: user, system and developer
// messages (input_text and input_image parts), function_call_output items as tool messages, and
// an assistant turn's items (reasoning with reasoning_text content, a message, function calls, as
// a response's output lists them) as one assistant message with reasoning_content, content and
// tool_calls. `name` says where the items are in the request ("input"), for errors.
std::optional<ApiError> append_response_items(const nlohmann::json& items, const std::string& name,
                                              nlohmann::json& messages);

// A response's output items, built from a generation's deltas in the order the model wrote them:
// reasoning (a `reasoning` item with `reasoning_text` content) and text (a `message` with one
// `output_text` part) each open an item, whitespace alone opening none, and each tool call is a
// `function_call` item. With `events`, each call also appends the stream's events for what it
// added (server-sent events, numbered from 0).
class ResponseOutput {
 public:
  explicit ResponseOutput(bool events) : events_(events) {}

  // The event `type` with `data`, as a server-sent event with the next sequence number ("" without
  // events).
  std::string event(const char* type, nlohmann::json data);
  void add(const OutputDelta& delta, std::string& events);
  // Closes the item being written (`incomplete`: the output ran out of tokens in it); an output
  // without items gets an empty message.
  void finish(bool incomplete, std::string& events);

  const nlohmann::json& items() const { return items_; }

 private:
  enum class Kind { none, reasoning, message };
  void text(Kind kind, const std::string& text, std::string& events);
  void open(Kind kind, std::string& events);
  void write(const std::string& text, std::string& events);
  void close(const char* status, std::string& events);
  void function_call(const ToolCall& call, std::string& events);
  nlohmann::json part(const std::string& text) const;  // the open item's content part holding `text`

  bool events_;
  int64_t sequence_ = 0;
  nlohmann::json items_ = nlohmann::json::array();
  Kind open_ = Kind::none;
  std::string id_;       // the open item's
  std::string written_;  // the open item's text so far
  std::string held_;     // whitespace that would open an item of held_kind_, held until text follows
  Kind held_kind_ = Kind::none;
};

// Stored responses, by id: each response object as it was returned and the conversation that led
// to it (chat messages; its instructions left out, as OpenAI does not carry them over) with its
// output as the last assistant turn, which a later request's previous_response_id continues.
// Bounded in count and bytes: the oldest go first. Shared by the server's threads.
class ResponseStore {
 public:
  struct Entry {
    nlohmann::json response;
    nlohmann::json messages;
  };
  static constexpr size_t kMaxEntries = 1024;
  static constexpr size_t kMaxBytes = size_t(256) << 20;  // the entries' JSON text

  void put(const std::string& id, Entry entry);
  std::shared_ptr<const Entry> get(const std::string& id) const;  // null: not stored (or evicted)
  bool erase(const std::string& id);
  size_t size() const;

 private:
  struct Slot {
    std::shared_ptr<const Entry> entry;
    size_t bytes = 0;
    std::list<std::string>::iterator at;  // its place in order_
  };
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Slot> entries_;
  std::list<std::string> order_;  // ids, oldest first
  size_t bytes_ = 0;
};

}  // namespace kiln::server
