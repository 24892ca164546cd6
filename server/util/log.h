// Logging facade. spdlog is used only in log.cpp: Debian's spdlog needs fmt 9 while the
// PyTorch wheel ships fmt 12 headers, so no translation unit may see both (Note [fmt clash]).
#pragma once

#include <sstream>
#include <string>

namespace qpool::log {

enum class Level { kDebug, kInfo, kWarn, kError };

// Sets the minimum level ("debug", "info", "warn", "error"); unknown names keep "info".
void SetLevel(const std::string& name);
// Writes one line; thread-safe.
void Write(Level level, const std::string& message);

// Concatenates any streamable values: StrCat("loaded ", name, " in ", secs, " s").
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

template <typename... Args> void Debug(const Args&... a) { Write(Level::kDebug, StrCat(a...)); }
template <typename... Args> void Info(const Args&... a) { Write(Level::kInfo, StrCat(a...)); }
template <typename... Args> void Warn(const Args&... a) { Write(Level::kWarn, StrCat(a...)); }
template <typename... Args> void Error(const Args&... a) { Write(Level::kError, StrCat(a...)); }

}  // namespace qpool::log

namespace qpool {
using log::StrCat;
}  // namespace qpool
