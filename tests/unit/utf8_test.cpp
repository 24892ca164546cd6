// DecodeUtf8 / EncodeUtf8 / SanitizeUtf8 against hand-written byte sequences, and the GPT-2
// byte-to-character table against its definition.
#include "pipeline/tokenizer/utf8.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>

namespace qpool {
namespace {

TEST(Utf8Test, DecodesEveryLength) {
  // "a", "é" (C3 A9), "€" (E2 82 AC), "😀" (F0 9F 98 80).
  EXPECT_EQ(DecodeUtf8("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"),
            (std::u32string{U'a', 0xE9, 0x20AC, 0x1F600}));
  EXPECT_EQ(DecodeUtf8(""), std::u32string());
  EXPECT_EQ(DecodeUtf8(std::string("a\0b", 3)), (std::u32string{U'a', 0, U'b'}));
}

TEST(Utf8Test, EncodesEveryLength) {
  EXPECT_EQ(EncodeUtf8({0x7F}), "\x7F");
  EXPECT_EQ(EncodeUtf8({0x80}), "\xC2\x80");
  EXPECT_EQ(EncodeUtf8({0x7FF}), "\xDF\xBF");
  EXPECT_EQ(EncodeUtf8({0x800}), "\xE0\xA0\x80");
  EXPECT_EQ(EncodeUtf8({0xFFFF}), "\xEF\xBF\xBF");
  EXPECT_EQ(EncodeUtf8({0x10000}), "\xF0\x90\x80\x80");
  EXPECT_EQ(EncodeUtf8({0x10FFFF}), "\xF4\x8F\xBF\xBF");
  std::string out = "x";
  AppendUtf8(0xE9, &out);
  EXPECT_EQ(out, "x\xC3\xA9");
}

TEST(Utf8Test, RoundTripsValidCodePoints) {
  for (char32_t cp = 0; cp <= 0x10FFFF; cp += (cp < 0x3000 ? 1 : 97)) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;  // surrogates are not scalar values
    const std::u32string one(1, cp);
    ASSERT_EQ(DecodeUtf8(EncodeUtf8(one)), one) << std::hex << static_cast<uint32_t>(cp);
  }
}

TEST(Utf8Test, EachBadByteBecomesOneReplacement) {
  constexpr char32_t R = kUtf8Replacement;
  EXPECT_EQ(R, char32_t{0xFFFD});
  // Lone continuation bytes and bytes that never start a sequence.
  EXPECT_EQ(DecodeUtf8("\x80\xBF\xFE\xFF"), (std::u32string{R, R, R, R}));
  // Truncated sequences: the lead byte is replaced, what follows decodes on its own.
  EXPECT_EQ(DecodeUtf8("\xC3"), (std::u32string{R}));
  EXPECT_EQ(DecodeUtf8("\xE2\x82"), (std::u32string{R, R}));
  EXPECT_EQ(DecodeUtf8("\xE2\x82z"), (std::u32string{R, R, U'z'}));
  // A lead byte followed by a non-continuation byte.
  EXPECT_EQ(DecodeUtf8("\xC3("), (std::u32string{R, U'('}));
  // Overlong forms of "/" (C0 AF, E0 80 AF) and of U+FFFF in four bytes (F0 8F BF BF).
  EXPECT_EQ(DecodeUtf8("\xC0\xAF"), (std::u32string{R, R}));
  EXPECT_EQ(DecodeUtf8("\xE0\x80\xAF"), (std::u32string{R, R, R}));
  EXPECT_EQ(DecodeUtf8("\xF0\x8F\xBF\xBF"), (std::u32string{R, R, R, R}));
  // A surrogate (ED A0 80 = U+D800) and past U+10FFFF (F4 90 80 80, F5 ...).
  EXPECT_EQ(DecodeUtf8("\xED\xA0\x80"), (std::u32string{R, R, R}));
  EXPECT_EQ(DecodeUtf8("\xF4\x90\x80\x80"), (std::u32string{R, R, R, R}));
  EXPECT_EQ(DecodeUtf8("\xF5\x80"), (std::u32string{R, R}));
}

TEST(Utf8Test, SanitizeKeepsValidTextAndReplacesTheRest) {
  const std::string valid = "caf\xC3\xA9 \xE6\xBC\xA2 \xF0\x9F\x8D\x95";
  EXPECT_EQ(SanitizeUtf8(valid), valid);
  // A character cut by truncation ("€" without its last byte).
  EXPECT_EQ(SanitizeUtf8("ab\xE2\x82"), "ab\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(SanitizeUtf8("\xFFx"), "\xEF\xBF\xBDx");
}

TEST(Utf8Test, ByteTableIsGpt2BytesToUnicode) {
  const ByteTable& table = ByteToUnicode();
  EXPECT_EQ(&table, &ByteToUnicode());  // built once
  // Printable bytes keep their code point; the others take U+0100, U+0101, ... in byte order.
  EXPECT_EQ(table.symbol['a'], "a");
  EXPECT_EQ(table.symbol['!'], "!");
  EXPECT_EQ(table.symbol[0xE9], "\xC3\xA9");  // é
  EXPECT_EQ(table.symbol[0x00], "\xC4\x80");  // U+0100
  EXPECT_EQ(table.symbol[' '], "\xC4\xA0");   // U+0120, "Ġ": 0x00..0x20 are the first 33
  EXPECT_EQ(table.symbol[0x7F], "\xC4\xA1");  // U+0121
  EXPECT_EQ(table.symbol[0xAD], "\xC5\x83");  // U+0143, the 68th and last
  std::set<std::string> seen;
  for (int b = 0; b < 256; ++b) {
    const std::u32string chars = DecodeUtf8(table.symbol[b]);
    ASSERT_EQ(chars.size(), 1u) << b;
    ASSERT_LT(chars[0], 512u) << b;
    EXPECT_EQ(table.byte_of[chars[0]], b) << b;  // byte_of inverts symbol
    seen.insert(table.symbol[b]);
  }
  EXPECT_EQ(seen.size(), 256u);  // one distinct character per byte
  int mapped = 0;
  for (int v : table.byte_of) mapped += v >= 0 ? 1 : 0;
  EXPECT_EQ(mapped, 256);
  EXPECT_EQ(table.byte_of[0x100 + 68], -1);
}

}  // namespace
}  // namespace qpool
