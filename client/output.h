// Human-readable output of the `qpool` CLI: aligned tables, byte sizes, the progress bar, and
// the file helpers of `generate` / `encode`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qpool::cli {

// A text table with a header row; columns are left-aligned and padded to their widest cell.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  // Adds a row; missing cells print empty, extra cells are dropped.
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // The table as text, one line per row, each ending in "\n".
  std::string ToString() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

// "1.5 MiB", "312 B".
std::string FormatBytes(uint64_t bytes);
// Fixed-point number with `digits` decimals, e.g. FormatFixed(1.234, 2) == "1.23".
std::string FormatFixed(double value, int digits);

// Progress of a streamed Generate on stderr. Draws a bar only when stderr is a terminal;
// otherwise prints nothing, so logs and pipes stay clean.
class ProgressBar {
 public:
  ProgressBar();
  ~ProgressBar();  // finishes the line if a bar was drawn
  // Redraws the bar for `step` of `total` finished steps.
  void Update(uint32_t step, uint32_t total, double elapsed_seconds);
  // Ends the bar's line (idempotent).
  void Finish();

 private:
  bool enabled_;
  bool drawn_ = false;
};

// The path of image `index` for --out `out` (see Note [Output paths] in output.cpp).
std::string ImagePath(const std::string& out, uint64_t seed, size_t index, size_t count);

// Writes `bytes` to `path` (creating or truncating it). On failure returns false and sets
// `error` to a message naming the path.
bool WriteFile(const std::string& path, const std::string& bytes, std::string* error);

}  // namespace qpool::cli
