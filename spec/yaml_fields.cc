#include "spec/yaml_fields.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace dgca {

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// Printable, bounded rendering of user text for messages.
std::string Quote(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (out.size() >= 60) { out += "..."; break; }
    if (c < 0x20 || c == 0x7f) {
      out += absl::StrCat("\\x", absl::Hex(c, absl::kZeroPad2));
    } else {
      out += static_cast<char>(c);
    }
  }
  return "'" + out + "'";
}

std::string Describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null: return "null";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Scalar: return Quote(n.Scalar());
    default: return "nothing";
  }
}

void YamlFields::Problem(const YAML::Mark& m, const std::string& field, const std::string& msg) {
  v1::SpecProblem p;
  p.set_file(file_);
  if (!m.is_null() && m.line >= 0) {
    p.set_line(m.line + 1);
    p.set_column(m.column + 1);
  }
  p.set_field(field);
  p.set_message(msg);
  problems_.push_back(std::move(p));
}
bool YamlFields::Map(const YAML::Node& node, const std::string& field,
         const std::vector<Field>& fields) {
  if (node.IsNull()) return true;
  if (!node.IsMap()) {
    Problem(node, field, absl::StrCat("expected a mapping, got ", Describe(node)));
    return false;
  }
  std::set<std::string> seen;
  for (auto it = node.begin(); it != node.end(); ++it) {
    const YAML::Node key = it->first;
    const YAML::Node value = it->second;
    if (!key.IsScalar()) {
      Problem(key, field.empty() ? "(top level)" : field,
              absl::StrCat("keys must be plain names, got ", Describe(key)));
      continue;
    }
    const std::string name = key.Scalar();
    const std::string path = field.empty() ? name : absl::StrCat(field, ".", name);
    if (!seen.insert(name).second) {
      Problem(key, path, "duplicate key; each field may appear once");
      continue;
    }
    const Field* f = nullptr;
    for (const Field& c : fields) {
      if (name == c.key) f = &c;
    }
    if (f == nullptr) {
      std::string best;
      size_t best_d = 3;
      std::vector<std::string> valid;
      for (const Field& c : fields) {
        valid.push_back(c.key);
        size_t d = EditDistance(absl::AsciiStrToLower(name), c.key);
        if (d < best_d) { best_d = d; best = c.key; }
      }
      std::string msg = absl::StrCat("unknown field ", Quote(name));
      if (!best.empty()) absl::StrAppend(&msg, "; did you mean '", best, "'?");
      absl::StrAppend(&msg, "; valid fields here: ", absl::StrJoin(valid, ", "));
      Problem(key, path, msg);
      continue;
    }
    f->handle(value, path);
  }
  return true;
}

bool YamlFields::IntValue(const YAML::Node& n, const std::string& field, int64_t lo, int64_t hi,
                          bool auto_ok, int64_t* out) {
  const char* want = auto_ok ? "an integer or 'auto'" : "an integer";
  if (auto_ok && IsAuto(n)) {
    *out = 0;
    return true;
  }
  if (!n.IsScalar()) {
    Problem(n, field, absl::StrCat("expected ", want, ", got ", Describe(n)));
    return false;
  }
  std::string s = std::string(absl::StripAsciiWhitespace(n.Scalar()));
  std::string digits = s;
  if (!digits.empty() && (digits[0] == '+' || digits[0] == '-')) digits = digits.substr(1);
  bool all_digits = !digits.empty() &&
      std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!all_digits) {
    // 1e3, 2.0: a whole number written as a float is still an integer.
    char* end = nullptr;
    errno = 0;
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0' && errno == 0 && std::isfinite(d) &&
        d == std::floor(d) && std::fabs(d) < 9e15) {
      s = absl::StrCat(static_cast<int64_t>(d));
    } else {
      Problem(n, field, absl::StrCat("expected ", want, ", got ", Quote(n.Scalar())));
      return false;
    }
  }
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno == ERANGE || v < lo || v > hi) {
    std::string range = hi == std::numeric_limits<int64_t>::max() ||
                                hi == std::numeric_limits<int32_t>::max()
                            ? absl::StrCat("must be >= ", lo)
                            : absl::StrCat("must be between ", lo, " and ", hi);
    if (auto_ok) absl::StrAppend(&range, " (or 'auto')");
    Problem(n, field, absl::StrCat(range, ", got ", Quote(n.Scalar())));
    return false;
  }
  *out = v;
  return true;
}

void YamlFields::Num(const YAML::Node& n, const std::string& field, double lo, double hi,
                     bool lo_open, bool auto_ok, double* out, bool hi_open) {
  const char* want = auto_ok ? "a number or 'auto'" : "a number";
  if (auto_ok && IsAuto(n)) { *out = 0; return; }
  if (!n.IsScalar()) {
    Problem(n, field, absl::StrCat("expected ", want, ", got ", Describe(n)));
    return;
  }
  std::string s = std::string(absl::StripAsciiWhitespace(n.Scalar()));
  char* end = nullptr;
  errno = 0;
  double d = s.empty() ? 0 : std::strtod(s.c_str(), &end);
  std::string lower = absl::AsciiStrToLower(s);
  bool hexish = lower.find("0x") != std::string::npos || lower.find("inf") != std::string::npos ||
                lower.find("nan") != std::string::npos;
  if (s.empty() || end == nullptr || *end != '\0' || hexish) {
    Problem(n, field, absl::StrCat("expected ", want, ", got ", Quote(n.Scalar())));
    return;
  }
  if (errno == ERANGE || !std::isfinite(d)) {
    Problem(n, field, absl::StrCat("number out of range, got ", Quote(n.Scalar())));
    return;
  }
  bool bad = lo_open ? !(d > lo) : !(d >= lo);
  if (bad || (hi_open ? !(d < hi) : d > hi)) {
    std::string range = std::isinf(hi) ? absl::StrCat("must be ", lo_open ? "> " : ">= ", lo)
                        : hi_open      ? absl::StrCat("must be ", lo_open ? "> " : ">= ", lo,
                                                      " and < ", hi)
                                       : absl::StrCat("must be between ", lo, " and ", hi);
    if (auto_ok) absl::StrAppend(&range, " (or 'auto')");
    Problem(n, field, absl::StrCat(range, ", got ", Quote(n.Scalar())));
    return;
  }
  *out = d;
}

int YamlFields::BoolValue(const YAML::Node& n) {
  if (!n.IsScalar()) return -1;
  std::string s = absl::AsciiStrToLower(n.Scalar());
  if (s == "true" || s == "yes" || s == "on") return 1;
  if (s == "false" || s == "no" || s == "off") return 0;
  return -1;
}

void YamlFields::Bool(const YAML::Node& n, const std::string& field, bool* out) {
  int b = BoolValue(n);
  if (b < 0) {
    Problem(n, field, absl::StrCat("expected true or false, got ", Describe(n)));
    return;
  }
  *out = b == 1;
}

void YamlFields::Str(const YAML::Node& n, const std::string& field, bool null_ok, std::string* out) {
  if (null_ok && n.IsNull()) { out->clear(); return; }
  if (!n.IsScalar()) {
    Problem(n, field, absl::StrCat("expected a string", null_ok ? " or null" : "",
                                   ", got ", Describe(n)));
    return;
  }
  if (n.Scalar().size() > 4096) {
    Problem(n, field, "string too long (at most 4096 bytes)");
    return;
  }
  *out = n.Scalar();
}

void YamlFields::Enum(const YAML::Node& n, const std::string& field,
          const std::vector<std::string>& valid, std::string* out) {
  if (n.IsScalar()) {
    std::string s = absl::AsciiStrToLower(std::string(absl::StripAsciiWhitespace(n.Scalar())));
    for (const auto& v : valid) {
      if (s == v) { *out = v; return; }
    }
  }
  Problem(n, field, absl::StrCat("expected one of ", absl::StrJoin(valid, " | "),
                                 ", got ", Describe(n)));
}

}  // namespace dgca
