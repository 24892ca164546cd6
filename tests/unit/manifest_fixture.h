// Shared by the manifest tests: a temp pipeline folder with every referenced file, a manifest
// builder for validation cases, and the error expectation every rule must meet.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "config/manifest.h"
#include "testing/kind_catalog.h"
#include "testing/test_paths.h"

namespace qpool::manifest_testing {

namespace fs = std::filesystem;
using ::qpool::testing::MakeTempDir;
using ::qpool::testing::WriteFile;

// The smallest valid manifest.
inline constexpr char kMinimal[] = R"(kind: sd
components:
  text_encoder:
    file: text_encoder.pt
  unet:
    file: unet.pt
  vae_decoder:
    file: vae_decoder.pt
tokenizer:
  vocab: tokenizer/vocab.json
  merges: tokenizer/merges.txt
)";

// Pieces of a manifest that validation cases change; everything else is the minimal manifest.
struct Parts {
  std::string kind = "sd";
  std::string unet_file = "unet.pt";
  std::string unet_extra;        // lines under components.unet (4-space indent)
  std::string components_extra;  // lines under components (2-space indent)
  std::string tokenizer_extra;   // lines under tokenizer (2-space indent)
  std::string extra;             // top-level sections

  Parts& Kind(std::string v) { return Set(&kind, std::move(v)); }
  Parts& UnetFile(std::string v) { return Set(&unet_file, std::move(v)); }
  Parts& UnetExtra(std::string v) { return Set(&unet_extra, std::move(v)); }
  Parts& ComponentsExtra(std::string v) { return Set(&components_extra, std::move(v)); }
  Parts& TokenizerExtra(std::string v) { return Set(&tokenizer_extra, std::move(v)); }
  Parts& Extra(std::string v) { return Set(&extra, std::move(v)); }

 private:
  Parts& Set(std::string* field, std::string v) {
    *field = std::move(v);
    return *this;
  }
};

inline std::string Build(const Parts& p) {
  return "kind: " + p.kind + "\ncomponents:\n  text_encoder:\n    file: text_encoder.pt\n" +
         "  unet:\n    file: " + p.unet_file + "\n" + p.unet_extra +
         "  vae_decoder:\n    file: vae_decoder.pt\n" + p.components_extra +
         "tokenizer:\n  vocab: tokenizer/vocab.json\n  merges: tokenizer/merges.txt\n" +
         p.tokenizer_extra + p.extra;
}

// Removes the line of `dotted` (2-space indentation) and every line nested under it.
inline std::string RemoveField(const std::string& yaml, const std::string& dotted) {
  std::istringstream in(yaml);
  std::string line, out;
  std::vector<std::string> path;  // key per indentation level
  int removing_indent = -1;
  while (std::getline(in, line)) {
    const int indent = static_cast<int>(line.find_first_not_of(' '));
    if (removing_indent >= 0 && indent > removing_indent) continue;
    removing_indent = -1;
    const std::string key = line.substr(indent, line.find(':') - indent);
    path.resize(indent / 2);
    path.push_back(key);
    std::string joined;
    for (const auto& k : path) joined += (joined.empty() ? "" : ".") + k;
    if (joined == dotted) {
      removing_indent = indent;
      continue;
    }
    out += line + "\n";
  }
  return out;
}

class ManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("manifest");
    for (const char* f : {"text_encoder.pt", "unet.pt", "vae_decoder.pt", "tokenizer/vocab.json",
                          "tokenizer/merges.txt"}) {
      WriteFile(dir_ + "/" + f, "x");
    }
    path_ = dir_ + "/pipeline.yaml";
  }
  void TearDown() override { fs::remove_all(dir_); }

  StatusOr<PipelineManifest> Parse(const std::string& text) {
    return ParseManifest(text, dir_, testing::BuiltinKindCatalog());
  }

  // The status is InvalidArgument, starts with the manifest path and holds every substring.
  void ExpectInvalid(const StatusOr<PipelineManifest>& r, const std::vector<std::string>& parts) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
    EXPECT_EQ(r.status().message().rfind(path_ + ": ", 0), 0u) << r.status().message();
    for (const auto& part : parts) {
      EXPECT_NE(r.status().message().find(part), std::string::npos)
          << "expected '" << part << "' in: " << r.status().message();
    }
  }

  std::string dir_;
  std::string path_;
};

}  // namespace qpool::manifest_testing
