#include "util/png_encoder.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <thread>
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
// The most filtered bytes in one piece (Note [Parallel deflate]).
constexpr size_t kMaxPiece = size_t{256} << 20;

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

// Writes filter `type` of `row` (previous row `prev`, zeros for the first) into out[0..n). One
// loop per type with no branch on the byte's position, so the compiler vectorizes each: the
// first pixel, whose left neighbours a and c are 0, is written apart (Sub and None copy it,
// Average and Paeth predict b / 2 and b).
void FilterRow(int type, const uint8_t* row, const uint8_t* prev, size_t n, uint8_t* out) {
  const size_t head = std::min<size_t>(kBpp, n);
  for (size_t i = 0; i < head; ++i) {
    const int b = prev[i];
    const int pred = type == 2 || type == 4 ? b : type == 3 ? b / 2 : 0;
    out[i] = static_cast<uint8_t>(row[i] - pred);
  }
  switch (type) {
    case 1:
      for (size_t i = head; i < n; ++i) out[i] = static_cast<uint8_t>(row[i] - row[i - kBpp]);
      break;
    case 2:
      for (size_t i = head; i < n; ++i) out[i] = static_cast<uint8_t>(row[i] - prev[i]);
      break;
    case 3:
      for (size_t i = head; i < n; ++i) {
        out[i] = static_cast<uint8_t>(row[i] - ((row[i - kBpp] + prev[i]) >> 1));
      }
      break;
    case 4:
      // Paeth: p = a + b - c, and the neighbour nearest p, ties to a then b; |p - a| = |b - c|,
      // |p - b| = |a - c|, |p - c| = |a + b - 2c|.
      for (size_t i = head; i < n; ++i) {
        const int a = row[i - kBpp], b = prev[i], c = prev[i - kBpp];
        const int pa = std::abs(b - c), pb = std::abs(a - c), pc = std::abs(a + b - 2 * c);
        const int pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
        out[i] = static_cast<uint8_t>(row[i] - pred);
      }
      break;
    default:
      std::copy(row + head, row + n, out + head);
      break;
  }
}

// Sum of the filtered bytes taken as signed: libpng's heuristic for choosing a filter.
uint64_t Cost(const uint8_t* f, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum += f[i] < 128 ? f[i] : 256 - f[i];
  return sum;
}

// Note [Parallel deflate]
// Deflating a generated image's rows took longer than decoding it on the GPU, one core at a time.
// The filtered rows are cut into pieces of rows_per_piece rows, and each piece is deflated by its
// own raw deflate stream: every piece but the last ends with a full flush (byte-aligned, and the
// next piece refers to nothing before it), the last with the final block. Their concatenation
// is one valid deflate stream; the zlib wrapper's Adler-32 is combined from the pieces'. A row's
// filter reads the previous row of the image, not of the piece, so filtering splits the same
// way. Each piece compresses from an empty window, so the pieces come out slightly larger than
// one stream.

// Note [Run-length deflate]
// Every generated image is encoded on the request path, and zlib's string matching (its default
// strategy) is what costs there, most of all on smooth images, where level 6 searches long hash
// chains of near-repeats. Once rows are filtered (Sub, Up, Average, Paeth), what repeats in an
// image is mostly runs of one byte (zero differences in flat regions), which Z_RLE finds without
// searching the window, and Huffman coding does the rest. On the adaptively filtered rows of
// smooth, textured and noise images it is faster than level 6 and level 1, and its files are
// smaller than level 6's, or as large on noise, which nothing compresses (bench/png_bench;
// bench/results/png_cpu.json). The stream is ordinary deflate: any decoder reads it.

struct Piece {
  std::vector<uint8_t> deflated;
  uLong adler = 0;
  uLong size = 0;  // filtered bytes
  bool ok = false;
};

// How every piece is filtered and deflated, derived from PngOptions once per image.
struct PieceSettings {
  bool adaptive_filter = true;
  int level = Z_DEFAULT_COMPRESSION;  // zlib's, in [0, 9] or Z_DEFAULT_COMPRESSION
  int strategy = Z_RLE;               // zlib's
};

// Filters rows [first, last) of the image and deflates them: the stream's final block when
// `final_piece`, else ending with a full flush.
void EncodePiece(const uint8_t* rgb, size_t stride, int first, int last, bool final_piece,
                 const PieceSettings& settings, Piece* piece) {
  const size_t rows = static_cast<size_t>(last - first);
  std::vector<uint8_t> filtered((stride + 1) * rows);
  const std::vector<uint8_t> zeros(stride, 0);
  std::array<std::vector<uint8_t>, 5> candidates;
  for (auto& c : candidates) c.resize(stride);
  for (int y = first; y < last; ++y) {
    const uint8_t* row = rgb + static_cast<size_t>(y) * stride;
    const uint8_t* prev = y > 0 ? row - stride : zeros.data();
    uint8_t* out = filtered.data() + static_cast<size_t>(y - first) * (stride + 1);
    int best = 0;
    if (settings.adaptive_filter) {
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
  piece->size = static_cast<uLong>(filtered.size());
  piece->adler = adler32_z(adler32(0L, Z_NULL, 0), filtered.data(), filtered.size());

  z_stream z{};
  if (deflateInit2(&z, settings.level, Z_DEFLATED, /*windowBits=*/-15, 8, settings.strategy) !=
      Z_OK) {
    return;
  }
  // deflateBound covers the final block; a full flush adds at most a few bytes.
  piece->deflated.resize(deflateBound(&z, piece->size) + 16);
  z.next_in = filtered.data();
  z.avail_in = static_cast<uInt>(piece->size);
  z.next_out = piece->deflated.data();
  z.avail_out = static_cast<uInt>(piece->deflated.size());
  const int flush = final_piece ? Z_FINISH : Z_FULL_FLUSH;
  const int done = deflate(&z, flush);
  const bool ok = final_piece ? done == Z_STREAM_END : (done == Z_OK && z.avail_in == 0);
  piece->deflated.resize(piece->deflated.size() - z.avail_out);
  deflateEnd(&z);
  piece->ok = ok && z.avail_out > 0;
}

}  // namespace

std::string EncodePng(const uint8_t* rgb, int width, int height, const PngOptions& options) {
  if (rgb == nullptr || width < 1 || height < 1 ||
      width > (std::numeric_limits<int32_t>::max() - 1) / kBpp) {
    return "";
  }
  const size_t stride = static_cast<size_t>(width) * kBpp;
  PieceSettings settings;
  settings.adaptive_filter = options.adaptive_filter;
  settings.level = options.compression_level;
  if (settings.level < 0 || settings.level > 9) settings.level = Z_DEFAULT_COMPRESSION;
  settings.strategy = options.search == PngOptions::Search::kRuns ? Z_RLE : Z_DEFAULT_STRATEGY;
  // A piece stays below kMaxPiece bytes, so zlib's 32-bit counts hold it (a piece is one row at
  // least: a row is below 2^31 bytes).
  const int rows_per_piece = static_cast<int>(
      std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(std::max(1, options.rows_per_piece)),
                                           kMaxPiece / (stride + 1))));
  const int pieces = (height + rows_per_piece - 1) / rows_per_piece;
  std::vector<Piece> encoded(static_cast<size_t>(pieces));
  std::atomic<int> next{0};
  auto work = [&] {
    for (int p = next++; p < pieces; p = next++) {
      const int first = p * rows_per_piece;
      const int last = std::min(height, first + rows_per_piece);
      EncodePiece(rgb, stride, first, last, p == pieces - 1, settings,
                  &encoded[static_cast<size_t>(p)]);
    }
  };
  int threads = options.threads;
  if (threads <= 0) {
    threads = std::min<int>(
        {pieces, 8, static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))});
  }
  threads = std::min(threads, pieces);
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (auto& h : helpers) h.join();

  // The zlib stream: header (deflate, 32 KiB window, no dictionary), the pieces, Adler-32.
  std::vector<uint8_t> compressed{0x78, 0x9C};
  uLong adler = adler32(0L, Z_NULL, 0);
  for (const Piece& piece : encoded) {
    if (!piece.ok) return "";
    compressed.insert(compressed.end(), piece.deflated.begin(), piece.deflated.end());
    adler = adler32_combine(adler, piece.adler, static_cast<z_off_t>(piece.size));
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    compressed.push_back(static_cast<uint8_t>((adler >> shift) & 0xFF));
  }
  const size_t compressed_size = compressed.size();

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
