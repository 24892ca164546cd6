// BpeTokenizer (Note [Byte-level BPE from tokenizer.json]) against transformers'
// PreTrainedTokenizerFast: tokenizers shaped like Llama 3's, Qwen2's (with its NFC normalizer and
// without) and GPT-2's, trained here by
// tests/testing/bpe_reference.py, on prompts with Unicode, emoji, special tokens, whitespace
// runs and long input; then the tokenizer.json contents it refuses, each named.
#include "pipeline/tokenizer/bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "testing/test_paths.h"
#include "util/log.h"

namespace qpool {
namespace {

using Json = nlohmann::json;

class BpeTokenizerTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::MakeTempDir("bpe-reference"));
    const std::string command = StrCat("'", QPOOL_TEST_PYTHON, "' '", testing::SourceDir(),
                                       "/tests/testing/bpe_reference.py' '", *dir_, "'");
    status_ = std::system(command.c_str());
  }
  static void TearDownTestSuite() {
    testing::RemoveTree(*dir_);
    delete dir_;
  }
  static std::string* dir_;
  static int status_;
};
std::string* BpeTokenizerTest::dir_ = nullptr;
int BpeTokenizerTest::status_ = -1;

TEST_P(BpeTokenizerTest, IdsEqualTransformers) {
  ASSERT_EQ(status_, 0) << "tests/testing/bpe_reference.py failed (needs tokenizers and "
                           "transformers in .venv)";
  const std::string folder = *dir_ + "/" + GetParam();
  auto tokenizer = BpeTokenizer::Load(folder + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  std::ifstream in(folder + "/cases.json");
  std::stringstream text;
  text << in.rdbuf();
  const Json reference = Json::parse(text.str());
  const int max_length = reference["max_length"].get<int>();
  const int64_t pad_id = reference["pad_id"].get<int64_t>();
  ASSERT_GE(reference["cases"].size(), 10u);
  for (const Json& c : reference["cases"]) {
    const std::string prompt = c["text"].get<std::string>();
    const std::string shown = prompt.substr(0, 80);
    EXPECT_EQ((*tokenizer)->Encode(prompt), c["ids"].get<std::vector<int64_t>>()) << shown;
    EXPECT_EQ((*tokenizer)->Encode(prompt, /*add_special_tokens=*/false),
              c["plain"].get<std::vector<int64_t>>())
        << shown;
    std::vector<int64_t> mask;
    EXPECT_EQ((*tokenizer)->EncodePadded(prompt, max_length, pad_id, &mask),
              c["padded"].get<std::vector<int64_t>>())
        << shown;
    EXPECT_EQ(mask, c["mask"].get<std::vector<int64_t>>()) << shown;
  }
  EXPECT_EQ((*tokenizer)->TokenId("<|end_of_text|>"), pad_id);
  EXPECT_EQ((*tokenizer)->TokenId("no such token"), -1);
}

INSTANTIATE_TEST_SUITE_P(Shapes, BpeTokenizerTest,
                         ::testing::Values("llama3", "qwen2", "qwen2-no-normalizer", "gpt2"));

// A minimal tokenizer.json: byte-level alphabet "a", "b", merge "a b", the fields under test
// replaced by `edit`.
std::string Minimal(const std::function<void(Json&)>& edit) {
  Json j = {
      {"added_tokens", Json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"model",
       {{"type", "BPE"},
        {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}},
        {"merges", Json::array({"a b"})}}}};
  edit(j);
  return j.dump();
}

TEST(BpeTokenizerRefusals, NameTheFieldTheyCannotFollow) {
  auto refused = [](const std::string& json, const std::string& field) {
    auto t = BpeTokenizer::Parse(json, "tok.json");
    ASSERT_FALSE(t.ok()) << field;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find("tok.json: " + field), std::string::npos)
        << t.status().message();
  };
  ASSERT_TRUE(BpeTokenizer::Parse(Minimal([](Json&) {}), "tok.json").ok());
  EXPECT_EQ((*BpeTokenizer::Parse(Minimal([](Json&) {}), "tok.json"))->Encode("ab"),
            std::vector<int64_t>{2});
  refused("{", "");
  // A field of another type than the one read threw out of the parse (found by
  // fuzz_bpe_tokenizer).
  refused(Minimal([](Json& j) { j["pre_tokenizer"]["type"] = true; }),
          "a field has an unexpected type");
  refused(Minimal([](Json& j) { j["model"]["type"] = 7; }), "a field has an unexpected type");
  refused(Minimal([](Json& j) { j["model"]["type"] = "Unigram"; }), "'model.type'");
  refused(Minimal([](Json& j) { j["model"]["byte_fallback"] = true; }), "'model.byte_fallback'");
  refused(Minimal([](Json& j) { j["model"]["dropout"] = 0.1; }), "'model.dropout'");
  refused(Minimal([](Json& j) { j["model"]["vocab"]["c"] = -1; }), "'model.vocab' entry 'c'");
  refused(Minimal([](Json& j) { j["model"]["merges"] = Json::array({"a c"}); }),
          "'model.merges[0]'");
  refused(Minimal([](Json& j) { j["model"]["merges"] = Json::array({"a b c"}); }),
          "'model.merges[0]'");
  refused(Minimal([](Json& j) { j["normalizer"] = {{"type", "NFKC"}}; }), "'normalizer'");
  refused(Minimal([](Json& j) { j["pre_tokenizer"]["add_prefix_space"] = true; }),
          "'pre_tokenizer'.add_prefix_space");
  refused(Minimal([](Json& j) {
            j["pre_tokenizer"] = {{"type", "Whitespace"}};
          }),
          "'pre_tokenizer'");
  refused(Minimal([](Json& j) {
            j["pre_tokenizer"] = {
                {"type", "Sequence"},
                {"pretokenizers", Json::array({Json{{"type", "Split"},
                                                    {"pattern", {{"Regex", "(unclosed"}}},
                                                    {"behavior", "Isolated"},
                                                    {"invert", false}},
                                               Json{{"type", "ByteLevel"},
                                                    {"add_prefix_space", false},
                                                    {"use_regex", false}}})}};
          }),
          "'pre_tokenizer' regex does not compile");
  refused(Minimal([](Json& j) {
            j["added_tokens"] =
                Json::array({Json{{"id", 3}, {"content", "<x>"}, {"single_word", true}}});
          }),
          "'added_tokens[0]'");
  refused(Minimal([](Json& j) {
            j["post_processor"] = {
                {"type", "TemplateProcessing"},
                {"single", Json::array({Json{{"SpecialToken", {{"id", "<s>"}}}}})},
                {"special_tokens", Json::object()}};
          }),
          "'post_processor.single'");
  EXPECT_EQ(BpeTokenizer::Load("/nonexistent/tokenizer.json").status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace qpool
