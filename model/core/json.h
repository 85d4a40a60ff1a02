// A small JSON reader (RFC 8259) for the model library, which builds with the
// standard library alone: safetensors headers and confusion-set files.
//
// Errors name the source ("file" or "file header") and the place as
// "line:column (byte N)", 1-based line and column, 0-based byte.
// Duplicate object keys are kept in order (Find returns the first).
// Nesting depth is limited (kMaxDepth) so hostile input cannot overflow the
// stack.
//
// Thread-safety: values; the parser has no shared state.
#ifndef DGCA_MODEL_CORE_JSON_H_
#define DGCA_MODEL_CORE_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/core/status.h"

namespace dgca {

struct JsonValue {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  double number = 0.0;
  // Numbers written as integers (no fraction/exponent) that fit int64.
  bool is_integer = false;
  int64_t integer = 0;
  std::string string;
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;
  // Where the value starts in the text (for error messages by callers).
  int line = 0;
  int column = 0;
  int64_t offset = 0;

  bool is_object() const { return type == Type::kObject; }
  bool is_array() const { return type == Type::kArray; }
  bool is_string() const { return type == Type::kString; }
  bool is_number() const { return type == Type::kNumber; }
  // First member named `key`, or null (also when this is not an object).
  const JsonValue* Find(std::string_view key) const;
  // "line:column (byte N)".
  std::string Where() const;
  static const char* TypeName(Type t);
};

constexpr int kJsonMaxDepth = 256;

// Parses one JSON document (surrounding whitespace allowed). `source` names
// the text in errors (e.g. the file path).
StatusOr<JsonValue> ParseJson(std::string_view text, const std::string& source);

// Appends `s` as a JSON string literal (with quotes and escapes) to `out`.
void AppendJsonString(std::string_view s, std::string* out);

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_JSON_H_
