// UTF-8 helpers shared by the tokenizer, the ECSpell reader and the corpus
// synthesizer. Strict decoding: overlong forms, surrogates and code points
// above U+10FFFF are invalid.
//
// Thread-safety: free functions, no state.
#ifndef DGCA_MODEL_CORE_UTF8_H_
#define DGCA_MODEL_CORE_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dgca {

// Decodes the code point at s[*pos] and advances *pos. Returns false (and
// leaves *pos unchanged) when the bytes there are not valid UTF-8.
bool DecodeUtf8(std::string_view s, size_t* pos, uint32_t* cp);

// Byte offset of the first invalid sequence, or std::string_view::npos.
size_t FindInvalidUtf8(std::string_view s);

void AppendUtf8(uint32_t cp, std::string* out);

// The code points of a valid UTF-8 string (invalid bytes become U+FFFD).
std::vector<uint32_t> Utf8ToCodepoints(std::string_view s);

// Unicode character classes used by BERT's BasicTokenizer.
bool IsCjkCodepoint(uint32_t cp);        // BERT's _is_chinese_char ranges
bool IsWhitespaceCodepoint(uint32_t cp); // space, \t, \n, \r and category Zs
bool IsControlCodepoint(uint32_t cp);    // categories Cc/Cf except \t \n \r
// ASCII non-alphanumerics plus the common Unicode punctuation blocks (Latin-1
// punctuation, General Punctuation, CJK Symbols and Punctuation, full-width
// and half-width forms). An approximation of category P* without tables.
bool IsPunctuationCodepoint(uint32_t cp);

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_UTF8_H_
