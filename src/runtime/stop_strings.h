// Stop strings matched on decoded text across token boundaries. Text that might still turn into
// a stop string is held back until it cannot, so nothing past a stop is ever emitted and nothing
// before it is lost.
#pragma once

#include <string>
#include <vector>

namespace kiln {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Adds decoded text; returns what may be shown now. After a stop is found, stopped() is true
  // and the returned text ends just before it.
  std::string push(const std::string& text);
  // The text still held back (when generation ends without a stop).
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace kiln
