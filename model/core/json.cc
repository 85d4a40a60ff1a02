#include "model/core/json.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "model/core/utf8.h"

namespace dgca {

const JsonValue* JsonValue::Find(std::string_view key) const {
  if (type != Type::kObject) return nullptr;
  for (const auto& kv : object) {
    if (kv.first == key) return &kv.second;
  }
  return nullptr;
}

std::string JsonValue::Where() const {
  return std::to_string(line) + ":" + std::to_string(column) + " (byte " +
         std::to_string(offset) + ")";
}

const char* JsonValue::TypeName(Type t) {
  switch (t) {
    case Type::kNull: return "null";
    case Type::kBool: return "boolean";
    case Type::kNumber: return "number";
    case Type::kString: return "string";
    case Type::kArray: return "array";
    case Type::kObject: return "object";
  }
  return "?";
}

namespace {

class Parser {
 public:
  Parser(std::string_view text, const std::string& source) : t_(text), source_(source) {}

  StatusOr<JsonValue> Run() {
    JsonValue v;
    SkipWs();
    Status s = ParseValue(&v, 0);
    if (!s.ok()) return s;
    SkipWs();
    if (pos_ != t_.size()) return Error("unexpected text after the JSON value");
    return v;
  }

 private:
  // Line/column of pos_, computed on demand (errors and value starts).
  void Locate(size_t pos, int* line, int* col) const {
    // Incremental: cache the last computed position to stay linear.
    if (pos < loc_pos_) { loc_pos_ = 0; loc_line_ = 1; loc_col_ = 1; }
    for (size_t i = loc_pos_; i < pos && i < t_.size(); ++i) {
      unsigned char c = static_cast<unsigned char>(t_[i]);
      if (c == '\n') { ++loc_line_; loc_col_ = 1; }
      else if ((c & 0xC0) != 0x80) { ++loc_col_; }  // count characters, not bytes
    }
    loc_pos_ = pos;
    *line = loc_line_;
    *col = loc_col_;
  }

  Status Error(const std::string& what) const { return ErrorAt(pos_, what); }
  Status ErrorAt(size_t pos, const std::string& what) const {
    int line, col;
    Locate(pos, &line, &col);
    return InvalidArgumentError(source_ + ":" + std::to_string(line) + ":" +
                                std::to_string(col) + " (byte " + std::to_string(pos) +
                                "): invalid JSON: " + what);
  }

  void SkipWs() {
    while (pos_ < t_.size()) {
      char c = t_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') ++pos_;
      else break;
    }
  }

  Status ParseValue(JsonValue* v, int depth) {
    if (depth > kJsonMaxDepth) return Error("nesting deeper than " + std::to_string(kJsonMaxDepth));
    if (pos_ >= t_.size()) return Error("unexpected end of text, expected a value");
    Locate(pos_, &v->line, &v->column);
    v->offset = static_cast<int64_t>(pos_);
    char c = t_[pos_];
    switch (c) {
      case '{': return ParseObject(v, depth);
      case '[': return ParseArray(v, depth);
      case '"': v->type = JsonValue::Type::kString; return ParseString(&v->string);
      case 't': return ParseLiteral("true", v, JsonValue::Type::kBool, true);
      case 'f': return ParseLiteral("false", v, JsonValue::Type::kBool, false);
      case 'n': return ParseLiteral("null", v, JsonValue::Type::kNull, false);
      default:
        if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber(v);
        return Error(std::string("unexpected character '") + c +
                     "', expected a value (object, array, string, number, true, false, null)");
    }
  }

  Status ParseLiteral(const char* word, JsonValue* v, JsonValue::Type type, bool b) {
    size_t n = std::strlen(word);
    if (t_.substr(pos_, n) != word) return Error(std::string("expected '") + word + "'");
    pos_ += n;
    v->type = type;
    v->boolean = b;
    return OkStatus();
  }

  Status ParseNumber(JsonValue* v) {
    size_t start = pos_;
    bool integer = true;
    if (t_[pos_] == '-') ++pos_;
    if (pos_ >= t_.size() || !isdigit(t_[pos_])) return Error("expected a digit");
    if (t_[pos_] == '0') {
      ++pos_;
    } else {
      while (pos_ < t_.size() && isdigit(t_[pos_])) ++pos_;
    }
    if (pos_ < t_.size() && t_[pos_] == '.') {
      integer = false;
      ++pos_;
      if (pos_ >= t_.size() || !isdigit(t_[pos_])) return Error("expected a digit after '.'");
      while (pos_ < t_.size() && isdigit(t_[pos_])) ++pos_;
    }
    if (pos_ < t_.size() && (t_[pos_] == 'e' || t_[pos_] == 'E')) {
      integer = false;
      ++pos_;
      if (pos_ < t_.size() && (t_[pos_] == '+' || t_[pos_] == '-')) ++pos_;
      if (pos_ >= t_.size() || !isdigit(t_[pos_])) return Error("expected a digit in the exponent");
      while (pos_ < t_.size() && isdigit(t_[pos_])) ++pos_;
    }
    std::string text(t_.substr(start, pos_ - start));
    v->type = JsonValue::Type::kNumber;
    v->number = std::strtod(text.c_str(), nullptr);
    if (integer) {
      errno = 0;
      long long x = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == 0) {
        v->is_integer = true;
        v->integer = x;
      }
    }
    return OkStatus();
  }

  static bool isdigit(char c) { return c >= '0' && c <= '9'; }

  Status ParseHex4(uint32_t* out) {
    if (pos_ + 4 > t_.size()) return Error("truncated \\u escape");
    uint32_t x = 0;
    for (int i = 0; i < 4; ++i) {
      char c = t_[pos_ + i];
      x <<= 4;
      if (c >= '0' && c <= '9') x |= c - '0';
      else if (c >= 'a' && c <= 'f') x |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') x |= c - 'A' + 10;
      else return ErrorAt(pos_ + i, "bad hex digit in \\u escape");
    }
    pos_ += 4;
    *out = x;
    return OkStatus();
  }

  Status ParseString(std::string* out) {
    size_t start = pos_;
    ++pos_;  // opening quote
    out->clear();
    while (true) {
      if (pos_ >= t_.size()) return ErrorAt(start, "unterminated string");
      unsigned char c = static_cast<unsigned char>(t_[pos_]);
      if (c == '"') { ++pos_; return OkStatus(); }
      if (c < 0x20) return Error("control character in string (escape it)");
      if (c != '\\') {
        // Copy a run of plain bytes at once.
        size_t run = pos_;
        while (run < t_.size()) {
          unsigned char d = static_cast<unsigned char>(t_[run]);
          if (d == '"' || d == '\\' || d < 0x20) break;
          ++run;
        }
        out->append(t_.data() + pos_, run - pos_);
        pos_ = run;
        continue;
      }
      ++pos_;
      if (pos_ >= t_.size()) return ErrorAt(start, "unterminated string");
      char e = t_[pos_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp;
          DGCA_RETURN_IF_ERROR(ParseHex4(&cp));
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (pos_ + 2 <= t_.size() && t_[pos_] == '\\' && t_[pos_ + 1] == 'u') {
              pos_ += 2;
              uint32_t lo;
              DGCA_RETURN_IF_ERROR(ParseHex4(&lo));
              if (lo < 0xDC00 || lo > 0xDFFF) return Error("invalid UTF-16 surrogate pair");
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else {
              return Error("lone UTF-16 high surrogate");
            }
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return Error("lone UTF-16 low surrogate");
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return ErrorAt(pos_ - 1, std::string("bad escape '\\") + e + "'");
      }
    }
  }

  Status ParseArray(JsonValue* v, int depth) {
    v->type = JsonValue::Type::kArray;
    ++pos_;
    SkipWs();
    if (pos_ < t_.size() && t_[pos_] == ']') { ++pos_; return OkStatus(); }
    while (true) {
      SkipWs();
      v->array.emplace_back();
      DGCA_RETURN_IF_ERROR(ParseValue(&v->array.back(), depth + 1));
      SkipWs();
      if (pos_ >= t_.size()) return Error("unexpected end of text in array, expected ',' or ']'");
      if (t_[pos_] == ',') { ++pos_; continue; }
      if (t_[pos_] == ']') { ++pos_; return OkStatus(); }
      return Error(std::string("expected ',' or ']' in array, found '") + t_[pos_] + "'");
    }
  }

  Status ParseObject(JsonValue* v, int depth) {
    v->type = JsonValue::Type::kObject;
    ++pos_;
    SkipWs();
    if (pos_ < t_.size() && t_[pos_] == '}') { ++pos_; return OkStatus(); }
    while (true) {
      SkipWs();
      if (pos_ >= t_.size()) return Error("unexpected end of text in object, expected a key");
      if (t_[pos_] != '"') return Error(std::string("expected a string key, found '") + t_[pos_] + "'");
      std::string key;
      DGCA_RETURN_IF_ERROR(ParseString(&key));
      SkipWs();
      if (pos_ >= t_.size() || t_[pos_] != ':') return Error("expected ':' after key \"" + key + "\"");
      ++pos_;
      SkipWs();
      v->object.emplace_back(std::move(key), JsonValue());
      DGCA_RETURN_IF_ERROR(ParseValue(&v->object.back().second, depth + 1));
      SkipWs();
      if (pos_ >= t_.size()) return Error("unexpected end of text in object, expected ',' or '}'");
      if (t_[pos_] == ',') { ++pos_; continue; }
      if (t_[pos_] == '}') { ++pos_; return OkStatus(); }
      return Error(std::string("expected ',' or '}' in object, found '") + t_[pos_] + "'");
    }
  }

  std::string_view t_;
  const std::string& source_;
  size_t pos_ = 0;
  mutable size_t loc_pos_ = 0;
  mutable int loc_line_ = 1;
  mutable int loc_col_ = 1;
};

}  // namespace

StatusOr<JsonValue> ParseJson(std::string_view text, const std::string& source) {
  Parser p(text, source);
  return p.Run();
}

void AppendJsonString(std::string_view s, std::string* out) {
  static const char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      default:
        if (c < 0x20) {
          out->append("\\u00");
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 15]);
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

}  // namespace dgca
