// ClipTokenizer against a small hand-made vocab/merges pair whose ids we can compute by hand.
#include "pipeline/tokenizer/clip_tokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "testing/test_paths.h"

namespace qpool {
namespace {

using Ids = std::vector<int64_t>;

// Byte b's character in GPT-2's bytes_to_unicode, written independently of the library:
// the 188 printable bytes '!'..'~', 0xA1..0xAC, 0xAE..0xFF keep their code point; the other 68
// take U+0100, U+0101, ... in byte order.
std::string ByteChar(int b) {
  int cp = b;
  const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  if (!printable) {
    int n = 0;
    for (int k = 0; k < b; ++k) {
      if (!((k >= 0x21 && k <= 0x7E) || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE)) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

// Vocab ids as in CLIP's vocab: the 256 byte characters in the order printable ASCII (0..93),
// 0xA1..0xAC (94..105), 0xAE..0xFF (106..187), the rest (188..255); then the same with "</w>"
// (+256); then one id per merge result; then the specials.
std::vector<int> ByteOrder() {
  std::vector<int> order;
  for (int b = 0; b < 256; ++b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) order.push_back(b);
  }
  for (int b = 0; b < 256; ++b) {
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) order.push_back(b);
  }
  return order;
}

const std::vector<std::string> kMergeResults = {"he",     "ll", "hell",    "hello</w>",
                                                "wo",     "rl", "worl",    "world</w>",
                                                "'s</w>", "ca", "cat</w>", "zx"};  // ids 512..523
constexpr int64_t kBos = 524;
constexpr int64_t kEos = 525;

// Rank 11 ("x y</w>") makes "xy</w>", which is not in the vocab: the tokenizer must ignore it.
const char* const kMerges =
    "#version: 0.2\n"
    "h e\nl l\nhe ll\nhell o</w>\nw o\nr l\nwo rl\nworl d</w>\n' s</w>\nc a\nca t</w>\n"
    "x y</w>\nz x\n";

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

std::string VocabJson() {
  std::vector<std::string> tokens;
  for (int b : ByteOrder()) tokens.push_back(ByteChar(b));
  for (int b : ByteOrder()) tokens.push_back(ByteChar(b) + "</w>");
  for (const auto& m : kMergeResults) tokens.push_back(m);
  tokens.push_back("<|startoftext|>");
  tokens.push_back("<|endoftext|>");
  std::string json = "{";
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) json += ",\n";
    json += JsonString(tokens[i]) + ": " + std::to_string(i);
  }
  return json + "}";
}

class ClipTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("clip-tokenizer");
    vocab_ = dir_ + "/vocab.json";
    merges_ = dir_ + "/merges.txt";
    testing::WriteFile(vocab_, VocabJson());
    testing::WriteFile(merges_, kMerges);
    auto tok = ClipTokenizer::Load(vocab_, merges_);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tok_ = std::make_unique<ClipTokenizer>(std::move(tok).value());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_, vocab_, merges_;
  std::unique_ptr<ClipTokenizer> tok_;
};

TEST_F(ClipTokenizerTest, SpecialIdsAndSizes) {
  EXPECT_EQ(tok_->bos_id(), kBos);
  EXPECT_EQ(tok_->eos_id(), kEos);
  EXPECT_EQ(tok_->pad_id(), kEos);  // SD 1.x pads with <|endoftext|>
  EXPECT_EQ(tok_->max_length(), 77);
  EXPECT_EQ(tok_->vocab_size(), 526u);  // 512 byte tokens + 12 merges + 2 specials
}

TEST_F(ClipTokenizerTest, BpeMergesByRank) {
  // "hello": h e l l o</w> -> (h,e) rank 0 -> (l,l) rank 1 -> (he,ll) rank 2 -> (hell,o</w>) 3
  // = "hello</w>" id 515. "world" likewise via ranks 4..7 = "world</w>" id 519.
  EXPECT_EQ(tok_->Encode("hello world"), (Ids{515, 519}));
  // "cat" -> (c,a) rank 9, (ca,t</w>) rank 10 = 522.
  EXPECT_EQ(tok_->Encode("cat"), (Ids{522}));
}

TEST_F(ClipTokenizerTest, NormalizesCaseAndWhitespace) {
  // ","  = byte 44 -> id 44-33 = 11, with </w> 267; "!" = byte 33 -> 0, with </w> 256.
  EXPECT_EQ(tok_->Encode("  Hello,\t\n  WORLD! "), (Ids{515, 267, 519, 256}));
}

TEST_F(ClipTokenizerTest, UnmergedBytes) {
  // "it" -> i (105-33 = 72), t</w> (256 + 116-33 = 339).
  EXPECT_EQ(tok_->Encode("it"), (Ids{72, 339}));
  // Digits are one pre-token each: '2' -> 256 + 50-33 = 273, '0' -> 271, '4' -> 275.
  EXPECT_EQ(tok_->Encode("2024"), (Ids{273, 271, 273, 275}));
}

TEST_F(ClipTokenizerTest, Contractions) {
  // "cat's" -> "cat" + "'s"; "'s" = (', s</w>) rank 8 = 520.
  EXPECT_EQ(tok_->Encode("cat's"), (Ids{522, 520}));
  // "it'll" -> "it" + "'ll" = ' (39-33 = 6), l (108-33 = 75), l</w> (331); no merge of (l, l</w>).
  EXPECT_EQ(tok_->Encode("it'll"), (Ids{72, 339, 6, 75, 331}));
}

TEST_F(ClipTokenizerTest, NonAsciiBytes) {
  // "é" = C3 A9. 0xC3 is in 0xAE..0xFF -> 106 + (0xC3-0xAE) = 127; 0xA9 in 0xA1..0xAC ->
  // 94 + 8 = 102, with </w> 358. "É" lowercases to "é".
  EXPECT_EQ(tok_->Encode("é"), (Ids{127, 358}));
  EXPECT_EQ(tok_->Encode("É"), (Ids{127, 358}));
  // U+1F600 = F0 9F 98 80. F0 -> 106 + 66 = 172. 9F, 98, 80 are unprintable: 0x00..0x20 are
  // the first 33 of them, 0x7F is the 34th (n = 33), so 0x9F -> n = 65 -> id 188+65 = 253,
  // 0x98 -> n = 58 -> 246, 0x80 -> n = 34 -> 222, with </w> 478.
  EXPECT_EQ(tok_->Encode("\xF0\x9F\x98\x80"), (Ids{172, 253, 246, 478}));
}

TEST_F(ClipTokenizerTest, IgnoresMergesOutsideVocab) {
  // z x y</w>: (x, y</w>) has rank 11 but "xy</w>" is not in the vocab, so (z,x) rank 12 wins:
  // "zx" (523), then y</w> (256 + 121-33 = 344).
  EXPECT_EQ(tok_->Encode("zxy"), (Ids{523, 344}));
}

TEST_F(ClipTokenizerTest, SpecialTokensInText) {
  EXPECT_EQ(tok_->Encode("hello <|endoftext|>"), (Ids{515, kEos}));
}

TEST_F(ClipTokenizerTest, EncodePaddedAddsBosEosAndPads) {
  const Ids ids = tok_->EncodePadded("Hello World");
  ASSERT_EQ(ids.size(), 77u);
  EXPECT_EQ(ids[0], kBos);
  EXPECT_EQ(ids[1], 515);
  EXPECT_EQ(ids[2], 519);
  EXPECT_EQ(ids[3], kEos);
  for (size_t i = 4; i < ids.size(); ++i) EXPECT_EQ(ids[i], kEos) << i;
}

TEST_F(ClipTokenizerTest, EmptyPromptIsBosEosPad) {
  for (const std::string& prompt : {std::string(), std::string("   \t\n ")}) {
    const Ids ids = tok_->EncodePadded(prompt);
    ASSERT_EQ(ids.size(), 77u);
    EXPECT_EQ(ids[0], kBos);
    for (size_t i = 1; i < ids.size(); ++i) EXPECT_EQ(ids[i], kEos);
    EXPECT_TRUE(tok_->Encode(prompt).empty());
    EXPECT_EQ(tok_->Decode(ids), "");
  }
}

TEST_F(ClipTokenizerTest, TruncationKeepsBosAndEos) {
  std::string prompt;
  for (int i = 0; i < 100; ++i) prompt += "hello ";
  EXPECT_EQ(tok_->Encode(prompt).size(), 100u);
  const Ids ids = tok_->EncodePadded(prompt);
  ASSERT_EQ(ids.size(), 77u);
  EXPECT_EQ(ids.front(), kBos);
  for (size_t i = 1; i < 76; ++i) EXPECT_EQ(ids[i], 515) << i;
  EXPECT_EQ(ids.back(), kEos);
}

TEST_F(ClipTokenizerTest, CustomMaxLength) {
  auto tok = ClipTokenizer::Load(vocab_, merges_, 4);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(tok->EncodePadded("hello world cat"), (Ids{kBos, 515, 519, kEos}));
  EXPECT_EQ(tok->EncodePadded("cat"), (Ids{kBos, 522, kEos, kEos}));
}

// SD 2.x's OpenCLIP tokenizer pads with "!" (its id 0 in the real vocabulary) instead of EOS.
TEST_F(ClipTokenizerTest, PadsWithTheConfiguredToken) {
  auto tok = ClipTokenizer::Load(vocab_, merges_, 5, "!");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  // The vocabulary's "!" (id 0 here, as in OpenCLIP's), not "!</w>", the word a prompt's "!"
  // becomes.
  const int64_t bang = 0;
  EXPECT_EQ(tok->pad_id(), bang);
  auto plain = ClipTokenizer::Load(vocab_, merges_, 5);
  ASSERT_TRUE(plain.ok());
  EXPECT_NE(plain->Encode("!").at(0), bang);
  EXPECT_EQ(tok->EncodePadded("cat"), (Ids{kBos, 522, kEos, bang, bang}));
  // ... and a special token in prompts (Note [Pad token in prompts]).
  EXPECT_EQ(tok->Encode("cat!!"), (Ids{522, bang, bang}));
  auto missing = ClipTokenizer::Load(vocab_, merges_, 5, "<|pad|>");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("lacks the pad token '<|pad|>'"), std::string::npos)
      << missing.status().message();
}

TEST_F(ClipTokenizerTest, RoundTripsToNormalizedText) {
  // CLIP marks word ends, so Decode yields the pre-tokens joined by spaces.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"Hello World", "hello world"},
      {"  a  photo\tof\n a CAT  ", "a photo of a cat"},
      {"Hello, world!!", "hello , world !!"},
      {"It's 2024", "it 's 2 0 2 4"},
      {"don't they're we've I'm you'll he'd", "don 't they 're we 've i 'm you 'll he 'd"},
      {"(best quality), 8k; masterpiece...", "( best quality ), 8 k ; masterpiece ..."},
      {"Café Über STRASSE", "café über strasse"},
      {"ΑΒΓ δέλτα", "αβγ δέλτα"},
      {"Привет Мир", "привет мир"},
      {"漢字テスト", "漢字テスト"},
      {"I \xE2\x9D\xA4\xEF\xB8\x8F \xF0\x9F\x8D\x95!",
       "i \xE2\x9D\xA4\xEF\xB8\x8F \xF0\x9F\x8D\x95!"},
      {"e\xCC\x81", "e \xCC\x81"},                   // combining acute is not a letter
      {"x\xC2\xB2\xC2\xBD", "x \xC2\xB2 \xC2\xBD"},  // "²" and "½" are \p{N}
  };
  for (const auto& [input, normalized] : cases) {
    EXPECT_EQ(tok_->Decode(tok_->Encode(input)), normalized) << input;
    EXPECT_EQ(tok_->Decode(tok_->EncodePadded(input)), normalized) << input;
  }
}

TEST_F(ClipTokenizerTest, InvalidUtf8DoesNotCrash) {
  // Each bad byte becomes U+FFFD (EF BF BD), a non-letter run between the two words.
  const std::string bad =
      "ab\xFF\xFE"
      "cd \xC3";
  const Ids ids = tok_->Encode(bad);
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(tok_->Decode(ids), "ab \xEF\xBF\xBD\xEF\xBF\xBD cd \xEF\xBF\xBD");
}

TEST_F(ClipTokenizerTest, DecodeSkipsUnknownIds) {
  EXPECT_EQ(tok_->Decode({kBos, 515, 99999, -3, 519, kEos}), "hello world");
}

TEST_F(ClipTokenizerTest, ConcurrentEncodeAgrees) {
  const std::string prompt = "Hello world, a cat's 2024 photo of é";
  const Ids expected = tok_->Encode(prompt);
  std::vector<std::thread> threads;
  std::vector<bool> same(4, false);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      bool ok = true;
      for (int i = 0; i < 200; ++i) ok = ok && tok_->Encode(prompt) == expected;
      same[t] = ok;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_TRUE(same[t]) << t;
}

TEST_F(ClipTokenizerTest, MissingFilesAreNamed) {
  auto no_vocab = ClipTokenizer::Load(dir_ + "/nope.json", merges_);
  ASSERT_FALSE(no_vocab.ok());
  EXPECT_EQ(no_vocab.status().code(), StatusCode::kNotFound);
  EXPECT_NE(no_vocab.status().message().find(dir_ + "/nope.json"), std::string::npos);

  auto no_merges = ClipTokenizer::Load(vocab_, dir_ + "/nope.txt");
  ASSERT_FALSE(no_merges.ok());
  EXPECT_EQ(no_merges.status().code(), StatusCode::kNotFound);
  EXPECT_NE(no_merges.status().message().find(dir_ + "/nope.txt"), std::string::npos);
}

TEST_F(ClipTokenizerTest, CorruptFilesAreNamed) {
  const std::string bad_json = dir_ + "/bad.json";
  testing::WriteFile(bad_json, "{\"a\": 1, ");
  auto s1 = ClipTokenizer::Load(bad_json, merges_);
  ASSERT_FALSE(s1.ok());
  EXPECT_EQ(s1.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s1.status().message().find(bad_json), std::string::npos);

  const std::string no_specials = dir_ + "/nospecial.json";
  testing::WriteFile(no_specials, "{\"a\": 0, \"a</w>\": 1}");
  auto s2 = ClipTokenizer::Load(no_specials, merges_);
  ASSERT_FALSE(s2.ok());
  EXPECT_NE(s2.status().message().find("<|startoftext|>"), std::string::npos);
  EXPECT_NE(s2.status().message().find(no_specials), std::string::npos);

  const std::string bad_id = dir_ + "/badid.json";
  testing::WriteFile(bad_id, "{\"a\": \"zero\"}");
  auto s3 = ClipTokenizer::Load(bad_id, merges_);
  ASSERT_FALSE(s3.ok());
  EXPECT_NE(s3.status().message().find(bad_id), std::string::npos);

  const std::string bad_merges = dir_ + "/bad_merges.txt";
  testing::WriteFile(bad_merges, "#version: 0.2\nh e\nthree symbols here\n");
  auto s4 = ClipTokenizer::Load(vocab_, bad_merges);
  ASSERT_FALSE(s4.ok());
  EXPECT_EQ(s4.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s4.status().message().find(bad_merges), std::string::npos);
  EXPECT_NE(s4.status().message().find("line 3"), std::string::npos);

  auto s5 = ClipTokenizer::Load(vocab_, merges_, 1);
  ASSERT_FALSE(s5.ok());
  EXPECT_EQ(s5.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ClipTokenizerTest, MergesWithoutVersionHeader) {
  const std::string plain = dir_ + "/plain_merges.txt";
  testing::WriteFile(plain, std::string(kMerges).substr(std::string("#version: 0.2\n").size()));
  auto tok = ClipTokenizer::Load(vocab_, plain);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ(tok->Encode("hello world cat's"), (Ids{515, 519, 522, 520}));
}

// The real SD 1.x tokenizer files, when QPOOL_CLIP_TOKENIZER_DIR points at a folder holding
// vocab.json and merges.txt (e.g. a diffusers snapshot's tokenizer/ folder).
TEST(ClipTokenizerRealFiles, KnownPrompt) {
  const char* dir = std::getenv("QPOOL_CLIP_TOKENIZER_DIR");
  if (dir == nullptr) GTEST_SKIP() << "set QPOOL_CLIP_TOKENIZER_DIR to run against real CLIP files";
  auto tok =
      ClipTokenizer::Load(std::string(dir) + "/vocab.json", std::string(dir) + "/merges.txt");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ(tok->vocab_size(), 49408u);
  EXPECT_EQ(tok->bos_id(), 49406);
  EXPECT_EQ(tok->eos_id(), 49407);
  EXPECT_EQ(tok->Encode("a photo of a cat"), (Ids{320, 1125, 539, 320, 2368}));
  EXPECT_EQ(tok->Decode(tok->EncodePadded("A photo of a CAT")), "a photo of a cat");
}

}  // namespace
}  // namespace qpool
