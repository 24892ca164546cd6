// BatchQueue: which queued requests form a batch, and when (Note [Dynamic batching]).
#include "pool/batch_queue.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <utility>

namespace qpool {
namespace {

using Clock = std::chrono::steady_clock;

// A member that only has parameters: Take never runs anything.
class FakeMember final : public BatchMember {
 public:
  FakeMember(int width, int images, int steps = 20) {
    params_.width = width;
    params_.height = 64;
    params_.steps = steps;
    params_.num_images = images;
    params_.scheduler = "ddim";
    params_.guidance_scale = 7.5;
  }
  const GenerateParams& params() const override { return params_; }
  Pipeline& pipeline() override { throw std::logic_error("not used by Take"); }
  bool Start(bool, int) override { return false; }
  BatchItem Item(int, bool) override { return {}; }
  GenerateParams& mutable_params() { return params_; }

 private:
  GenerateParams params_;
};

std::shared_ptr<FakeMember> Member(int width, int images = 1) {
  return std::make_shared<FakeMember>(width, images);
}

BatchQueue Queue(int max_batch, double max_delay_ms) {
  BatchingSpec spec;
  spec.max_batch = max_batch;
  spec.max_delay_ms = max_delay_ms;
  return BatchQueue(spec);
}

TEST(BatchQueueTest, OffTakesOneAtATimeInArrivalOrder) {
  BatchQueue queue = Queue(1, 1000);
  auto a = Member(64), b = Member(64);
  queue.Add(a);
  queue.Add(b);
  const auto start = Clock::now();
  EXPECT_EQ(queue.Take(), (std::vector<std::shared_ptr<BatchMember>>{a}));
  EXPECT_EQ(queue.Take(), (std::vector<std::shared_ptr<BatchMember>>{b}));
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(500)) << "max_batch 1 never waits";
  EXPECT_TRUE(queue.Take().empty());
}

TEST(BatchQueueTest, TakesCompatibleMembersUpToMaxBatchImages) {
  BatchQueue queue = Queue(4, 0);
  auto a = Member(64), other_size = Member(128), b = Member(64, 2), c = Member(64, 2),
       d = Member(64);
  for (const auto& m : {a, other_size, b, c, d}) queue.Add(m);
  // a + b fill 3 of 4 images; c (2 more) does not fit, d does; other_size waits for its own.
  EXPECT_EQ(queue.Take(), (std::vector<std::shared_ptr<BatchMember>>{a, b, d}));
  EXPECT_EQ(queue.Take(), (std::vector<std::shared_ptr<BatchMember>>{other_size}));
  EXPECT_EQ(queue.Take(), (std::vector<std::shared_ptr<BatchMember>>{c}));
  EXPECT_EQ(queue.size(), 0u);
}

TEST(BatchQueueTest, StepsSchedulerAndGuidanceModeMustMatch) {
  BatchQueue queue = Queue(8, 0);
  auto a = Member(64), steps = Member(64), scheduler = Member(64), no_cfg = Member(64),
       other_scale = Member(64);
  steps->mutable_params().steps = 30;
  scheduler->mutable_params().scheduler = "euler";
  no_cfg->mutable_params().guidance_scale = 1.0;
  other_scale->mutable_params().guidance_scale = 3.0;  // still CFG: batched, own scale
  for (const auto& m : {a, steps, scheduler, no_cfg, other_scale}) queue.Add(m);
  EXPECT_EQ(queue.Take(), (std::vector<std::shared_ptr<BatchMember>>{a, other_scale}));
  EXPECT_EQ(queue.Take().size(), 1u);
  EXPECT_EQ(queue.Take().size(), 1u);
  EXPECT_EQ(queue.Take().size(), 1u);
}

TEST(BatchQueueTest, OldestMemberAloneMayExceedMaxBatch) {
  BatchQueue queue = Queue(2, 1000);
  auto big = Member(64, 4);
  queue.Add(big);
  EXPECT_EQ(queue.Take(), (std::vector<std::shared_ptr<BatchMember>>{big}));
}

// Takes from `queue` holding `first` while `late` is added 50 ms later; returns the batch and
// how long Take waited.
std::pair<std::vector<std::shared_ptr<BatchMember>>, Clock::duration> TakeWithLateArrival(
    BatchQueue& queue, const std::shared_ptr<BatchMember>& first,
    const std::shared_ptr<BatchMember>& late) {
  queue.Add(first);
  std::thread adder([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    queue.Add(late);
  });
  const auto start = Clock::now();
  auto batch = queue.Take();
  const auto waited = Clock::now() - start;
  adder.join();
  return {batch, waited};
}

TEST(BatchQueueTest, WaitsForTheBatchToFillUntilMaxDelay) {
  BatchQueue queue = Queue(3, 200);
  auto a = Member(64), b = Member(64);
  // a and b, after waiting out the delay for a third.
  auto [batch, waited] = TakeWithLateArrival(queue, a, b);
  EXPECT_EQ(batch, (std::vector<std::shared_ptr<BatchMember>>{a, b}));
  EXPECT_GE(waited, std::chrono::milliseconds(150));
  EXPECT_LT(waited, std::chrono::seconds(5));
}

TEST(BatchQueueTest, AFullBatchDoesNotWait) {
  BatchQueue queue = Queue(2, 10000);
  auto a = Member(64), b = Member(64);
  auto [batch, waited] = TakeWithLateArrival(queue, a, b);
  EXPECT_EQ(batch, (std::vector<std::shared_ptr<BatchMember>>{a, b}));
  EXPECT_LT(waited, std::chrono::seconds(5)) << "woken by the second Add";
}

TEST(BatchQueueTest, RemoveOnlyWhileNotTaken) {
  BatchQueue queue = Queue(2, 0);
  auto a = Member(64), b = Member(64);
  queue.Add(a);
  queue.Add(b);
  EXPECT_TRUE(queue.Remove(b.get()));
  EXPECT_EQ(queue.Take(), (std::vector<std::shared_ptr<BatchMember>>{a}));
  EXPECT_FALSE(queue.Remove(a.get())) << "a batch took it: the batch ends it";
  EXPECT_FALSE(queue.Remove(b.get()));
}

}  // namespace
}  // namespace qpool
