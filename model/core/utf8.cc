#include "model/core/utf8.h"

namespace dgca {

bool DecodeUtf8(std::string_view s, size_t* pos, uint32_t* cp) {
  size_t i = *pos;
  if (i >= s.size()) return false;
  const unsigned char c0 = static_cast<unsigned char>(s[i]);
  if (c0 < 0x80) {
    *cp = c0;
    *pos = i + 1;
    return true;
  }
  int n;
  uint32_t v, min;
  if ((c0 & 0xE0) == 0xC0) { n = 1; v = c0 & 0x1F; min = 0x80; }
  else if ((c0 & 0xF0) == 0xE0) { n = 2; v = c0 & 0x0F; min = 0x800; }
  else if ((c0 & 0xF8) == 0xF0) { n = 3; v = c0 & 0x07; min = 0x10000; }
  else return false;
  if (i + static_cast<size_t>(n) >= s.size()) return false;  // truncated sequence
  for (int k = 1; k <= n; ++k) {
    const unsigned char c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xC0) != 0x80) return false;
    v = (v << 6) | (c & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return false;
  *cp = v;
  *pos = i + n + 1;
  return true;
}

size_t FindInvalidUtf8(std::string_view s) {
  size_t pos = 0;
  uint32_t cp;
  while (pos < s.size()) {
    // Fast path over ASCII.
    if (static_cast<unsigned char>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    if (!DecodeUtf8(s, &pos, &cp)) return pos;
  }
  return std::string_view::npos;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::vector<uint32_t> Utf8ToCodepoints(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    uint32_t cp;
    if (DecodeUtf8(s, &pos, &cp)) {
      out.push_back(cp);
    } else {
      out.push_back(0xFFFD);
      ++pos;
    }
  }
  return out;
}

bool IsCjkCodepoint(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

bool IsWhitespaceCodepoint(uint32_t cp) {
  return cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r' || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool IsControlCodepoint(uint32_t cp) {
  if (cp == '\t' || cp == '\n' || cp == '\r') return false;
  return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0xAD || (cp >= 0x200B && cp <= 0x200F) ||
         (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2060 && cp <= 0x2064) || cp == 0xFEFF;
}

bool IsPunctuationCodepoint(uint32_t cp) {
  if ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
      (cp >= 123 && cp <= 126)) {
    return true;
  }
  if (cp == 0xA1 || cp == 0xA7 || cp == 0xAB || cp == 0xB6 || cp == 0xB7 || cp == 0xBB ||
      cp == 0xBF) {
    return true;
  }
  if (cp >= 0x2010 && cp <= 0x2027) return true;
  if (cp >= 0x2030 && cp <= 0x205E) return true;
  if (cp >= 0x3001 && cp <= 0x3003) return true;
  if (cp >= 0x3008 && cp <= 0x3011) return true;
  if (cp >= 0x3014 && cp <= 0x301F) return true;
  if (cp == 0x3030 || cp == 0x303D || cp == 0x30FB) return true;
  if ((cp >= 0xFF01 && cp <= 0xFF03) || (cp >= 0xFF05 && cp <= 0xFF0A) ||
      (cp >= 0xFF0C && cp <= 0xFF0F) || cp == 0xFF1A || cp == 0xFF1B || cp == 0xFF1F ||
      cp == 0xFF20 || (cp >= 0xFF3B && cp <= 0xFF3D) || cp == 0xFF3F || cp == 0xFF5B ||
      cp == 0xFF5D || (cp >= 0xFF5F && cp <= 0xFF65)) {
    return true;
  }
  if (cp >= 0xFE10 && cp <= 0xFE19) return true;
  if (cp >= 0xFE30 && cp <= 0xFE4F) return true;
  return false;
}

}  // namespace dgca
