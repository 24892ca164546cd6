// The sm_90a quant_linear kernel's tile schedule (Note [Stream-K schedule]) on the CPU: the
// kernel's blocks walk the same SegmentCursor and the owners wait on Schedule::Contributes, so a
// gap, an overlap or a wrong wait list here is a wrong result or a hang on the GPU.
#include "quant/sm90/wgmma_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace qpool::quant::cuda::sm90 {
namespace {

struct Segment {
  int block, tile, first, last;
};

std::vector<std::vector<Segment>> SegmentsOf(const Schedule& sched) {
  std::vector<std::vector<Segment>> blocks(sched.blocks);
  for (int b = 0; b < sched.blocks; ++b) {
    SegmentCursor cursor(sched, b);
    int tile = 0, first = 0, last = 0;
    while (cursor.Next(tile, first, last)) blocks[b].push_back({b, tile, first, last});
  }
  return blocks;
}

// Every k-block of every tile in exactly one segment; contributions only first and owned split
// tiles only last in their blocks; each owner's wait list is exactly the tile's contributors.
void ExpectSound(const Schedule& sched, const std::string& what) {
  const auto blocks = SegmentsOf(sched);
  std::map<int, std::vector<Segment>> by_tile;
  std::map<int, std::vector<int>> contributors;  // tile -> blocks
  bool split = false;
  for (const auto& segments : blocks) {
    ASSERT_FALSE(segments.empty()) << what << ": block with no work";
    for (size_t i = 0; i < segments.size(); ++i) {
      const Segment& s = segments[i];
      ASSERT_LT(s.first, s.last) << what;
      by_tile[s.tile].push_back(s);
      if (s.first > 0) {
        EXPECT_EQ(i, 0u) << what << ": a contribution that is not its block's first segment";
        contributors[s.tile].push_back(s.block);
        split = true;
      } else if (s.last < sched.k_blocks) {
        EXPECT_EQ(i, segments.size() - 1) << what << ": an owner that is not its block's last";
      }
    }
  }
  ASSERT_EQ(static_cast<int>(by_tile.size()), sched.tiles) << what;
  for (auto& [tile, segments] : by_tile) {
    std::sort(segments.begin(), segments.end(),
              [](const Segment& a, const Segment& b) { return a.first < b.first; });
    int next = 0;
    for (const Segment& s : segments) {
      EXPECT_EQ(s.first, next) << what << ": tile " << tile;
      next = s.last;
    }
    EXPECT_EQ(next, sched.k_blocks) << what << ": tile " << tile;
    const Segment& owner = segments.front();
    std::vector<int> waits;
    if (owner.last < sched.k_blocks) {
      const int64_t tile_end = int64_t{tile + 1} * sched.k_blocks;
      for (int c = owner.block + 1; sched.Contributes(c, tile_end); ++c) waits.push_back(c);
    }
    EXPECT_EQ(waits, contributors[tile]) << what << ": tile " << tile;
  }
  EXPECT_EQ(SplitsTiles(sched), split) << what;
}

TEST(WgmmaSchedule, EveryScheduleCoversEachTileOnceAndOwnersWaitForExactlyTheirContributors) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> tiles_of(1, 600), k_of(1, 200), sms_of(1, 132);
  for (int i = 0; i < 3000; ++i) {
    const int64_t tiles = tiles_of(rng);
    const int k_blocks = k_of(rng), sms = sms_of(rng);
    for (WgmmaSchedule mode :
         {WgmmaSchedule::kAuto, WgmmaSchedule::kDataParallel, WgmmaSchedule::kStreamK}) {
      const Schedule sched = PlanSchedule(tiles, k_blocks, sms, mode);
      const std::string what = std::to_string(tiles) + " tiles x " + std::to_string(k_blocks) +
                               " k-blocks on " + std::to_string(sms) + " SMs, mode " +
                               std::to_string(static_cast<int>(mode));
      ASSERT_GE(sched.blocks, 1) << what;
      ASSERT_LE(sched.blocks, sms) << what;
      ExpectSound(sched, what);
      if (HasFatalFailure()) return;
    }
  }
}

// The automatic choice on the benchmark shapes (Note [Stream-K schedule]): stream-K where few
// deep tiles leave most of an H100's 132 multiprocessors idle, data-parallel where the tiles fill
// the waves or the k-loop is short.
TEST(WgmmaSchedule, AutomaticChoiceFollowsTheMeasurements) {
  auto stream_k = [](int64_t n, int64_t k, int64_t m, int rows) {
    const int64_t tiles = (n + 127) / 128 * ((m + rows - 1) / rows);
    const bool x_in_l2 = m * k * 2 <= kRasterBandBytes;
    return PlanSchedule(tiles, static_cast<int>(k / 64), 132, WgmmaSchedule::kAuto, x_in_l2)
        .stream_k;
  };
  EXPECT_TRUE(stream_k(3072, 12288, 77, 128));    // Flux MLP down: 24 tiles of 192 k-blocks
  EXPECT_TRUE(stream_k(3072, 12288, 1024, 256));  // 96 tiles of 192
  EXPECT_TRUE(stream_k(3072, 3072, 77, 128));     // Flux attention: 24 tiles of 48
  EXPECT_FALSE(stream_k(3072, 3072, 1024, 256));  // 96 tiles of 48: the split costs more
  EXPECT_FALSE(stream_k(12288, 3072, 77, 128));   // Flux MLP up: 96 tiles of 48
  EXPECT_TRUE(stream_k(12288, 3072, 512, 256));   // 192 tiles of 48: 1.45 waves
  EXPECT_FALSE(stream_k(12288, 3072, 4096, 256));
  EXPECT_FALSE(stream_k(10240, 1280, 77, 128));  // SDXL feed-forward: 80 tiles of 20
  EXPECT_FALSE(stream_k(320, 320, 4096, 256));   // 5 k-blocks: never worth a split
  // Three waves or more: only while x fits a raster band.
  EXPECT_TRUE(stream_k(12288, 3072, 154, 64));     // Flux MLP up, 288 tiles, 0.9 MB of x
  EXPECT_FALSE(stream_k(3072, 12288, 4608, 256));  // Flux MLP down, 432 tiles, 113 MB of x
  EXPECT_FALSE(stream_k(3072, 12288, 6144, 256));
}

// Note [Tile raster]: every tile lands on one row tile and one feature tile, each pair once, and
// the tiles of band b are exactly the row tiles of band b.
TEST(WgmmaSchedule, RasterPlacesEveryTileOnceBandByBand) {
  for (int m_tiles : {1, 3, 8, 17, 33}) {
    for (int n_tiles : {1, 5, 24}) {
      for (int group : {1, 2, 8, 40}) {
        TileRaster r;
        r.m_tiles = m_tiles;
        r.n_tiles = n_tiles;
        r.group = std::min(group, m_tiles);
        std::vector<int> seen(m_tiles * n_tiles, 0);
        for (int t = 0; t < m_tiles * n_tiles; ++t) {
          int m = -1, n = -1;
          r.Origin(t, m, n);
          const std::string what = std::to_string(m_tiles) + " x " + std::to_string(n_tiles) +
                                   ", group " + std::to_string(r.group) + ", tile " +
                                   std::to_string(t);
          ASSERT_TRUE(m >= 0 && m < m_tiles && n >= 0 && n < n_tiles) << what;
          EXPECT_EQ(m / r.group, t / (r.group * n_tiles)) << what;
          ++seen[m * n_tiles + n];
        }
        EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), m_tiles * n_tiles);
      }
    }
  }
}

TEST(WgmmaSchedule, RasterBandHoldsSixteenMegabytesOfX) {
  // 256 rows x 3072 values of fp16: 1.5 MB per row tile, 10 per band.
  EXPECT_EQ(PlanRaster(32, 96, 256 * 3072 * 2).group, 10);
  // A band as tall as x: the plain order, row tiles fastest.
  const TileRaster plain = PlanRaster(4, 24, 256 * 3072 * 2);
  EXPECT_EQ(plain.group, 4);
  for (int t = 0; t < 96; ++t) {
    int m = -1, n = -1;
    plain.Origin(t, m, n);
    EXPECT_EQ(m, t % 4);
    EXPECT_EQ(n, t / 4);
  }
  EXPECT_EQ(PlanRaster(9, 24, int64_t{256} * 65536 * 2).group, 1);  // a row tile beyond 16 MB
}

TEST(WgmmaSchedule, StreamKGivesEveryBlockWorkEvenWithFewerIterationsThanBlocks) {
  const Schedule sched = PlanSchedule(3, 5, 132, WgmmaSchedule::kStreamK);
  EXPECT_EQ(sched.blocks, 15);
  ExpectSound(sched, "3 tiles x 5 k-blocks, forced stream-K");
}

}  // namespace
}  // namespace qpool::quant::cuda::sm90
