#include "util/log.h"

#include <spdlog/spdlog.h>

namespace qpool::log {

void SetLevel(const std::string& name) {
  spdlog::level::level_enum level = spdlog::level::info;
  if (name == "debug") level = spdlog::level::debug;
  if (name == "warn") level = spdlog::level::warn;
  if (name == "error") level = spdlog::level::err;
  spdlog::set_level(level);
}

void Write(Level level, const std::string& message) {
  switch (level) {
    case Level::kDebug: spdlog::debug(message); break;
    case Level::kInfo: spdlog::info(message); break;
    case Level::kWarn: spdlog::warn(message); break;
    case Level::kError: spdlog::error(message); break;
  }
}

std::string Abbreviate(const std::string& text, size_t max) {
  if (text.size() <= max) return text;
  return StrCat(text.substr(0, max), "... (", text.size(), " bytes)");
}

}  // namespace qpool::log
