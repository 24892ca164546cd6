// EncodePng: parsed back with an independent chunk reader, CRC and unfilter; zlib only inflates.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "util/png_encoder.h"

namespace qpool {
namespace {

struct Chunk {
  std::string type;
  std::string data;
  uint32_t crc = 0;
};

uint32_t U32(const std::string& s, size_t at) {
  return (static_cast<uint32_t>(static_cast<uint8_t>(s[at])) << 24) |
         (static_cast<uint32_t>(static_cast<uint8_t>(s[at + 1])) << 16) |
         (static_cast<uint32_t>(static_cast<uint8_t>(s[at + 2])) << 8) |
         static_cast<uint32_t>(static_cast<uint8_t>(s[at + 3]));
}

// Bitwise CRC-32 (ISO 3309, reflected polynomial 0xEDB88320), as the PNG spec defines it.
uint32_t Crc32(const std::string& bytes) {
  uint32_t c = 0xFFFFFFFFu;
  for (char ch : bytes) {
    c ^= static_cast<uint8_t>(ch);
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return c ^ 0xFFFFFFFFu;
}

// Splits a PNG into chunks; fails the test on truncation.
std::vector<Chunk> ParseChunks(const std::string& png) {
  std::vector<Chunk> chunks;
  size_t at = 8;
  while (at < png.size()) {
    EXPECT_LE(at + 12, png.size());
    if (at + 12 > png.size()) break;
    const uint32_t len = U32(png, at);
    EXPECT_LE(at + 12 + len, png.size());
    if (at + 12 + len > png.size()) break;
    Chunk c;
    c.type = png.substr(at + 4, 4);
    c.data = png.substr(at + 8, len);
    c.crc = U32(png, at + 8 + len);
    chunks.push_back(c);
    at += 12 + len;
  }
  return chunks;
}

std::string Inflate(const std::string& z, size_t expected_size) {
  std::string out(expected_size + 16, '\0');  // room to notice extra bytes
  uLongf size = out.size();
  const int rc = uncompress(reinterpret_cast<Bytef*>(&out[0]), &size,
                            reinterpret_cast<const Bytef*>(z.data()), z.size());
  EXPECT_EQ(rc, Z_OK);
  out.resize(size);
  return out;
}

// Reverses the PNG filters (spec section 9) for 3-byte pixels.
std::vector<uint8_t> Unfilter(const std::string& raw, int width, int height,
                              std::vector<int>* types) {
  const size_t stride = static_cast<size_t>(width) * 3;
  std::vector<uint8_t> px(stride * height);
  for (int y = 0; y < height; ++y) {
    const int type = static_cast<uint8_t>(raw[y * (stride + 1)]);
    types->push_back(type);
    for (size_t i = 0; i < stride; ++i) {
      const int x = static_cast<uint8_t>(raw[y * (stride + 1) + 1 + i]);
      const int a = i >= 3 ? px[y * stride + i - 3] : 0;
      const int b = y > 0 ? px[(y - 1) * stride + i] : 0;
      const int c = (i >= 3 && y > 0) ? px[(y - 1) * stride + i - 3] : 0;
      int pred = 0;
      if (type == 1) pred = a;
      if (type == 2) pred = b;
      if (type == 3) pred = (a + b) >> 1;
      if (type == 4) {
        const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
        pred = (pa <= pb && pa <= pc) ? a : (pb <= pc ? b : c);
      }
      px[y * stride + i] = static_cast<uint8_t>(x + pred);
    }
  }
  return px;
}

// Checks signature, chunk order, every CRC and IHDR, and returns the decoded pixels.
std::vector<uint8_t> Decode(const std::string& png, int width, int height, std::vector<int>* types,
                            int* idat_count = nullptr) {
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  const std::vector<Chunk> chunks = ParseChunks(png);
  EXPECT_GE(chunks.size(), 3u);
  if (chunks.size() < 3) return {};
  EXPECT_EQ(chunks.front().type, "IHDR");
  EXPECT_EQ(chunks.back().type, "IEND");
  EXPECT_TRUE(chunks.back().data.empty());
  std::string zdata;
  int idats = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    EXPECT_EQ(c.crc, Crc32(c.type + c.data)) << "CRC of chunk " << i << " " << c.type;
    if (c.type == "IDAT") {
      zdata += c.data;
      ++idats;
    } else if (i != 0 && i + 1 != chunks.size()) {
      ADD_FAILURE() << "unexpected chunk " << c.type;
    }
  }
  if (idat_count) *idat_count = idats;
  const std::string& ihdr = chunks.front().data;
  EXPECT_EQ(ihdr.size(), 13u);
  EXPECT_EQ(U32(ihdr, 0), static_cast<uint32_t>(width));
  EXPECT_EQ(U32(ihdr, 4), static_cast<uint32_t>(height));
  EXPECT_EQ(ihdr.substr(8), std::string("\x08\x02\x00\x00\x00", 5));  // 8-bit RGB, no interlace
  const size_t raw_size = (static_cast<size_t>(width) * 3 + 1) * height;
  const std::string raw = Inflate(zdata, raw_size);
  EXPECT_EQ(raw.size(), raw_size);  // exactly the filtered rows
  if (raw.size() != raw_size) return {};
  return Unfilter(raw, width, height, types);
}

std::vector<uint8_t> Gradient(int w, int h) {
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &px[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = static_cast<uint8_t>(x * 255 / std::max(1, w - 1));
      p[1] = static_cast<uint8_t>(y * 255 / std::max(1, h - 1));
      p[2] = static_cast<uint8_t>((x * 7 + y * 13) % 256);
    }
  }
  return px;
}

TEST(PngEncoder, OnePixelByHand) {
  const uint8_t red[3] = {255, 0, 0};
  const std::string png = EncodePng(red, 1, 1, PngOptions{6, /*adaptive_filter=*/false});
  // 8 signature + IHDR (12 + 13) + IDAT (12 + zlib) + IEND (12).
  ASSERT_GT(png.size(), 8u + 25 + 12 + 12);
  // IEND's CRC is the well-known AE 42 60 82.
  EXPECT_EQ(png.substr(png.size() - 12), std::string("\0\0\0\0IEND\xAE\x42\x60\x82", 12));
  std::vector<int> types;
  const std::vector<uint8_t> px = Decode(png, 1, 1, &types);
  EXPECT_EQ(px, (std::vector<uint8_t>{255, 0, 0}));
  EXPECT_EQ(types, (std::vector<int>{0}));
}

TEST(PngEncoder, FilterNoneInflatesToRawRows) {
  const int w = 5, h = 3;
  const std::vector<uint8_t> px = Gradient(w, h);
  const std::string png = EncodePng(px.data(), w, h, PngOptions{9, false});
  std::vector<int> types;
  EXPECT_EQ(Decode(png, w, h, &types), px);
  EXPECT_EQ(types, (std::vector<int>{0, 0, 0}));
}

TEST(PngEncoder, AdaptiveFiltersRoundTrip) {
  for (auto [w, h] : {std::pair{64, 48}, std::pair{1, 7}, std::pair{7, 1}, std::pair{33, 17}}) {
    const std::vector<uint8_t> px = Gradient(w, h);
    const std::string png = EncodePng(px.data(), w, h);
    std::vector<int> types;
    EXPECT_EQ(Decode(png, w, h, &types), px) << w << "x" << h;
    for (int t : types) EXPECT_LE(t, 4);
    if (w == 64) {
      // A smooth gradient picks a predicting filter on some row and compresses better than None.
      bool predicted = false;
      for (int t : types) predicted = predicted || t != 0;
      EXPECT_TRUE(predicted);
      EXPECT_LT(png.size(), EncodePng(px.data(), w, h, PngOptions{6, false}).size());
    }
  }
}

TEST(PngEncoder, NoiseSpansSeveralIdatChunks) {
  const int w = 700, h = 700;  // 1.47 MB of incompressible bytes -> more than one 1 MiB IDAT
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  std::mt19937 rng(42);
  for (auto& b : px) b = static_cast<uint8_t>(rng());
  const std::string png = EncodePng(px.data(), w, h);
  std::vector<int> types;
  int idats = 0;
  EXPECT_EQ(Decode(png, w, h, &types, &idats), px);
  EXPECT_GE(idats, 2);
}

// Note [Parallel deflate]: pieces of rows deflated apart decode as one stream (with zlib's
// Adler-32 check), and the threads that encode them never change the bytes.
TEST(PngEncoder, PiecesDecodeAsOneStreamWhateverTheThreads) {
  const int w = 97, h = 200;
  std::vector<uint8_t> px = Gradient(w, h);
  std::mt19937 rng(7);
  for (size_t i = 0; i < px.size(); i += 5) px[i] = static_cast<uint8_t>(rng());
  for (int rows : {1, 16, 64, 200, 1000}) {
    PngOptions one;
    one.rows_per_piece = rows;
    one.threads = 1;
    const std::string png = EncodePng(px.data(), w, h, one);
    std::vector<int> types;
    EXPECT_EQ(Decode(png, w, h, &types), px) << rows << " rows per piece";
    for (int threads : {0, 3, 64}) {
      PngOptions many = one;
      many.threads = threads;
      EXPECT_EQ(EncodePng(px.data(), w, h, many), png) << rows << " rows, " << threads;
    }
  }
}

// Rows made for each filter to win the minimum-sum choice: zeros (None), ramps along the row on
// random bases (Sub), random rows each one above the last (Up), each byte the mean of its left
// and upper neighbours (Average), and a random per-row term plus a random per-column term whose
// steps alternate between small and large (Paeth takes the smaller per pixel). Every filter's
// bytes must unfilter back to the pixels (the decoder here is independent of the encoder).
TEST(PngEncoder, EveryFilterIsChosenAndRoundTrips) {
  const int w = 48, band = 6, h = 5 * band;
  const size_t stride = static_cast<size_t>(w) * 3;
  std::vector<uint8_t> px(stride * h, 0);
  std::mt19937 rng(11);
  auto at = [&](int y, size_t i) -> uint8_t& { return px[static_cast<size_t>(y) * stride + i]; };
  std::vector<int> column(stride);
  for (size_t i = 0; i < stride; ++i) column[i] = (i / 3) % 2 ? 40 + rng() % 8 : rng() % 8;
  for (int y = band; y < h; ++y) {
    const int base = static_cast<int>(rng() % 256);
    for (size_t i = 0; i < stride; ++i) {
      switch (y / band) {
        case 1:  // Sub
          at(y, i) = static_cast<uint8_t>(base + 2 * static_cast<int>(i / 3));
          break;
        case 2:  // Up
          at(y, i) = y % band == 0 ? static_cast<uint8_t>(rng()) : at(y - 1, i) + 1;
          break;
        case 3:  // Average
          at(y, i) = y % band == 0 || i < 3
                         ? static_cast<uint8_t>(rng())
                         : static_cast<uint8_t>((at(y, i - 3) + at(y - 1, i)) / 2);
          break;
        default: {  // Paeth
          int sum = 0;
          for (size_t k = i % 3; k <= i; k += 3) sum += column[k];
          at(y, i) = static_cast<uint8_t>(base * 3 + sum);
        }
      }
    }
  }
  const std::string png = EncodePng(px.data(), w, h);
  std::vector<int> types;
  EXPECT_EQ(Decode(png, w, h, &types), px);
  ASSERT_EQ(types.size(), static_cast<size_t>(h));
  for (int f = 0; f < 5; ++f) {
    // The band's rows after its first (which follows another band's last row); ties and the
    // first pixel's bytes may hand a row to another filter, but not the whole band.
    int chosen = 0;
    for (int y = f * band + 1; y < (f + 1) * band; ++y) chosen += types[y] == f;
    EXPECT_GE(chosen, 2) << "filter " << f;
  }
}

// Note [Run-length deflate]: run-length deflate (the default) and string matching are two
// encodings of the same pixels.
TEST(PngEncoder, RunsAndMatchesDecodeToTheSamePixels) {
  const int w = 130, h = 90;
  std::vector<uint8_t> px = Gradient(w, h);
  std::mt19937 rng(3);
  for (size_t i = 0; i < px.size(); i += 7) px[i] = static_cast<uint8_t>(rng());
  PngOptions runs;
  runs.rows_per_piece = 16;
  EXPECT_EQ(runs.search, PngOptions::Search::kRuns);
  const std::string by_runs = EncodePng(px.data(), w, h, runs);
  EXPECT_EQ(by_runs, EncodePng(px.data(), w, h, PngOptions{6, true, 16}));
  std::vector<int> types;
  EXPECT_EQ(Decode(by_runs, w, h, &types), px);
  for (int level : {1, 6, 9}) {
    PngOptions matches = runs;
    matches.search = PngOptions::Search::kMatches;
    matches.compression_level = level;
    const std::string by_matches = EncodePng(px.data(), w, h, matches);
    EXPECT_NE(by_matches, by_runs) << "level " << level;
    EXPECT_EQ(Decode(by_matches, w, h, &types), px) << "level " << level;
  }
}

TEST(PngEncoder, Deterministic) {
  const std::vector<uint8_t> px = Gradient(40, 30);
  const std::vector<uint8_t> copy = px;
  EXPECT_EQ(EncodePng(px.data(), 40, 30), EncodePng(copy.data(), 40, 30));
  std::vector<uint8_t> other = px;
  other[100] ^= 1;
  EXPECT_NE(EncodePng(px.data(), 40, 30), EncodePng(other.data(), 40, 30));
}

TEST(PngEncoder, RejectsBadInput) {
  const uint8_t px[3] = {1, 2, 3};
  EXPECT_EQ(EncodePng(nullptr, 1, 1), "");
  EXPECT_EQ(EncodePng(px, 0, 1), "");
  EXPECT_EQ(EncodePng(px, 1, 0), "");
  EXPECT_EQ(EncodePng(px, -4, 1), "");
}

}  // namespace
}  // namespace qpool
