// Seeded random edits of a file's bytes, the kinds that break parsers of
// binary and text files alike. Test-only; no dependencies beyond the
// standard library, so both the GoogleTest malformed-input tests
// (model/core/malformed_input_test.cc, through core_test_util.h) and the fuzz
// replay (tests/fuzz/replay_main.cc) use the same edits.
#ifndef DGCA_MODEL_CORE_MUTATE_BYTES_H_
#define DGCA_MODEL_CORE_MUTATE_BYTES_H_

#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <string>

namespace dgca {
namespace testutil {

// One to four edits of `s`: a flipped bit, an "interesting" byte (0, 0x7F,
// 0x80, 0xFF, a quote, a bracket, a tab, a newline), a 4- or 8-byte
// little-endian integer overwritten with 0, -1, INT32_MAX or 2^62, the file
// cut short, a chunk deleted or repeated, random bytes inserted, a token that
// text formats treat specially inserted (YAML's "---", "&a", "- ", a
// surrogate escape, a multi-byte character, a lone UTF-8 lead byte), a run of
// digits replaced by an odd number (1e308, NaN, 2^64, -0). Whatever comes
// out, a reader must return a value or an error naming the file, never crash.
inline std::string MutateBytes(std::string s, std::mt19937_64* rng) {
  auto pick = [&](size_t n) {
    return n == 0 ? size_t{0} : std::uniform_int_distribution<size_t>(0, n - 1)(*rng);
  };
  static const char kInteresting[] = {0, 0x7f, '\x80', '\xff', '"', '[', ']', '{', '}',
                                      ':', ',', '\t', '\n', ' ', '-', '9'};
  static const char* const kTokens[] = {
      "\n", "\r\n", ": ", "{", "}", "[", "]", "\"", "'", "\\", "#", "- ", "---", "...", "&a ", "*a",
      "!!str ", "|", ">", "%YAML 1.2\n", "null", "true", "~", "\\u0000", "\\ud800", "\xe4\xb8\xad",
      "\xf0\x9f\x98\x80", "\xc3", "\n  "};
  static const char* const kNumbers[] = {"0",      "-1",         "-0",         "1e308",
                                         "1e-320", "NaN",        "inf",        "2147483648",
                                         "4294967296", "18446744073709551616", "99999999999999999999999",
                                         "1.5"};
  const int edits = 1 + static_cast<int>(pick(4));
  for (int e = 0; e < edits; ++e) {
    switch (pick(10)) {
      case 0:
        if (!s.empty()) s[pick(s.size())] ^= static_cast<char>(1u << pick(8));
        break;
      case 1:
        if (!s.empty()) s[pick(s.size())] = kInteresting[pick(sizeof(kInteresting))];
        break;
      case 2: {
        const size_t width = pick(2) ? 4 : 8;
        if (s.size() < width) break;
        const uint64_t values[] = {0, ~uint64_t{0}, 0x7fffffffu, uint64_t{1} << 62};
        const uint64_t v = values[pick(4)];
        std::memcpy(&s[pick(s.size() - width + 1)], &v, width);  // little-endian hosts
        break;
      }
      case 3:
        s.resize(pick(s.size() + 1));
        break;
      case 4: {
        const size_t at = pick(s.size() + 1);
        s.erase(at, 1 + pick(64));
        break;
      }
      case 5: {
        const size_t at = pick(s.size() + 1);
        s.insert(at, s.substr(at, 1 + pick(64)));
        break;
      }
      case 6:
        s.insert(pick(s.size() + 1), kTokens[pick(std::size(kTokens))]);
        break;
      case 7: {
        const size_t d = s.find_first_of("0123456789", pick(s.size() + 1));
        if (d == std::string::npos) break;
        const size_t end = s.find_first_not_of("0123456789.", d);
        s.replace(d, (end == std::string::npos ? s.size() : end) - d, kNumbers[pick(std::size(kNumbers))]);
        break;
      }
      default: {
        std::string junk(1 + pick(8), '\0');
        for (char& c : junk) c = static_cast<char>(pick(256));
        s.insert(pick(s.size() + 1), junk);
        break;
      }
    }
  }
  return s;
}

}  // namespace testutil
}  // namespace dgca

#endif  // DGCA_MODEL_CORE_MUTATE_BYTES_H_
