#include "config/model_repository.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <system_error>

#include "util/file_identity.h"
#include "util/log.h"

namespace fs = std::filesystem;

namespace qpool {

namespace {

constexpr size_t kMaxNameLength = 64;
constexpr const char* kValidName =
    "a pipeline name is 1 to 64 characters from letters, digits, '.', '_' and '-', and does not "
    "start with '.'";

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

// True when `path` is a regular file (following symlinks); never throws.
bool IsRegularFile(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

std::optional<FileIdentity> IdentityOf(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return IdentityOfStat(st);
}

// Whether every file `m` names is still a regular file.
bool FilesPresent(const PipelineManifest& m) {
  for (const auto& c : m.components) {
    if (!IsRegularFile(c.file)) return false;
    if (c.weights && !IsRegularFile(c.weights->file)) return false;
  }
  for (const TokenizerSpec* t : m.Tokenizers()) {
    for (const auto& file : t->Files()) {
      if (!IsRegularFile(file)) return false;
    }
  }
  return true;
}

}  // namespace

struct ModelRepository::Cache {
  struct Entry {
    FileIdentity identity;
    PipelineManifest manifest;
  };
  std::mutex mu;
  std::map<std::string, Entry> entries;  // by pipeline name; guarded by mu
  uint64_t parsed = 0;                   // guarded by mu
};

ModelRepository::ModelRepository(std::string root, KindCatalog kinds)
    : root_(std::move(root)), kinds_(std::move(kinds)), cache_(std::make_shared<Cache>()) {}

uint64_t ModelRepository::manifests_parsed() const {
  std::lock_guard<std::mutex> lock(cache_->mu);
  return cache_->parsed;
}

Status ValidatePipelineName(const std::string& name) {
  bool ok = !name.empty() && name.size() <= kMaxNameLength && name[0] != '.' &&
            std::all_of(name.begin(), name.end(), IsNameChar);
  if (ok) return Status::Ok();
  // Quote at most a prefix of what the client sent: names can be arbitrary bytes.
  std::string shown = name.substr(0, kMaxNameLength + 1);
  for (char& c : shown) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  if (name.size() > shown.size()) shown += "...";
  return InvalidArgument(StrCat("invalid pipeline name '", shown, "': ", kValidName));
}

StatusOr<ResolvedPath> ResolveWithin(const std::string& path, const std::string& root) {
  std::error_code real_ec;
  std::error_code root_ec;
  const fs::path real = fs::canonical(path, real_ec);
  const fs::path real_root = fs::canonical(root, root_ec);
  if (real_ec || root_ec) return InvalidArgument((real_ec ? real_ec : root_ec).message());
  ResolvedPath out{real.string(), true};
  auto r = real.begin();
  for (auto it = real_root.begin(); it != real_root.end() && out.inside; ++it, ++r) {
    out.inside = r != real.end() && *r == *it;
  }
  return out;
}

StatusOr<ModelRepository> ModelRepository::Open(const std::string& root, KindCatalog kinds) {
  std::error_code ec;
  fs::path path = fs::absolute(fs::path(root), ec);
  if (ec) return InvalidArgument(StrCat("model repository '", root, "': ", ec.message()));
  path = path.lexically_normal();
  if (path.filename().empty() && path != path.root_path()) path = path.parent_path();
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st))
    return NotFound(StrCat("model repository ", path.string(), " does not exist"));
  if (!fs::is_directory(st)) {
    return InvalidArgument(StrCat("model repository ", path.string(), " is not a directory"));
  }
  return ModelRepository(path.string(), std::move(kinds));
}

std::vector<std::string> ModelRepository::ListNames() const {
  std::vector<std::string> names;
  std::error_code ec;
  fs::directory_iterator it(root_, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!ValidatePipelineName(name).ok()) continue;
    std::error_code dir_ec;
    if (!it->is_directory(dir_ec)) continue;
    if (IsRegularFile(it->path() / "pipeline.yaml")) names.push_back(name);
  }
  if (ec) log::Warn("model repository ", root_, ": listing stopped: ", ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

StatusOr<PipelineManifest> ModelRepository::LoadManifest(const std::string& name) const {
  RETURN_IF_ERROR(ValidatePipelineName(name));
  const fs::path dir = fs::path(root_) / name;
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || !IsRegularFile(dir / "pipeline.yaml")) {
    return NotFound(StrCat("no pipeline named '", name, "' in model repository ", root_));
  }
  // Note [Files stay in the repository] holds for the manifest too: one linked from outside would
  // be parsed, and its text quoted to clients in errors. Where it leads is not said either.
  const std::string manifest_path = (dir / "pipeline.yaml").string();
  ASSIGN_OR_RETURN(const ResolvedPath resolved, ResolveWithin(manifest_path, root_));
  if (!resolved.inside) {
    return InvalidArgument(StrCat(manifest_path,
                                  ": resolves outside the model repository (a symbolic link out "
                                  "of it is refused)"));
  }
  const std::optional<FileIdentity> identity = IdentityOf(dir / "pipeline.yaml");
  {
    std::lock_guard<std::mutex> lock(cache_->mu);
    auto it = cache_->entries.find(name);
    if (it != cache_->entries.end()) {
      if (identity && it->second.identity == *identity && FilesPresent(it->second.manifest)) {
        return it->second.manifest;
      }
      cache_->entries.erase(it);
    }
    ++cache_->parsed;
  }
  // Parsed without the lock: a slow disk delays only this pipeline's callers.
  StatusOr<PipelineManifest> parsed = qpool::LoadManifest(dir.string(), kinds_);
  // The identity is the one read before parsing: an edit during the parse is seen next time.
  if (parsed.ok() && identity) {
    std::lock_guard<std::mutex> lock(cache_->mu);
    cache_->entries[name] = Cache::Entry{*identity, *parsed};
  }
  return parsed;
}

}  // namespace qpool
