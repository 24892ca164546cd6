#include "util/png_encoder.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <limits>
#include <vector>

namespace qpool {

// Note [PNG layout]
// signature, IHDR (width, height, depth 8, color type 2 = RGB, compression 0, filter 0,
// interlace 0), IDATs holding consecutive pieces (<= 1 MiB, so chunk lengths and CRC inputs stay
// far below 2^31) of one zlib stream of all filtered rows (each row = filter byte +
// 3 * width bytes), IEND. Each chunk is length (big-endian) + type + data + CRC-32 of type+data.

namespace {

constexpr int kBpp = 3;                       // bytes per pixel: the filter's "left" distance
constexpr size_t kMaxIdat = size_t{1} << 20;  // split the zlib stream into IDATs of <= 1 MiB

void PutU32(uint32_t v, std::string* out) {
  out->push_back(static_cast<char>((v >> 24) & 0xFF));
  out->push_back(static_cast<char>((v >> 16) & 0xFF));
  out->push_back(static_cast<char>((v >> 8) & 0xFF));
  out->push_back(static_cast<char>(v & 0xFF));
}

void PutChunk(const char type[4], const uint8_t* data, size_t size, std::string* out) {
  PutU32(static_cast<uint32_t>(size), out);
  const size_t start = out->size();
  out->append(type, 4);
  if (size > 0) out->append(reinterpret_cast<const char*>(data), size);
  uLong crc = crc32(0L, Z_NULL, 0);
  crc =
      crc32(crc, reinterpret_cast<const Bytef*>(out->data() + start), static_cast<uInt>(4 + size));
  PutU32(static_cast<uint32_t>(crc), out);
}

uint8_t Paeth(int a, int b, int c) {
  const int p = a + b - c;
  const int pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  if (pa <= pb && pa <= pc) return static_cast<uint8_t>(a);
  if (pb <= pc) return static_cast<uint8_t>(b);
  return static_cast<uint8_t>(c);
}

// Writes filter `type` of `row` (previous row `prev`, zeros for the first) into out[0..n).
void FilterRow(int type, const uint8_t* row, const uint8_t* prev, size_t n, uint8_t* out) {
  for (size_t i = 0; i < n; ++i) {
    const int a = i >= kBpp ? row[i - kBpp] : 0;
    const int b = prev[i];
    const int c = i >= kBpp ? prev[i - kBpp] : 0;
    int pred = 0;
    switch (type) {
      case 1:
        pred = a;
        break;
      case 2:
        pred = b;
        break;
      case 3:
        pred = (a + b) / 2;
        break;
      case 4:
        pred = Paeth(a, b, c);
        break;
      default:
        pred = 0;
        break;
    }
    out[i] = static_cast<uint8_t>(row[i] - pred);
  }
}

// Sum of the filtered bytes taken as signed: libpng's heuristic for choosing a filter.
uint64_t Cost(const uint8_t* f, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum += f[i] < 128 ? f[i] : 256 - f[i];
  return sum;
}

}  // namespace

std::string EncodePng(const uint8_t* rgb, int width, int height, const PngOptions& options) {
  if (rgb == nullptr || width < 1 || height < 1 ||
      width > (std::numeric_limits<int32_t>::max() - 1) / kBpp) {
    return "";
  }
  const size_t stride = static_cast<size_t>(width) * kBpp;
  std::vector<uint8_t> filtered((stride + 1) * static_cast<size_t>(height));
  const std::vector<uint8_t> zeros(stride, 0);
  std::array<std::vector<uint8_t>, 5> candidates;
  for (auto& c : candidates) c.resize(stride);
  for (int y = 0; y < height; ++y) {
    const uint8_t* row = rgb + static_cast<size_t>(y) * stride;
    const uint8_t* prev = y > 0 ? row - stride : zeros.data();
    uint8_t* out = filtered.data() + static_cast<size_t>(y) * (stride + 1);
    int best = 0;
    if (options.adaptive_filter) {
      uint64_t best_cost = std::numeric_limits<uint64_t>::max();
      for (int type = 0; type < 5; ++type) {
        FilterRow(type, row, prev, stride, candidates[type].data());
        const uint64_t cost = Cost(candidates[type].data(), stride);
        if (cost < best_cost) {
          best_cost = cost;
          best = type;
        }
      }
    } else {
      FilterRow(0, row, prev, stride, candidates[0].data());
    }
    out[0] = static_cast<uint8_t>(best);
    std::copy(candidates[best].begin(), candidates[best].end(), out + 1);
  }

  uLongf compressed_size = compressBound(static_cast<uLong>(filtered.size()));
  std::vector<uint8_t> compressed(compressed_size);
  int level = options.compression_level;
  if (level < 0 || level > 9) level = Z_DEFAULT_COMPRESSION;
  if (compress2(compressed.data(), &compressed_size, filtered.data(),
                static_cast<uLong>(filtered.size()), level) != Z_OK) {
    return "";
  }

  std::string png;
  png.reserve(compressed_size + 64);
  png.append("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  PutU32(static_cast<uint32_t>(width), &ihdr);
  PutU32(static_cast<uint32_t>(height), &ihdr);
  ihdr.append(
      {'\x08', '\x02', '\x00', '\x00', '\x00'});  // depth 8, RGB, deflate, filter 0, no interlace
  PutChunk("IHDR", reinterpret_cast<const uint8_t*>(ihdr.data()), ihdr.size(), &png);
  for (size_t off = 0; off < compressed_size; off += kMaxIdat) {
    PutChunk("IDAT", compressed.data() + off, std::min<size_t>(kMaxIdat, compressed_size - off),
             &png);
  }
  PutChunk("IEND", nullptr, 0, &png);
  return png;
}

}  // namespace qpool
