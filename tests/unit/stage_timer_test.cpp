// StageTimer on the CPU: boundaries on the host's clock, stages that add up.
#include "pipeline/stage_timer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace qpool {
namespace {

TEST(StageTimer, CpuStagesTakeTheHostsTimeAndAddUp) {
  StageTimer timer(c10::Device(c10::kCPU));
  const size_t begin = timer.Mark();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const size_t middle = timer.Mark();
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const size_t end = timer.Mark();
  EXPECT_EQ(middle, begin + 1);
  EXPECT_EQ(end, begin + 2);
  EXPECT_GE(timer.Seconds(begin, middle), 0.020);
  EXPECT_GE(timer.Seconds(middle, end), 0.010);
  EXPECT_DOUBLE_EQ(timer.Seconds(begin, end),
                   timer.Seconds(begin, middle) + timer.Seconds(middle, end));
  EXPECT_DOUBLE_EQ(timer.Seconds(middle, middle), 0.0);
}

TEST(StageTimer, AnUnmarkedBoundaryThrows) {
  StageTimer timer(c10::Device(c10::kCPU));
  const size_t begin = timer.Mark();
  EXPECT_THROW(timer.Seconds(begin, begin + 1), std::out_of_range);
}

}  // namespace
}  // namespace qpool
