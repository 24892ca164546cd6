// LeakCheck (Note [Leak check]): a block something still references is retained; a GPU whose
// allocator did not get a block's bytes back has a shortfall; a clean drop finds nothing.
#include "memory/leak_check.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <deque>

#include "memory/arena_allocator.h"

namespace qpool {
namespace {

// Answers Read with scripted allocated bytes per call, in order.
class ScriptedMemory final : public DeviceMemory {
 public:
  explicit ScriptedMemory(const ArenaAllocator& arenas) : DeviceMemory(arenas) {}
  DeviceMemoryStats Read(const c10::Device& device) const override {
    DeviceMemoryStats stats;
    stats.device = device.str();
    if (!device.is_cpu() && !allocated_.empty()) {
      stats.allocated_bytes = allocated_.front();
      allocated_.pop_front();
    }
    return stats;
  }
  mutable std::deque<uint64_t> allocated_;
};

HeldBlock Block(const torch::Tensor& t, const c10::Device& device, uint64_t allocator_bytes) {
  return {t.storage().getWeakStorageImpl(), device, static_cast<uint64_t>(t.nbytes()),
          allocator_bytes};
}

TEST(LeakCheck, ABlockStillReferencedIsRetained) {
  torch::Tensor kept = torch::zeros({256});
  torch::Tensor dropped = torch::zeros({128});
  LeakCheck check(
      nullptr, {Block(kept, c10::Device(c10::kCPU), 0), Block(dropped, c10::Device(c10::kCPU), 0)},
      c10::Device(c10::kCPU));
  dropped = torch::Tensor();
  const LeakReport report = check.Finish();
  EXPECT_EQ(report.retained_bytes, 256u * 4);
  EXPECT_EQ(report.shortfall_bytes, 0u);
  EXPECT_EQ(report.leaked_bytes(), 256u * 4);
  ASSERT_EQ(check.devices().size(), 1u);
  EXPECT_TRUE(check.devices()[0].is_cpu());
}

TEST(LeakCheck, AGpuThatDidNotGetItsBytesBackHasAShortfall) {
  ArenaAllocator arenas;
  ScriptedMemory memory(arenas);
  const c10::Device gpu(c10::kCUDA, 0);
  torch::Tensor block = torch::zeros({16});  // stands in for a GPU block: only its bytes count
  // Before the drop 10 MiB were allocated; the block was counted as 4 MiB; afterwards 7 MiB.
  memory.allocated_ = {10u << 20, 7u << 20};
  LeakCheck check(&memory, {Block(block, gpu, 4u << 20)}, gpu);
  block = torch::Tensor();
  const LeakReport report = check.Finish();
  EXPECT_EQ(report.retained_bytes, 0u);
  EXPECT_EQ(report.shortfall_bytes, 1u << 20);
  EXPECT_EQ(check.before(gpu).allocated_bytes, 10u << 20);
  ASSERT_EQ(check.devices().size(), 2u);  // the CPU first, then the GPU
  EXPECT_EQ(check.devices()[1], gpu);
}

TEST(LeakCheck, ACleanDropFindsNothing) {
  ArenaAllocator arenas;
  ScriptedMemory memory(arenas);
  const c10::Device gpu(c10::kCUDA, 1);
  torch::Tensor block = torch::zeros({16});
  memory.allocated_ = {8u << 20, 4u << 20};
  LeakCheck check(&memory, {Block(block, gpu, 4u << 20)}, c10::Device(c10::kCUDA, 0));
  block = torch::Tensor();
  EXPECT_EQ(check.Finish().leaked_bytes(), 0u);
  // The replica's own device is read too, even without blocks there.
  EXPECT_EQ(check.devices().size(), 3u);
}

}  // namespace
}  // namespace qpool
