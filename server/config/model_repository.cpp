#include "config/model_repository.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

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

}  // namespace

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
  return qpool::LoadManifest(dir.string(), kinds_);
}

}  // namespace qpool
