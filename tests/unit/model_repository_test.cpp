// Model repository: pipeline-name validation, listing, and manifest lookup by name.
#include "config/model_repository.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "testing/kind_catalog.h"
#include "testing/test_paths.h"

namespace qpool {
namespace {

namespace fs = std::filesystem;
using ::qpool::testing::MakeTempDir;
using ::qpool::testing::WriteFile;

const char kManifest[] = R"(kind: sd
components:
  text_encoder: {file: text_encoder.pt}
  unet: {file: unet.pt}
  vae_decoder: {file: vae_decoder.pt}
tokenizer: {vocab: vocab.json, merges: merges.txt}
)";

// Writes a valid pipeline folder <root>/<name>.
void WritePipeline(const std::string& root, const std::string& name) {
  for (const char* f :
       {"text_encoder.pt", "unet.pt", "vae_decoder.pt", "vocab.json", "merges.txt"}) {
    WriteFile(root + "/" + name + "/" + f, "x");
  }
  WriteFile(root + "/" + name + "/pipeline.yaml", kManifest);
}

TEST(ValidatePipelineNameTest, AcceptsValidNames) {
  for (const std::string& name :
       std::vector<std::string>{"tiny", "sd-1.5_int8", "A", "x.", "a..b", std::string(64, 'n')}) {
    EXPECT_TRUE(ValidatePipelineName(name).ok()) << name;
  }
}

TEST(ValidatePipelineNameTest, RefusesEverythingElseSayingWhatIsValid) {
  for (const std::string& name : std::vector<std::string>{
           "", ".", "..", ".hidden", "../x", "/etc/passwd", "a/b", "a\\b", "a b", "a:b", "tiny\n",
           std::string(65, 'n'), std::string("a\0b", 3), "caf\xc3\xa9"}) {
    Status s = ValidatePipelineName(name);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(s.message().find("1 to 64 characters from letters, digits, '.', '_' and '-'"),
              std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("does not start with '.'"), std::string::npos) << s.message();
  }
  EXPECT_NE(ValidatePipelineName("../x").message().find("'../x'"), std::string::npos);
  EXPECT_EQ(ValidatePipelineName("a\nb").message().find('\n'), std::string::npos);
}

class ModelRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = MakeTempDir("model-repository"); }
  void TearDown() override { fs::remove_all(root_); }
  std::string root_;
};

TEST_F(ModelRepositoryTest, OpenRefusesMissingRootAndFiles) {
  auto missing = ModelRepository::Open(root_ + "/nope", testing::BuiltinKindCatalog());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(root_ + "/nope"), std::string::npos);

  WriteFile(root_ + "/file", "x");
  auto file = ModelRepository::Open(root_ + "/file", testing::BuiltinKindCatalog());
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(file.status().message().find("is not a directory"), std::string::npos);

  auto ok = ModelRepository::Open(root_ + "/", testing::BuiltinKindCatalog());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->root(), root_);
}

TEST_F(ModelRepositoryTest, ListsOnlyFoldersWithAManifestAndAValidName) {
  WritePipeline(root_, "tiny");
  WritePipeline(root_, "other-1.5");
  WritePipeline(root_, ".hidden");
  WritePipeline(root_, "bad name");
  fs::create_directories(root_ + "/empty");
  fs::create_directories(root_ + "/yaml-is-dir/pipeline.yaml");
  WriteFile(root_ + "/README.md", "x");
  WriteFile(root_ + "/pipeline.yaml", kManifest);
  auto repo = ModelRepository::Open(root_, testing::BuiltinKindCatalog());
  ASSERT_TRUE(repo.ok()) << repo.status().ToString();
  EXPECT_EQ(repo->ListNames(), (std::vector<std::string>{"other-1.5", "tiny"}));

  // Re-scanned on every call.
  WritePipeline(root_, "added");
  fs::remove_all(root_ + "/tiny");
  EXPECT_EQ(repo->ListNames(), (std::vector<std::string>{"added", "other-1.5"}));
}

TEST_F(ModelRepositoryTest, LoadsManifestsByName) {
  WritePipeline(root_, "tiny");
  auto repo = ModelRepository::Open(root_, testing::BuiltinKindCatalog());
  ASSERT_TRUE(repo.ok());
  auto m = repo->LoadManifest("tiny");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->name, "tiny");
  EXPECT_EQ(m->dir, root_ + "/tiny");
  EXPECT_EQ(m->path, root_ + "/tiny/pipeline.yaml");
  EXPECT_EQ(m->components.size(), 3u);
  EXPECT_EQ(m->tokenizer.vocab, root_ + "/tiny/vocab.json");
}

TEST_F(ModelRepositoryTest, RefusesBadNamesAndReportsMissingPipelines) {
  WritePipeline(root_, "tiny");
  fs::create_directories(root_ + "/empty");
  auto repo = ModelRepository::Open(root_, testing::BuiltinKindCatalog());
  ASSERT_TRUE(repo.ok());
  for (const std::string bad : {"../tiny", "/etc/passwd", "tiny/..", "a/b", "", ".."}) {
    auto r = repo->LoadManifest(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  for (const std::string missing : {"nope", "empty"}) {
    auto r = repo->LoadManifest(missing);
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << missing;
    EXPECT_EQ(r.status().message(),
              "no pipeline named '" + missing + "' in model repository " + root_);
  }
}

TEST_F(ModelRepositoryTest, BrokenManifestFailsOnlyItsOwnLoad) {
  WritePipeline(root_, "tiny");
  WritePipeline(root_, "broken");
  WriteFile(root_ + "/broken/pipeline.yaml", "kind: sd\n");
  auto repo = ModelRepository::Open(root_, testing::BuiltinKindCatalog());
  ASSERT_TRUE(repo.ok());
  auto broken = repo->LoadManifest("broken");
  EXPECT_EQ(broken.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(broken.status().message(),
            root_ + "/broken/pipeline.yaml: field 'components' is required");
  EXPECT_TRUE(repo->LoadManifest("tiny").ok());
  EXPECT_EQ(repo->ListNames(), (std::vector<std::string>{"broken", "tiny"}));
}

// Note [Manifest cache]: a manifest is parsed once while its file and the files it names stay.
TEST_F(ModelRepositoryTest, ValidManifestsAreParsedOncePerVersionOfTheFile) {
  WritePipeline(root_, "tiny");
  auto repo = ModelRepository::Open(root_, testing::BuiltinKindCatalog());
  ASSERT_TRUE(repo.ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(repo->LoadManifest("tiny").ok());
  EXPECT_EQ(repo->manifests_parsed(), 1u);
  const ModelRepository copy = *repo;  // copies share the cache
  ASSERT_TRUE(copy.LoadManifest("tiny").ok());
  EXPECT_EQ(repo->manifests_parsed(), 1u);

  // An edit is seen at once (a new size and change time even within one timestamp tick).
  WriteFile(root_ + "/tiny/pipeline.yaml", std::string(kManifest) + "defaults: {steps: 7}\n");
  auto edited = repo->LoadManifest("tiny");
  ASSERT_TRUE(edited.ok()) << edited.status().ToString();
  EXPECT_EQ(edited->defaults.steps, 7);
  EXPECT_EQ(repo->manifests_parsed(), 2u);

  // Replaced by rename (what editors and deploy tools do): a new inode.
  WriteFile(root_ + "/tiny/next.yaml", std::string(kManifest) + "defaults: {steps: 9}\n");
  fs::rename(root_ + "/tiny/next.yaml", root_ + "/tiny/pipeline.yaml");
  EXPECT_EQ(repo->LoadManifest("tiny")->defaults.steps, 9);

  // A component file removed behind the manifest's back: parsed again, and the error names it.
  fs::remove(root_ + "/tiny/unet.pt");
  auto missing = repo->LoadManifest("tiny");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("components.unet.file"), std::string::npos)
      << missing.status().message();
  // Broken manifests are not kept: restoring the file is seen at once.
  WriteFile(root_ + "/tiny/unet.pt", "x");
  EXPECT_TRUE(repo->LoadManifest("tiny").ok());
  const uint64_t parsed = repo->manifests_parsed();
  EXPECT_TRUE(repo->LoadManifest("tiny").ok());
  EXPECT_EQ(repo->manifests_parsed(), parsed);

  // A removed pipeline is NotFound, not served from the cache.
  fs::remove(root_ + "/tiny/pipeline.yaml");
  EXPECT_EQ(repo->LoadManifest("tiny").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace qpool
