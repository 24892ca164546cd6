// PNG encoding of 8-bit RGB images (zlib only, no libpng).
#pragma once

#include <cstdint>
#include <string>

namespace qpool {

struct PngOptions {
  // zlib level 0..9 of Search::kMatches; 6 is zlib's default: within a few percent of 9's size
  // at a fraction of the time. With Search::kRuns any level but 0 (stored) deflates alike.
  int compression_level = 6;
  // Pick each row's filter (None/Sub/Up/Average/Paeth) by the minimum-sum-of-absolute-
  // differences heuristic; smooth generated images shrink by roughly a third over filter 0.
  bool adaptive_filter = true;
  // Rows are filtered and deflated in pieces of this many rows, several at once (Note [Parallel
  // deflate] in png_encoder.cpp). The bytes depend on the rows per piece, never on the threads.
  int rows_per_piece = 64;
  // Pieces encoded at once: 0 is one per piece, up to the hardware's threads and 8.
  int threads = 0;
  // How deflate looks for repeats (Note [Run-length deflate] in png_encoder.cpp). kRuns: runs of
  // one byte only (zlib's Z_RLE), what filtered image rows mostly repeat. kMatches: zlib's
  // string matching at compression_level, for the smallest files.
  enum class Search { kRuns, kMatches };
  Search search = Search::kRuns;
};

// Encodes `height` rows of `width` packed RGB pixels (3 bytes each, no row padding) as a PNG
// (color type 2, bit depth 8, no interlace). Deterministic: equal input gives equal bytes.
// Returns "" when rgb is null, a dimension is < 1 or > 2^31-1 / 3 per row, or zlib fails.
std::string EncodePng(const uint8_t* rgb, int width, int height, const PngOptions& options = {});

}  // namespace qpool
