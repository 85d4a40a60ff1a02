#include "model/core/strings.h"

#include <algorithm>
#include <cstdio>

namespace dgca {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') q += "'\\''";
    else q += c;
  }
  return q + "'";
}

std::string TextTable(const std::vector<std::vector<std::string>>& in) {
  // One line per row: a cell's line breaks (a multi-line failure message in
  // `dgca list`) become " / ", so no row spills into the next.
  std::vector<std::vector<std::string>> rows = in;
  for (auto& r : rows) {
    for (auto& c : r) {
      std::string one;
      for (size_t i = 0; i < c.size(); ++i) {
        if (c[i] == '\r') continue;
        if (c[i] == '\n') {
          if (i + 1 < c.size()) one += " / ";
        } else {
          one += c[i];
        }
      }
      c = std::move(one);
    }
  }
  std::vector<size_t> w;
  for (const auto& r : rows) {
    if (w.size() < r.size()) w.resize(r.size(), 0);
    for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
  }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(w[i] - r[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string FinalLossValue(double final_loss) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.4f", final_loss);
  return buf;
}

std::string FinalLossText(double final_loss, int steps, int ranks) {
  if (steps <= 0) return "none (no step trained)";
  return FinalLossValue(final_loss) + " (mean of the last " + std::to_string(steps) +
         (steps == 1 ? " step" : " steps") + " over " + std::to_string(ranks) +
         (ranks == 1 ? " rank)" : " ranks)");
}

}  // namespace dgca
