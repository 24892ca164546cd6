// The agent check's weight and answer (Note [Agent weight], Note [Agent answer]) with made-up
// pool loads, and the flags that turn it on.
#include "api/agent_weight.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/server_options.h"

namespace qpool::api {
namespace {

// One pipeline loaded and resident on the CPU, nothing in flight.
PoolLoad Idle() {
  PoolLoad load;
  load.queue_capacity = 32;
  load.loaded_pipelines = 1;
  load.resident_pipelines = 1;
  return load;
}

TEST(AgentWeight, AnIdleServerWithItsPipelinesResidentGetsItsFullWeight) {
  EXPECT_EQ(AgentWeightPercent(Idle()), 100);
  EXPECT_EQ(AgentAnswer(Idle(), /*serving=*/true), "up ready 100%\n");
}

TEST(AgentWeight, EachRequestPerWorkerLowersTheWeight) {
  PoolLoad load = Idle();
  std::vector<int> weights;
  for (int in_flight : {0, 1, 2, 4, 8}) {
    load.in_flight = in_flight;
    load.device_tasks = static_cast<size_t>(in_flight);
    weights.push_back(AgentWeightPercent(load));
  }
  // b = 1/(1+t), q = 1 - in_flight/32: 1, 0.5*0.969, 0.333*0.938, 0.2*0.875, 0.111*0.75.
  EXPECT_EQ(weights, (std::vector<int>{100, 48, 31, 18, 8}));
}

TEST(AgentWeight, MoreServingDevicesCarryMoreRequestsAtTheSameWeight) {
  PoolLoad one = Idle();
  one.in_flight = 2;
  PoolLoad two = one;
  two.serving_devices = 2;
  EXPECT_LT(AgentWeightPercent(one), AgentWeightPercent(two));
  // Two requests on two devices weigh as one request on one device.
  PoolLoad single = Idle();
  single.in_flight = 1;
  EXPECT_NEAR(AgentWeightPercent(two), AgentWeightPercent(single), 2);
}

TEST(AgentWeight, WorkerTasksCountWhenTheyExceedTheRequests) {
  PoolLoad load = Idle();
  load.device_tasks = 3;  // loads or moves queued on the worker
  EXPECT_EQ(AgentWeightPercent(load), 25);
}

TEST(AgentWeight, ABusyServerNeverGetsZero) {
  PoolLoad full = Idle();
  full.in_flight = 32;  // limits.max_queue reached: new requests would be refused
  full.device_tasks = 32;
  EXPECT_EQ(AgentWeightPercent(full), 1);
  full.in_flight = 1000;  // over capacity (several pipelines' queues summed differently)
  EXPECT_EQ(AgentWeightPercent(full), 1);
  EXPECT_EQ(AgentAnswer(full, true), "up ready 1%\n");
}

TEST(AgentWeight, AFullMemoryBudgetHalvesTheWeightAtMost) {
  PoolLoad load = Idle();
  load.budget_bytes = 1000;
  load.allocated_bytes = 0;
  EXPECT_EQ(AgentWeightPercent(load), 100);
  load.allocated_bytes = 500;
  EXPECT_EQ(AgentWeightPercent(load), 75);
  load.allocated_bytes = 1000;
  EXPECT_EQ(AgentWeightPercent(load), 50);
  load.allocated_bytes = 5000;  // over the budget (other processes, slack)
  EXPECT_EQ(AgentWeightPercent(load), 50);
}

TEST(AgentWeight, OffloadedPipelinesLowerTheWeightAndNoPipelineGivesTheFloor) {
  PoolLoad load = Idle();
  load.loaded_pipelines = 2;
  load.resident_pipelines = 1;
  EXPECT_EQ(AgentWeightPercent(load), 75);
  load.resident_pipelines = 0;
  EXPECT_EQ(AgentWeightPercent(load), 50);
  PoolLoad cold;  // nothing loaded: requests would fail or wait for a load
  EXPECT_EQ(AgentWeightPercent(cold), 1);
}

TEST(AgentWeight, TheTermsMultiply) {
  PoolLoad load;
  load.in_flight = 2;
  load.device_tasks = 1;
  load.serving_devices = 2;  // b = 1/(1+1) = 0.5
  load.queue_capacity = 8;   // q = 0.75
  load.budget_bytes = 100;
  load.allocated_bytes = 50;  // m = 0.75
  load.loaded_pipelines = 4;
  load.resident_pipelines = 2;              // r = 0.75
  EXPECT_EQ(AgentWeightPercent(load), 21);  // 100 * 0.5 * 0.75^3 = 21.1
}

TEST(AgentAnswer, DrainBeforeServingAndWhileDraining) {
  EXPECT_EQ(AgentAnswer(Idle(), /*serving=*/false), "drain\n");
  PoolLoad draining = Idle();
  draining.draining = true;
  EXPECT_EQ(AgentAnswer(draining, true), "drain\n");
}

StatusOr<ServerOptions> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "qpool-server");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return ParseServerOptions(static_cast<int>(argv.size()), argv.data());
}

TEST(AgentFlags, OffByDefaultAndParsed) {
  auto defaults = Parse({});
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->agent_listen, "");
  EXPECT_EQ(defaults->drain_notice_seconds, 0);
  auto set = Parse({"--agent-listen", "127.0.0.1:0", "--drain-notice-seconds=3"});
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->agent_listen, "127.0.0.1:0");
  EXPECT_EQ(set->drain_notice_seconds, 3);
  auto help = Parse({"--help"});
  EXPECT_NE(help.status().message().find("--agent-listen HOST:PORT"), std::string::npos);
  EXPECT_NE(help.status().message().find("--drain-notice-seconds N"), std::string::npos);
}

TEST(AgentFlags, TheNoticeIsPartOfTheDrain) {
  auto over = Parse({"--drain-seconds", "2", "--drain-notice-seconds", "3"});
  EXPECT_EQ(over.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(over.status().message().find("--drain-notice-seconds"), std::string::npos);
  EXPECT_EQ(Parse({"--agent-listen", ""}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Parse({"--drain-notice-seconds", "-1"}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace qpool::api
