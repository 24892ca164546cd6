// DeviceWorker: runs tasks in order on its thread, bounds its queue, and hands queued tasks
// run == false on Stop so their calls can finish.
#include "pool/device_worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <string>
#include <thread>
#include <vector>

namespace qpool {
namespace {

TEST(DeviceWorker, RunsTasksInOrderOnItsThread) {
  DeviceWorker worker(c10::Device(c10::kCPU), 8);
  std::vector<int> order;
  std::promise<std::thread::id> done;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(worker
                    .Submit([&order, i](bool run) {
                      if (run) order.push_back(i);
                    })
                    .ok());
  }
  ASSERT_TRUE(worker.Submit([&](bool run) { done.set_value(std::this_thread::get_id()); }).ok());
  EXPECT_NE(done.get_future().get(), std::this_thread::get_id());
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(DeviceWorker, FullQueueIsResourceExhaustedAndStopDrainsWithRunFalse) {
  DeviceWorker worker(c10::Device(c10::kCPU), 2);
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::promise<void> started;
  ASSERT_TRUE(worker
                  .Submit([&](bool) {
                    started.set_value();
                    gate.wait();
                  })
                  .ok());
  started.get_future().wait();  // the blocking task runs, so the queue is empty again
  std::atomic<int> ran{0}, dropped{0};
  auto count = [&](bool run) { (run ? ran : dropped)++; };
  ASSERT_TRUE(worker.Submit(count).ok());
  ASSERT_TRUE(worker.Submit(count).ok());
  Status full = worker.Submit(count);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("queue of cpu is full"), std::string::npos) << full.message();
  EXPECT_EQ(worker.pending(), 3u);

  std::thread stopper([&] { worker.Stop(); });
  release.set_value();
  stopper.join();
  EXPECT_EQ(ran.load() + dropped.load(), 2);
  EXPECT_EQ(worker.Submit(count).code(), StatusCode::kUnavailable);
}

// Note [Admin lane]: under a full request queue an operator's call is neither refused nor kept
// behind the queued requests: it runs right after the task that is running.
TEST(DeviceWorker, AdminTasksPassAFullRequestQueue) {
  DeviceWorker worker(c10::Device(c10::kCPU), 2);
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::promise<void> started;
  ASSERT_TRUE(worker
                  .Submit([&](bool) {
                    started.set_value();
                    gate.wait();
                  })
                  .ok());
  started.get_future().wait();
  std::vector<std::string> order;  // written on the worker thread only
  auto named = [&order](std::string name) {
    return [&order, name](bool run) {
      if (run) order.push_back(name);
    };
  };
  std::promise<void> last;
  ASSERT_TRUE(worker.Submit(named("request 1")).ok());
  ASSERT_TRUE(worker
                  .Submit([&](bool run) {
                    named("request 2")(run);
                    last.set_value();
                  })
                  .ok());
  EXPECT_EQ(worker.Submit(named("request 3")).code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(worker.Submit(named("admin 1"), DeviceWorker::Lane::kAdmin).ok());
  ASSERT_TRUE(worker.Submit(named("admin 2"), DeviceWorker::Lane::kAdmin).ok());
  EXPECT_EQ(worker.pending(), 5u);
  release.set_value();
  last.get_future().wait();
  EXPECT_EQ(order, (std::vector<std::string>{"admin 1", "admin 2", "request 1", "request 2"}));
}

}  // namespace
}  // namespace qpool
