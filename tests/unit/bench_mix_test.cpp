// `qpool bench --mix FILE`: the fields of an entry, JSON as well as YAML, and bad files refused
// with a message naming the file, the line and what to change.
#include "bench_mix.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "testing/test_paths.h"

namespace qpool::cli {
namespace {

// The error of a mix that must not parse.
std::string ErrorOf(const std::string& text) {
  const MixResult r = ParseMix(text, "mix.yaml");
  EXPECT_TRUE(r.templates.empty());
  EXPECT_FALSE(r.error.empty()) << "accepted:\n" << text;
  return r.error;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(BenchMix, YamlEntriesWithEveryField) {
  const MixResult r = ParseMix(R"(
- name: small
  weight: 3
  pipeline: sd15
  prompts: ["a fox", "a lighthouse"]
  negative: blurry
  steps: 20
  width: 512
  height: 256
  guidance: 7.5
  batch: 2
  seed: 42
  scheduler: euler
  deadline: 1.5
- pipeline: sd15
)",
                               "mix.yaml");
  ASSERT_TRUE(r.error.empty()) << r.error;
  ASSERT_EQ(r.templates.size(), 2u);
  const RequestTemplate& t = r.templates[0];
  EXPECT_EQ(t.name, "small");
  EXPECT_EQ(t.weight, 3);
  EXPECT_EQ(t.pipeline, "sd15");
  EXPECT_EQ(t.prompts, (std::vector<std::string>{"a fox", "a lighthouse"}));
  EXPECT_EQ(t.negative_prompt, "blurry");
  EXPECT_EQ(t.steps, 20u);
  EXPECT_EQ(t.width, 512u);
  EXPECT_EQ(t.height, 256u);
  EXPECT_EQ(t.guidance, 7.5);
  EXPECT_EQ(t.num_images, 2u);
  EXPECT_EQ(t.seed, 42u);
  EXPECT_EQ(t.scheduler, "euler");
  EXPECT_EQ(t.deadline_seconds, 1.5);
  // Defaults: named after the pipeline, weight 1, the built-in prompts, the server's defaults.
  const RequestTemplate& d = r.templates[1];
  EXPECT_EQ(d.name, "sd15");
  EXPECT_EQ(d.weight, 1);
  EXPECT_EQ(d.prompts, DefaultPrompts());
  EXPECT_FALSE(d.steps || d.width || d.seed || d.deadline_seconds || d.guidance);
}

TEST(BenchMix, UnnamedEntriesOfOnePipelineAreNumbered) {
  const MixResult r = ParseMix("- pipeline: a\n- pipeline: a\n- pipeline: a\n", "mix.yaml");
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.templates[0].name, "a");
  EXPECT_EQ(r.templates[1].name, "a#2");
  EXPECT_EQ(r.templates[2].name, "a#3");
}

TEST(BenchMix, JsonIsAcceptedToo) {
  const MixResult r = ParseMix(
      R"([{"pipeline": "tiny", "prompt": "x", "num_images": 2, "weight": 0.5},
          {"name": "other", "pipeline": "tiny", "steps": 4}])",
      "mix.json");
  ASSERT_TRUE(r.error.empty()) << r.error;
  ASSERT_EQ(r.templates.size(), 2u);
  EXPECT_EQ(r.templates[0].prompts, std::vector<std::string>{"x"});
  EXPECT_EQ(r.templates[0].num_images, 2u);
  EXPECT_EQ(r.templates[0].weight, 0.5);
  EXPECT_EQ(r.templates[1].name, "other");
}

TEST(BenchMix, BadFilesNameTheLineAndTheFix) {
  EXPECT_TRUE(Contains(ErrorOf(""), "non-empty list of request templates"));
  EXPECT_TRUE(Contains(ErrorOf("pipeline: tiny\n"), "non-empty list"));
  EXPECT_TRUE(Contains(ErrorOf("- [1, 2]\n"), "is not a mapping"));
  EXPECT_TRUE(Contains(ErrorOf("- pipeline: [tiny\n"), "not valid YAML or JSON"));
  EXPECT_TRUE(Contains(ErrorOf("[{\"pipeline\": \"tiny\",}"), "mix.yaml:"));

  std::string e = ErrorOf("- pipeline: tiny\n  stpes: 4\n");
  EXPECT_TRUE(Contains(e, "mix.yaml:2:3: unknown field 'stpes' in entry 1")) << e;
  EXPECT_TRUE(Contains(e, "known fields: name, weight, pipeline")) << e;

  e = ErrorOf("- pipeline: tiny\n- steps: 4\n");
  EXPECT_TRUE(Contains(e, "mix.yaml:2:3: entry 2 has no 'pipeline'")) << e;

  e = ErrorOf("- pipeline: tiny\n  steps: many\n");
  EXPECT_TRUE(Contains(e, "mix.yaml:2:10: 'steps' wants a non-negative integer, got 'many'")) << e;
  EXPECT_TRUE(Contains(ErrorOf("- pipeline: tiny\n  steps: -1\n"), "non-negative integer"));
  EXPECT_TRUE(Contains(ErrorOf("- pipeline: tiny\n  steps: 2.5\n"), "non-negative integer"));
  EXPECT_TRUE(Contains(ErrorOf("- pipeline: tiny\n  width: 99999999999\n"), "too large"));
  EXPECT_TRUE(Contains(ErrorOf("- pipeline: tiny\n  weight: 0\n"), "'weight' must be > 0"));
  EXPECT_TRUE(Contains(ErrorOf("- pipeline: tiny\n  weight: abc\n"), "wants a number"));
  EXPECT_TRUE(Contains(ErrorOf("- pipeline: tiny\n  deadline: 0\n"), "'deadline' must be"));
  EXPECT_TRUE(Contains(ErrorOf("- pipeline: tiny\n  guidance: .nan\n"), "wants a number"));
  EXPECT_TRUE(Contains(ErrorOf("- pipeline: tiny\n  prompts: []\n"), "non-empty list of strings"));
  EXPECT_TRUE(Contains(ErrorOf("- pipeline: tiny\n  prompt: a\n  prompts: [b]\n"), "not both"));
  EXPECT_TRUE(Contains(ErrorOf("- pipeline: tiny\n  num_images: 1\n  batch: 2\n"), "given twice"));
  EXPECT_TRUE(Contains(ErrorOf("- pipeline: ''\n"), "'pipeline' must not be empty"));
  EXPECT_TRUE(Contains(ErrorOf("- {name: a, pipeline: x}\n- {name: a, pipeline: y}\n"),
                       "name 'a' is already used by entry 1"));
  // yaml-cpp 0.7 loops forever over the documents of some texts; one document is read.
  EXPECT_FALSE(ParseMix(",", "mix.yaml").error.empty());
}

TEST(BenchMix, LoadMixNamesAMissingFile) {
  const MixResult r = LoadMix("/nonexistent/mix.yaml");
  EXPECT_TRUE(Contains(r.error, "cannot read mix file '/nonexistent/mix.yaml'"));
  const std::string dir = testing::MakeTempDir("bench_mix");
  testing::WriteFile(dir + "/mix.yaml", "- pipeline: tiny\n");
  EXPECT_EQ(LoadMix(dir + "/mix.yaml").templates.size(), 1u);
  testing::RemoveTree(dir);
}

TEST(BenchMix, PickerFollowsTheWeightsAndItsSeed) {
  std::vector<RequestTemplate> templates(3);
  templates[0].weight = 6;
  templates[1].weight = 3;
  templates[2].weight = 1;
  MixPicker picker(templates, 7);
  std::vector<int> counts(3, 0);
  std::vector<size_t> first;
  constexpr int kDraws = 20000;
  for (int i = 0; i < kDraws; ++i) {
    const size_t k = picker.Next();
    ASSERT_LT(k, 3u);
    ++counts[k];
    if (i < 50) first.push_back(k);
  }
  EXPECT_NEAR(counts[0] / double(kDraws), 0.6, 0.02);
  EXPECT_NEAR(counts[1] / double(kDraws), 0.3, 0.02);
  EXPECT_NEAR(counts[2] / double(kDraws), 0.1, 0.02);
  MixPicker again(templates, 7);
  for (size_t k : first) EXPECT_EQ(again.Next(), k);
  MixPicker one(std::vector<RequestTemplate>(1), 0);
  EXPECT_EQ(one.Next(), 0u);
}

}  // namespace
}  // namespace qpool::cli
