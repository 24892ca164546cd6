#include "config/manifest.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "config/manifest_parser.h"

namespace fs = std::filesystem;

namespace qpool {

namespace {

bool IsValidSingleDevice(const std::string& d) {
  if (d == "auto" || d == "cpu" || d == "cuda") return true;
  if (d.rfind("cuda:", 0) != 0 || d.size() == 5 || d.size() > 8) return false;
  for (size_t i = 5; i < d.size(); ++i) {
    if (d[i] < '0' || d[i] > '9') return false;
  }
  return true;
}

}  // namespace

bool IsValidDevice(const std::string& d) {
  if (d.find(',') == std::string::npos) return IsValidSingleDevice(d);
  size_t start = 0;
  for (;;) {
    const size_t comma = d.find(',', start);
    const std::string one = d.substr(start, comma - start);
    if (one.rfind("cuda:", 0) != 0 || !IsValidSingleDevice(one)) return false;
    if (comma == std::string::npos) return true;
    start = comma + 1;
  }
}

namespace {

// Absolute, normalized, without a trailing separator.
std::string NormalizeDir(const std::string& dir) {
  std::error_code ec;
  fs::path p = fs::absolute(fs::path(dir), ec);
  if (ec) p = fs::path(dir);
  p = p.lexically_normal();
  if (p.filename().empty() && p.has_parent_path() && p != p.root_path()) p = p.parent_path();
  return p.string();
}

}  // namespace

const ComponentSpec* PipelineManifest::FindComponent(const std::string& component) const {
  for (const auto& c : components) {
    if (c.name == component) return &c;
  }
  return nullptr;
}

std::vector<const TokenizerSpec*> PipelineManifest::Tokenizers() const {
  std::vector<const TokenizerSpec*> out = {&tokenizer};
  for (const auto* t : {&tokenizer_2, &tokenizer_3, &tokenizer_4}) {
    if (t->has_value()) out.push_back(&**t);
  }
  return out;
}

std::vector<std::string> TokenizerSpec::Files() const {
  std::vector<std::string> out;
  for (const auto* f : {&vocab, &merges, &model, &json}) {
    if (!f->empty()) out.push_back(*f);
  }
  return out;
}

namespace {

// Note [Manifests without aliases]
// YAML aliases (`*name`) repeat what an anchor (`&name`) names; nested, a few KB of them expand
// into gigabytes (a small manifest of aliases made every parse slow and gigabytes large). No
// pipeline.yaml needs them, so a streaming pass over the events (which sees an alias without
// expanding it) refuses any before the document is built, and a manifest larger than
// kMaxManifestBytes is refused before it is read.
class AliasFinder final : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override {
    if (!found) {
      found = true;
      line = mark.line + 1;
    }
  }
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

  bool found = false;
  int line = 0;
};

// InvalidArgument naming `path` and the line of the first alias of `text`, or saying that it holds
// more than one document; OK otherwise (a text that does not parse is left to the parser, which
// names the error). At most two documents are read: on some texts ("," for one) yaml-cpp 0.7
// reports a next document forever without consuming anything, so a loop over the documents, or
// YAML::LoadAll, never ends (found by fuzz_manifest).
Status CheckEventStream(const std::string& text, const std::string& path) {
  std::istringstream in(text);
  AliasFinder finder;
  bool second_document = false;
  try {
    YAML::Parser parser(in);
    if (parser.HandleNextDocument(finder) && !finder.found) {
      second_document = parser.HandleNextDocument(finder);
    }
  } catch (const YAML::Exception&) {
    return Status::Ok();
  }
  if (finder.found) {
    return InvalidArgument(StrCat(path, ": line ", finder.line,
                                  ": YAML aliases (*name) are not accepted in a manifest"));
  }
  if (second_document) {
    return InvalidArgument(StrCat(path, ": holds more than one YAML document; expected one"));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<PipelineManifest> ParseManifest(const std::string& yaml_text,
                                         const std::string& pipeline_dir,
                                         const KindCatalog& kinds) {
  const std::string dir = NormalizeDir(pipeline_dir);
  const std::string path = (fs::path(dir) / "pipeline.yaml").string();
  if (yaml_text.size() > kMaxManifestBytes) {
    return InvalidArgument(StrCat(path, ": is ", yaml_text.size(),
                                  " bytes; a manifest may have "
                                  "at most ",
                                  kMaxManifestBytes));
  }
  RETURN_IF_ERROR(CheckEventStream(yaml_text, path));
  try {
    return manifest_internal::Parser(dir, path, kinds).Parse(yaml_text);
  } catch (const std::exception& e) {  // yaml-cpp or filesystem surprises: still name the file.
    return InvalidArgument(StrCat(path, ": ", e.what()));
  }
}

StatusOr<PipelineManifest> LoadManifest(const std::string& pipeline_dir, const KindCatalog& kinds) {
  const std::string path = (fs::path(NormalizeDir(pipeline_dir)) / "pipeline.yaml").string();
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return NotFound(StrCat(path, ": manifest not found"));
  if (!fs::is_regular_file(st)) return InvalidArgument(StrCat(path, ": is not a regular file"));
  const auto size = fs::file_size(path, ec);
  if (!ec && size > kMaxManifestBytes) {
    return InvalidArgument(
        StrCat(path, ": is ", size, " bytes; a manifest may have at most ", kMaxManifestBytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument(StrCat(path, ": cannot be opened for reading"));
  std::ostringstream text;
  text << in.rdbuf();
  return ParseManifest(text.str(), pipeline_dir, kinds);
}

}  // namespace qpool
