#include "output.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

namespace qpool::cli {

std::string Table::ToString() const {
  const size_t columns = rows_.front().size();
  std::vector<size_t> widths(columns, 0);
  for (const auto& row : rows_) {
    for (size_t c = 0; c < columns && c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::ostringstream os;
  for (const auto& row : rows_) {
    std::string line;
    for (size_t c = 0; c < columns; ++c) {
      const std::string cell = c < row.size() ? row[c] : "";
      line += cell;
      if (c + 1 < columns) line += std::string(widths[c] - cell.size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    os << line << "\n";
  }
  return os.str();
}

std::string FormatBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return FormatFixed(value, 1) + " " + kUnits[unit];
}

std::string FormatFixed(double value, int digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, value);
  return buffer;
}

ProgressBar::ProgressBar() : enabled_(isatty(STDERR_FILENO) == 1) {}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Update(uint32_t step, uint32_t total, double elapsed_seconds) {
  if (!enabled_ || total == 0) return;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(static_cast<uint64_t>(kWidth) * step / total);
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  std::cerr << "\r[" << bar << "] " << step << "/" << total << "  " << FormatFixed(elapsed_seconds, 1)
            << " s" << std::flush;
  drawn_ = true;
}

void ProgressBar::Finish() {
  if (drawn_) std::cerr << "\n" << std::flush;
  drawn_ = false;
}

namespace {

bool IsDirectory(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void ReplaceAll(std::string* text, const std::string& from, const std::string& to) {
  for (size_t pos = text->find(from); pos != std::string::npos; pos = text->find(from, pos + to.size())) {
    text->replace(pos, from.size(), to);
  }
}

}  // namespace

// Note [Output paths]
// --out is either a directory (existing, or written with a trailing '/'), which receives
// qpool-<seed>-<i>.png files, or a file pattern in which {seed} and {i} are replaced. A pattern
// without {i} used for several images gets "-<i>" before its extension, so no image
// overwrites another. <seed> is the request's seed (image i used seed + i).
std::string ImagePath(const std::string& out, uint64_t seed, size_t index, size_t count) {
  std::string pattern = out.empty() ? "./qpool-{seed}-{i}.png" : out;
  if (pattern.back() == '/' || IsDirectory(pattern)) {
    if (pattern.back() != '/') pattern += '/';
    pattern += "qpool-{seed}-{i}.png";
  }
  if (count > 1 && pattern.find("{i}") == std::string::npos) {
    const size_t slash = pattern.rfind('/');
    const size_t dot = pattern.rfind('.');
    const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash + 1);
    pattern.insert(has_ext ? dot : pattern.size(), "-{i}");
  }
  ReplaceAll(&pattern, "{seed}", std::to_string(seed));
  ReplaceAll(&pattern, "{i}", std::to_string(index));
  return pattern;
}

bool WriteFile(const std::string& path, const std::string& bytes, std::string* error) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (file) file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (file) file.close();
  if (!file) {
    *error = "cannot write '" + path + "': " + std::strerror(errno);
    return false;
  }
  return true;
}

}  // namespace qpool::cli
