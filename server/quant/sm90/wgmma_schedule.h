// The tile schedule of the sm_90a quant_linear kernel (quant_wgmma_kernels.cu), shared by the
// host (grid, workspace) and the device (each block's segments); tested on the CPU
// (tests/unit/wgmma_schedule_test.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "quant/quant_kernels.h"

namespace qpool::quant::cuda::sm90 {

// Note [Stream-K schedule]
// Data-parallel: block b writes tiles b, b + blocks, ... (blocks = min(tiles, multiprocessors)),
// so the blocks of a wave share rows of x and the weight's rows in L2. When the tiles fill the
// last wave badly and the k-loop is deep, stream-K instead: the work is tiles x k_blocks k-block
// iterations, the tiles' iterations in order, and block b takes iterations [work b / blocks,
// work (b + 1) / blocks), the same share for every block. A share is a sequence of segments,
// each a range of k-blocks of one tile:
// - a segment from the tile's k-block 0 to its end: the block writes the tile (epilogue);
// - a segment that does not start at k-block 0 (only a block's first one): a contribution. The
//   block stores its f32 sums in its workspace slot and sets its flag (release);
// - a segment from k-block 0 that stops early (only a block's last one): the block owns the
//   tile. It waits for the flags of the following blocks that contribute to the tile (acquire),
//   adds their slots in block order (deterministic sums) and writes the tile. The flags are
//   zeroed before each launch that splits a tile.
// Contributions come first in their blocks and owners last, so owners rarely wait; a block waits
// only for blocks after it, which never wait for it: no cycle. MakeSchedule picks stream-K when
// its share plus kSplitCost k-blocks is under 0.9 of the data-parallel blocks' tiles x k_blocks.
// kSplitCost = 16: over every layer, M and tile of bench/results/quant_linear_large_m_h100.json,
// 12-16 chose the faster of the forced schedules most often (fewer clearly slower choices than
// the 24 used before or 8).
// Where a split's time goes (a %globaltimer trace of each block's phases; `harness.py
// splitcost` in bench/quant_large_m): the contributor issues its f32 sums (128 KB for a 256-row
// tile) at the multiprocessor's store rate to L2 and then waits for its flag to be set; the
// owner, done with its own k-range at the same time, waits for that flag and then reads the
// sums before its usual epilogue. So one split costs several k-blocks of the same work unsplit
// (less since the contributor's threads stopped fencing one by one before its single release),
// which kSplitCost stands for. 16-byte stores and loads of the sums measured the same as 4-byte
// ones. Cheaper splits need the sums off L2: a reduction through distributed shared memory
// between the blocks of a cluster, or a bulk store from shared memory that overlaps the block's
// next segment.
inline constexpr int kSplitCost = 16;

// Note [Tile raster]
// Output tile t (128 features x `rows` rows of x) sits at row tile m and feature tile n given by
// bands of `group` row tiles: the tiles of a band are its row tiles times every feature tile,
// row tiles fastest (the last band may be shorter). Consecutive tiles, and so the blocks of a
// wave, share a band of x that stays in L2 while the weight streams past it. MakeSchedule sizes
// the band to kRasterBandBytes of x; with the band as tall as x (small M) this is the plain
// order, row tiles fastest. The plain order read x again for every wave of features once x
// outgrew L2 (K = 3072, M = 8192: 50 MB of x). Side by side, at M = 8192 bands made the Flux
// layers and SDXL's feed-forward faster; at M = 4096 and below the differences were within the
// run's spread (bench/results/quant_linear_tile_raster_h100.json).
inline constexpr int64_t kRasterBandBytes = int64_t{16} << 20;  // of an H100's 50 MB of L2

struct TileRaster {
  int m_tiles = 1;  // row tiles of x
  int n_tiles = 1;  // feature tiles
  int group = 1;    // row tiles per band, 1..m_tiles
  __host__ __device__ void Origin(int tile, int& m_tile, int& n_tile) const {
    const int band = tile / (group * n_tiles);
    const int first = band * group;
    const int rows = m_tiles - first < group ? m_tiles - first : group;
    const int i = tile - band * group * n_tiles;
    m_tile = first + i % rows;
    n_tile = i / rows;
  }
};

// The raster of m_tiles x n_tiles tiles whose row tiles each hold `row_tile_bytes` of x.
inline TileRaster PlanRaster(int m_tiles, int n_tiles, int64_t row_tile_bytes) {
  TileRaster r;
  r.m_tiles = m_tiles;
  r.n_tiles = n_tiles;
  const int64_t fit = kRasterBandBytes / std::max<int64_t>(row_tile_bytes, 1);
  r.group = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(m_tiles, fit)));
  return r;
}

struct Schedule {
  int64_t work = 0;  // tiles x k_blocks
  int tiles = 0;
  int k_blocks = 0;
  int blocks = 1;
  bool stream_k = false;
  TileRaster raster;  // where each tile sits (Note [Tile raster])
  // The first row of x (`rows` per tile) and the first feature of tile `tile`.
  __host__ __device__ void TileStart(int tile, int rows, int& m0, int& n0) const {
    int m_tile = 0, n_tile = 0;
    raster.Origin(tile, m_tile, n_tile);
    m0 = m_tile * rows;
    n0 = n_tile * 128;
  }
  // First iteration of block b's stream-K share.
  __host__ __device__ int64_t Begin(int b) const { return work * b / blocks; }
  // Whether block c, after the owner of a tile whose iterations end before `tile_end`,
  // contributes to that tile.
  __host__ __device__ bool Contributes(int c, int64_t tile_end) const {
    return c < blocks && Begin(c) < tile_end;
  }
};

// The segments of a block in order: Next() gives the tile and its k-blocks [first, last).
struct SegmentCursor {
  const Schedule& sched;
  int64_t pos, end;
  __host__ __device__ SegmentCursor(const Schedule& s, int b)
      : sched(s), pos(s.stream_k ? s.Begin(b) : b), end(s.stream_k ? s.Begin(b + 1) : s.tiles) {}
  __host__ __device__ bool Next(int& tile, int& first, int& last) {
    if (pos >= end) return false;
    if (!sched.stream_k) {
      tile = static_cast<int>(pos);
      first = 0;
      last = sched.k_blocks;
      pos += sched.blocks;
      return true;
    }
    tile = static_cast<int>(pos / sched.k_blocks);
    first = static_cast<int>(pos % sched.k_blocks);
    last =
        end - pos < sched.k_blocks - first ? first + static_cast<int>(end - pos) : sched.k_blocks;
    pos += last - first;
    return true;
  }
};

// The schedule of `tiles` output tiles of `k_blocks` k-blocks each on `sm_count`
// multiprocessors (tiles < 2^31, k_blocks >= 1). `x_in_l2`: x fits a raster band (Note [Tile
// raster]). The automatic choice takes stream-K at three waves or more only then: contiguous
// shares put the blocks that share rows of x at different k positions, and on Flux MLP down at
// M = 4608-6144 (113-151 MB of x) stream-K ran at 1.57-1.87x fp16 against 1.07-1.32x
// data-parallel, while it won with 0.9 MB of x (Flux MLP up at M = 154, 64-row tiles).
inline Schedule PlanSchedule(int64_t tiles, int k_blocks, int sm_count, WgmmaSchedule mode,
                             bool x_in_l2 = true) {
  Schedule sched;
  sched.k_blocks = k_blocks;
  sched.tiles = static_cast<int>(tiles);
  sched.work = tiles * k_blocks;
  const int64_t waves = (tiles + sm_count - 1) / sm_count;
  const double share = static_cast<double>(sched.work) / sm_count + kSplitCost;
  sched.stream_k =
      mode == WgmmaSchedule::kAuto
          ? share < 0.9 * static_cast<double>(waves * k_blocks) && (waves <= 2 || x_in_l2)
          : mode == WgmmaSchedule::kStreamK;
  // Stream-K: every block gets at least one k-block (an owner waits for each block after it that
  // starts inside its tile).
  sched.blocks = static_cast<int>(std::min<int64_t>(sched.stream_k ? sched.work : tiles, sm_count));
  return sched;
}

// Whether a schedule splits any tile between blocks (and so needs the workspace).
inline bool SplitsTiles(const Schedule& sched) {
  for (int b = 1; sched.stream_k && b < sched.blocks; ++b) {
    if (sched.Begin(b) % sched.k_blocks != 0) return true;
  }
  return false;
}

}  // namespace qpool::quant::cuda::sm90
