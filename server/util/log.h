// Logging facade. spdlog is used only in log.cpp: Debian's spdlog needs fmt 9 while the
// PyTorch wheel ships fmt 12 headers, so no translation unit may see both (Note [fmt clash]).
#pragma once

#include <sstream>
#include <string>

namespace qpool::log {

// Note [fmt clash]
// The PyTorch wheel ships fmt 12 headers in torch/include/fmt, while Debian's spdlog 1.10 is
// built against fmt 9. Where torch's include directory comes first, spdlog's calls resolve to
// fmt 12 and fail to compile. So spdlog and fmt are used only in log.cpp (qpool_util, which does
// not see LibTorch), behind this header, which includes neither; no translation unit sees both.

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

// A client's string as an error message quotes it: the string itself when it is at most `max`
// bytes, else its first `max` bytes and how long it was, so that a 1 MiB value does not come
// back in the reply's metadata (where it turned INVALID_ARGUMENT into RESOURCE_EXHAUSTED).
std::string Abbreviate(const std::string& text, size_t max = 64);

template <typename... Args> void Debug(const Args&... a) { Write(Level::kDebug, StrCat(a...)); }
template <typename... Args> void Info(const Args&... a) { Write(Level::kInfo, StrCat(a...)); }
template <typename... Args> void Warn(const Args&... a) { Write(Level::kWarn, StrCat(a...)); }
template <typename... Args> void Error(const Args&... a) { Write(Level::kError, StrCat(a...)); }

}  // namespace qpool::log

namespace qpool {
using log::Abbreviate;
using log::StrCat;
}  // namespace qpool
