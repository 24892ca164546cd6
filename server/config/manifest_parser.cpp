#include "config/manifest_parser.h"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <system_error>
#include <type_traits>

#include "config/model_repository.h"

namespace fs = std::filesystem;

namespace qpool::manifest_internal {

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

bool Contains(const std::vector<std::string>& items, const std::string& x) {
  for (const auto& item : items) {
    if (item == x) return true;
  }
  return false;
}

std::string Dotted(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return node.Tag() == "!" ? "the quoted string '" + node.Scalar() + "'"
                               : "'" + node.Scalar() + "'";
    default:
      return "an empty value";
  }
}

bool IsPlainScalar(const YAML::Node& node) { return node.IsScalar() && node.Tag() != "!"; }

bool IsPowerOfTwo(int x) { return x > 0 && (x & (x - 1)) == 0; }

Status Parser::CheckKeys(const YAML::Node& map, const std::string& prefix,
                         const std::vector<std::string>& known,
                         const std::string& unknown_what) const {
  std::set<std::string> seen;
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) {
      return InvalidArgument(StrCat(path_, ": ",
                                    prefix.empty() ? "the top level" : "field '" + prefix + "'",
                                    " has a key that is not a name (", Describe(kv.first), ")"));
    }
    const std::string key = kv.first.Scalar();
    if (!Contains(known, key)) {
      return Error(Dotted(prefix, key),
                   StrCat(unknown_what, " (expected one of: ", Join(known), ")"));
    }
    if (!seen.insert(key).second) return Error(Dotted(prefix, key), "appears more than once");
  }
  return Status::Ok();
}

Status Parser::GetSection(const YAML::Node& parent, const std::string& prefix,
                          const std::string& key, bool required,
                          const std::vector<std::string>& known, YAML::Node* out) const {
  const std::string field = Dotted(prefix, key);
  const YAML::Node node = parent[key];
  if (!node.IsDefined()) {
    if (required) return Error(field, "is required");
    *out = YAML::Node(YAML::NodeType::Map);
    return Status::Ok();
  }
  if (node.IsNull()) {  // `tokenizer:` with nothing under it: an empty section.
    *out = YAML::Node(YAML::NodeType::Map);
    return Status::Ok();
  }
  if (!node.IsMap()) return Got(field, "must be a mapping", Describe(node));
  if (!known.empty()) RETURN_IF_ERROR(CheckKeys(node, field, known, "is not a known field"));
  *out = node;
  return Status::Ok();
}

Status Parser::ReadString(const YAML::Node& map, const std::string& prefix, const std::string& key,
                          bool required, std::string* out) const {
  const std::string field = Dotted(prefix, key);
  const YAML::Node node = map[key];
  if (!node.IsDefined() || (required && node.IsNull())) {
    return required ? Error(field, "is required") : Status::Ok();
  }
  if (!node.IsScalar()) return Got(field, "must be a string", Describe(node));
  *out = node.Scalar();
  return Status::Ok();
}

template <typename T>
Status Parser::ReadNumber(const YAML::Node& map, const std::string& prefix, const std::string& key,
                          T* out) const {
  constexpr bool kInt = std::is_integral_v<T>;
  const std::string field = Dotted(prefix, key);
  const YAML::Node node = map[key];
  if (!node.IsDefined()) return Status::Ok();
  const char* expected = kInt ? "must be an integer" : "must be a number";
  if (!IsPlainScalar(node)) return Got(field, expected, Describe(node));
  const std::string& s = node.Scalar();
  std::conditional_t<kInt, long long, double> v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc::result_out_of_range ||
      (ec == std::errc() && kInt &&
       (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()))) {
    return Got(field, "is out of range", Describe(node));
  }
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(static_cast<double>(v))) {
    return Got(field, expected, Describe(node));
  }
  *out = static_cast<T>(v);
  return Status::Ok();
}

Status Parser::ReadBool(const YAML::Node& map, const std::string& prefix, const std::string& key,
                        bool* out) const {
  const std::string field = Dotted(prefix, key);
  const YAML::Node node = map[key];
  if (!node.IsDefined()) return Status::Ok();
  bool v = false;
  if (!IsPlainScalar(node) || !YAML::convert<bool>::decode(node, v)) {
    return Got(field, "must be a boolean (true or false)", Describe(node));
  }
  *out = v;
  return Status::Ok();
}

Status Parser::ReadStringList(const YAML::Node& map, const std::string& prefix,
                              const std::string& key, std::vector<std::string>* out) const {
  const std::string field = Dotted(prefix, key);
  const YAML::Node node = map[key];
  if (!node.IsDefined() || node.IsNull()) return Status::Ok();
  if (!node.IsSequence()) return Got(field, "must be a list of strings", Describe(node));
  std::vector<std::string> items;
  for (size_t i = 0; i < node.size(); ++i) {
    const YAML::Node item = node[i];
    const std::string item_field = StrCat(field, "[", i, "]");
    if (!item.IsScalar()) return Got(item_field, "must be a string", Describe(item));
    if (item.Scalar().empty()) return Error(item_field, "must not be empty");
    items.push_back(item.Scalar());
  }
  *out = std::move(items);
  return Status::Ok();
}

Status Parser::CheckOneOf(const std::string& field, const std::string& value,
                          const std::vector<std::string>& allowed) const {
  if (Contains(allowed, value)) return Status::Ok();
  return Got(field, "must be one of: " + Join(allowed), "'" + value + "'");
}

Status Parser::ResolveFile(const YAML::Node& map, const std::string& prefix, const std::string& key,
                           std::string* out) const {
  const std::string field = Dotted(prefix, key);
  std::string rel;
  RETURN_IF_ERROR(ReadString(map, prefix, key, /*required=*/true, &rel));
  if (rel.empty()) return Error(field, "must not be empty");
  const fs::path p(rel);
  if (p.is_absolute() || p.has_root_path()) {
    return Got(field, "must be a path relative to the pipeline folder", "'" + rel + "'");
  }
  for (const auto& part : p) {
    if (part == "..") return Got(field, "must not contain a '..' segment", "'" + rel + "'");
  }
  const fs::path resolved = (fs::path(dir_) / p).lexically_normal();
  std::error_code ec;
  const fs::file_status st = fs::status(resolved, ec);
  if (!fs::exists(st))
    return Error(field, "names a file that does not exist: " + resolved.string());
  if (!fs::is_regular_file(st)) {
    return Error(field, "names something that is not a regular file: " + resolved.string());
  }
  // Note [Files stay in the repository]
  // The lexical checks above keep a manifest's paths inside its folder, but a symlink (the file's
  // or a folder's on its way) may still lead anywhere on the host, and the server would serve
  // whatever it finds there. A file must resolve, symlinks followed, to a place inside the model
  // repository (the pipeline folder's parent): pipelines may share files through links within
  // the repository, never through links out of it.
  const std::string root = fs::path(dir_).parent_path().string();
  const StatusOr<ResolvedPath> real = ResolveWithin(resolved.string(), root);
  if (!real.ok()) return Error(field, "cannot be resolved: " + real.status().message());
  if (!real->inside) {
    return Error(field, "resolves to " + real->real + ", outside the model repository " + root +
                            " (a symbolic link out of it is refused)");
  }
  *out = resolved.string();
  return Status::Ok();
}

template Status Parser::ReadNumber<int>(const YAML::Node&, const std::string&, const std::string&,
                                        int*) const;
template Status Parser::ReadNumber<double>(const YAML::Node&, const std::string&,
                                           const std::string&, double*) const;

}  // namespace qpool::manifest_internal
