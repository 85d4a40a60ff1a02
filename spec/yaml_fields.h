// Reading typed fields out of a parsed YAML tree while collecting problems
// with file:line:column, the field's path and what would be valid: the
// machinery under the job spec parser (spec/spec.h), which knows the
// fields. Nothing here throws or stops at the first problem: a bad value is
// reported and the output left as it was, so one pass reports everything.
//
// Thread-safety: a YamlFields is used by one thread; the free functions are
// pure.
#ifndef DGCA_SPEC_YAML_FIELDS_H_
#define DGCA_SPEC_YAML_FIELDS_H_

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "dgca/v1/coordinator.pb.h"

namespace dgca {

// Levenshtein distance, for "did you mean" suggestions.
size_t EditDistance(const std::string& a, const std::string& b);

// Printable, bounded rendering of user text for messages: 'text', control
// bytes as \xNN, cut after 60 characters.
std::string Quote(const std::string& s);

// "null", "a list", "a mapping" or the quoted scalar: what a value is, for
// "expected X, got Y".
std::string Describe(const YAML::Node& n);

class YamlFields {
 public:
  explicit YamlFields(std::string file) : file_(std::move(file)) {}

  std::vector<v1::SpecProblem>& problems() { return problems_; }
  // The file name the problems carry.
  const std::string& file() const { return file_; }

  // Records a problem at `m` (1-based line and column in the message).
  void Problem(const YAML::Mark& m, const std::string& field, const std::string& msg);
  void Problem(const YAML::Node& n, const std::string& field, const std::string& msg) {
    Problem(n.Mark(), field, msg);
  }

  using Handler = std::function<void(const YAML::Node& value, const std::string& field)>;
  struct Field {
    const char* key;
    Handler handle;
  };

  // Walks mapping `node` (null = empty mapping) dispatching known keys;
  // reports unknown keys (with the nearest valid one and the list) and
  // duplicate keys. Returns false when `node` is not a mapping.
  bool Map(const YAML::Node& node, const std::string& field, const std::vector<Field>& fields);

  static bool IsAuto(const YAML::Node& n) {
    return n.IsScalar() && absl::AsciiStrToLower(n.Scalar()) == "auto";
  }

  // Integer in [lo, hi]; `auto_ok`: "auto" gives 0. A whole number written
  // as a float (1e3, 2.0) is an integer.
  template <typename T>
  void Int(const YAML::Node& n, const std::string& field, int64_t lo, int64_t hi, bool auto_ok,
           T* out) {
    int64_t v = 0;
    if (IntValue(n, field, lo, hi, auto_ok, &v)) *out = static_cast<T>(v);
  }

  // Finite number in [lo, hi] (hi may be infinity); `lo_open`: must be > lo;
  // `hi_open`: must be < hi; `auto_ok`: "auto" gives 0.
  void Num(const YAML::Node& n, const std::string& field, double lo, double hi, bool lo_open,
           bool auto_ok, double* out, bool hi_open = false);

  // -1 when `n` is not a boolean scalar (true/false, yes/no, on/off), else 0/1.
  static int BoolValue(const YAML::Node& n);
  void Bool(const YAML::Node& n, const std::string& field, bool* out);

  // A scalar of at most 4096 bytes; `null_ok`: null gives "".
  void Str(const YAML::Node& n, const std::string& field, bool null_ok, std::string* out);

  // One of `valid` (lower case; matched case-insensitively).
  void Enum(const YAML::Node& n, const std::string& field, const std::vector<std::string>& valid,
            std::string* out);

 private:
  bool IntValue(const YAML::Node& n, const std::string& field, int64_t lo, int64_t hi,
                bool auto_ok, int64_t* out);

  std::string file_;
  std::vector<v1::SpecProblem> problems_;
};

}  // namespace dgca

#endif  // DGCA_SPEC_YAML_FIELDS_H_
