// UTF-8 <-> code points and GPT-2's byte-to-character table, for the CLIP tokenizer; torch-free.
#pragma once

#include <array>
#include <string>

namespace qpool {

// U+FFFD, what DecodeUtf8 yields for each byte it cannot decode.
inline constexpr char32_t kUtf8Replacement = 0xFFFD;

// Code points of `s`. Never fails: each byte that does not start a valid sequence (bad lead or
// continuation byte, truncated, overlong, surrogate, past U+10FFFF) becomes one kUtf8Replacement.
std::u32string DecodeUtf8(const std::string& s);
// Appends the UTF-8 bytes of `cp` (<= U+10FFFF) to `out`.
void AppendUtf8(char32_t cp, std::string* out);
// UTF-8 of code points (each <= U+10FFFF).
std::string EncodeUtf8(const std::u32string& s);
// `s` with invalid UTF-8 (e.g. a character cut by truncation) replaced as DecodeUtf8 does.
std::string SanitizeUtf8(const std::string& s);

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order, so every byte is one printable, non-space character.
struct ByteTable {
  std::array<std::string, 256> symbol;  // byte -> UTF-8 of its character
  std::array<int, 512> byte_of;         // character (< 512) -> byte, -1 if none
};
// The table, built once; thread-safe.
const ByteTable& ByteToUnicode();

}  // namespace qpool
