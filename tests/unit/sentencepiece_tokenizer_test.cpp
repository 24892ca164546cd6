// SentencePieceTokenizer: T5's tokenizer over a small SentencePiece model trained here (the
// parity of its ids with transformers' T5TokenizerFast is checked by the FLUX import tests).
#include "pipeline/tokenizer/sentencepiece_tokenizer.h"

#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "testing/test_paths.h"

namespace qpool {
namespace {

namespace fs = std::filesystem;

class SentencePieceTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::MakeTempDir("spm"));
    std::string corpus;
    for (int i = 0; i < 200; ++i) {
      corpus += "a photo of a cat number " + std::to_string(i) +
                " sitting on a red chair in the garden\nan astronaut riding a horse on mars\n";
    }
    testing::WriteFile(*dir_ + "/corpus.txt", corpus);
    // T5's conventions: <pad> 0, </s> 1, <unk> 2, no <s>.
    const auto status = sentencepiece::SentencePieceTrainer::Train(
        "--input=" + *dir_ + "/corpus.txt --model_prefix=" + *dir_ +
        "/spiece --vocab_size=40 --model_type=unigram --pad_id=0 --eos_id=1 --unk_id=2 "
        "--bos_id=-1 --minloglevel=2");
    ASSERT_TRUE(status.ok()) << status.ToString();
    const auto no_pad = sentencepiece::SentencePieceTrainer::Train(
        "--input=" + *dir_ + "/corpus.txt --model_prefix=" + *dir_ +
        "/nopad --vocab_size=40 --model_type=unigram --pad_id=-1 --eos_id=1 --unk_id=0 "
        "--bos_id=-1 --minloglevel=2");
    ASSERT_TRUE(no_pad.ok()) << no_pad.ToString();
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static std::string Model() { return *dir_ + "/spiece.model"; }

  static std::string* dir_;
};
std::string* SentencePieceTokenizerTest::dir_ = nullptr;

TEST_F(SentencePieceTokenizerTest, PadsTruncatesAndEndsWithEos) {
  auto t = SentencePieceTokenizer::Load(Model(), 8);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->eos_id(), 1);
  EXPECT_EQ(t->pad_id(), 0);
  EXPECT_EQ(t->vocab_size(), 40u);
  const std::vector<int64_t> pieces = t->Encode("a cat");
  ASSERT_FALSE(pieces.empty());
  ASSERT_LT(pieces.size(), 7u);
  std::vector<int64_t> want = pieces;
  want.push_back(1);
  want.resize(8, 0);
  EXPECT_EQ(t->EncodePadded("a cat"), want);
  // An empty prompt is </s> and padding.
  EXPECT_EQ(t->EncodePadded(""), (std::vector<int64_t>{1, 0, 0, 0, 0, 0, 0, 0}));
  // A long prompt keeps max_length - 1 pieces, then </s>.
  std::string longer;
  for (int i = 0; i < 20; ++i) longer += "an astronaut riding a horse ";
  const std::vector<int64_t> ids = t->EncodePadded(longer);
  ASSERT_EQ(ids.size(), 8u);
  EXPECT_EQ(ids.back(), 1);
  const std::vector<int64_t> all = t->Encode(longer);
  ASSERT_GT(all.size(), 7u);
  EXPECT_EQ(std::vector<int64_t>(ids.begin(), ids.end() - 1),
            std::vector<int64_t>(all.begin(), all.begin() + 7));
}

TEST_F(SentencePieceTokenizerTest, InvalidUtf8AndUnknownTextStillEncode) {
  auto t = SentencePieceTokenizer::Load(Model(), 16);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const std::vector<int64_t> ids = t->EncodePadded(std::string("cat \xff\xfe \xe2\x82 日本"));
  ASSERT_EQ(ids.size(), 16u);
  for (int64_t id : ids) EXPECT_LT(id, 40);
  EXPECT_NE(std::find(ids.begin(), ids.end(), 2), ids.end());  // <unk> for unseen characters
}

// T5TokenizerFast's added tokens (Note [T5 tokenization]): single ids, the text between them
// encoded part by part.
TEST_F(SentencePieceTokenizerTest, AddedTokensAreSingleIds) {
  auto t = SentencePieceTokenizer::Load(Model(), 64);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const auto concat = [](std::vector<std::vector<int64_t>> parts) {
    std::vector<int64_t> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  };
  const std::vector<int64_t> a = t->Encode("a photo"), b = t->Encode("of a cat");
  EXPECT_EQ(t->Encode("a photo </s> of a cat"), concat({a, {1}, b}));
  EXPECT_EQ(t->Encode("a photo<pad>of a cat<unk>"), concat({a, {0}, b, {2}}));
  // Sentinels follow the 40 pieces in reverse: <extra_id_0> is 139, <extra_id_99> 40.
  EXPECT_EQ(t->Encode("<extra_id_0>a photo<extra_id_99>"), concat({{139}, a, {40}}));
  EXPECT_EQ(t->Encode("</s></s>"), (std::vector<int64_t>{1, 1}));
  // Not added tokens: ordinary text, as SentencePiece alone encodes it.
  for (const char* text : {"<extra_id_100>", "<extra_id_07>", "<extra_id_>", "<extra_id_5", "</S>",
                           "<s>", "<", "a <pad"}) {
    const std::vector<int64_t> ids = t->Encode(text);
    for (int64_t id : ids) EXPECT_LT(id, 40) << text;
    EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 0) << text;
  }
  // Padded: the added tokens count toward max_length like pieces.
  std::vector<int64_t> mask;
  const std::vector<int64_t> padded = t->EncodePadded("</s>", &mask);
  EXPECT_EQ(std::vector<int64_t>(padded.begin(), padded.begin() + 3),
            (std::vector<int64_t>{1, 1, 0}));
  // The mask covers the ids before the padding, a <pad> written in the prompt among them.
  std::vector<int64_t> two(t->max_length(), 0);
  two[0] = two[1] = 1;
  EXPECT_EQ(mask, two);
  const std::vector<int64_t> written = t->EncodePadded("<pad>", &mask);
  EXPECT_EQ(std::vector<int64_t>(written.begin(), written.begin() + 2),
            (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(mask, two);
}

TEST_F(SentencePieceTokenizerTest, BadFilesAreNamed) {
  auto missing = SentencePieceTokenizer::Load(*dir_ + "/nope.model", 8);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.model"), std::string::npos);

  testing::WriteFile(*dir_ + "/garbage.model", std::string("\x08\x96\x01not a model", 14));
  auto garbage = SentencePieceTokenizer::Load(*dir_ + "/garbage.model", 8);
  ASSERT_FALSE(garbage.ok());
  EXPECT_EQ(garbage.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(garbage.status().message().find("garbage.model: not a SentencePiece model"),
            std::string::npos)
      << garbage.status().message();

  auto no_pad = SentencePieceTokenizer::Load(*dir_ + "/nopad.model", 8);
  ASSERT_FALSE(no_pad.ok());
  EXPECT_NE(no_pad.status().message().find("no pad piece"), std::string::npos)
      << no_pad.status().message();

  auto short_length = SentencePieceTokenizer::Load(Model(), 1);
  EXPECT_EQ(short_length.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace qpool
