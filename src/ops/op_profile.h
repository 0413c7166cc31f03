// Time by op, summed while a backend profiles (`kiln bench --profile`): what each backend's
// profile_report() prints, the ops with the most time first.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

class OpProfile {
 public:
  void add(const std::string& op, double ms) {
    auto& [total, calls] = by_op_[op];
    total += ms;
    calls += 1;
  }
  void clear() { by_op_.clear(); }

  std::string report() const {
    std::vector<std::pair<std::string, std::pair<double, int>>> rows(by_op_.begin(), by_op_.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    double total = 0;
    for (const auto& row : rows) total += row.second.first;
    std::string out = fmt::format("  {:<20} {:>10} {:>8} {:>10} {:>6}\n", "op", "ms", "calls", "us/call", "share");
    for (const auto& [name, v] : rows)
      out += fmt::format("  {:<20} {:>10.3f} {:>8} {:>10.1f} {:>5.1f}%\n", name, v.first, v.second,
                         1000.0 * v.first / v.second, 100.0 * v.first / std::max(total, 1e-9));
    return out;
  }

 private:
  std::map<std::string, std::pair<double, int>> by_op_;  // ms and calls
};

}  // namespace kiln
