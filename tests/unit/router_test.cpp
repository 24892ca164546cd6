// The routing policy, eviction plan and working-memory model: pure functions of made-up
// snapshots (Note [Routing], Note [Working memory]).
#include "pool/router.h"

#include <gtest/gtest.h>

#include "pool/eviction.h"
#include "pool/working_memory.h"

namespace qpool {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

DeviceSnapshot Gpu(int index, uint64_t budget_gib, uint64_t used_gib, size_t queued = 0,
                   uint64_t evictable_gib = 0) {
  DeviceSnapshot d;
  d.device = "cuda:" + std::to_string(index);
  d.budget_bytes = budget_gib * kGiB;
  d.used_bytes = used_gib * kGiB;
  d.evictable_bytes = evictable_gib * kGiB;
  d.queued = queued;
  return d;
}

ReplicaSnapshot Replica(int id, int gpu, bool resident, size_t in_flight = 0,
                        uint64_t pending_steps = 0, uint64_t onload_gib = 0) {
  ReplicaSnapshot r;
  r.id = id;
  r.device = "cuda:" + std::to_string(gpu);
  r.resident = resident;
  r.in_flight = in_flight;
  r.pending_steps = pending_steps;
  r.onload_bytes = onload_gib * kGiB;
  return r;
}

RouteRequest Working(uint64_t gib) {
  RouteRequest r;
  r.working_bytes = gib * kGiB;
  return r;
}

void ExpectRoute(const StatusOr<RouteDecision>& got, int replica, const std::string& reason,
                 uint64_t evict_bytes = 0) {
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->replica, replica);
  EXPECT_EQ(got->reason, reason);
  EXPECT_EQ(got->evict_bytes, evict_bytes);
}

TEST(RouterTest, IdleResidentReplicaFirst) {
  // Replica 0 is busy; replica 1 is resident and idle; replica 2 is idle but offloaded.
  ExpectRoute(
      Route({Gpu(0, 80, 10), Gpu(1, 80, 10), Gpu(2, 80, 0)},
            {Replica(0, 0, true, 1, 20), Replica(1, 1, true), Replica(2, 2, false, 0, 0, 2)},
            Working(1)),
      1, "idle");
}

TEST(RouterTest, AmongIdleReplicasTheLeastQueuedDeviceThenTheMostHeadroomThenTheLowestId) {
  ExpectRoute(Route({Gpu(0, 80, 10, 3), Gpu(1, 80, 10, 1)},
                    {Replica(0, 0, true), Replica(1, 1, true)}, Working(1)),
              1, "idle");
  ExpectRoute(Route({Gpu(0, 80, 40), Gpu(1, 80, 10)}, {Replica(0, 0, true), Replica(1, 1, true)},
                    Working(1)),
              1, "idle");
  ExpectRoute(Route({Gpu(0, 80, 10), Gpu(1, 80, 10)}, {Replica(0, 0, true), Replica(1, 1, true)},
                    Working(1)),
              0, "idle");
}

TEST(RouterTest, AnIdleOffloadedReplicaBeatsWaitingBehindABusyOne) {
  ExpectRoute(Route({Gpu(0, 80, 10), Gpu(1, 80, 0)},
                    {Replica(0, 0, true, 1, 30), Replica(1, 1, false, 0, 0, 2)}, Working(1)),
              1, "onload");
}

TEST(RouterTest, AmongOffloadedReplicasTheMostHeadroom) {
  ExpectRoute(Route({Gpu(0, 80, 50), Gpu(1, 80, 20)},
                    {Replica(0, 0, false, 0, 0, 2), Replica(1, 1, false, 0, 0, 2)}, Working(1)),
              1, "onload");
}

TEST(RouterTest, EveryReplicaBusyGoesToTheFewestInFlightThenTheFewestPendingSteps) {
  ExpectRoute(Route({Gpu(0, 80, 10), Gpu(1, 80, 10)},
                    {Replica(0, 0, true, 2, 10), Replica(1, 1, true, 1, 30)}, Working(1)),
              1, "least-loaded");
  ExpectRoute(Route({Gpu(0, 80, 10), Gpu(1, 80, 10)},
                    {Replica(0, 0, true, 1, 25), Replica(1, 1, true, 1, 5)}, Working(1)),
              1, "least-loaded");
  // Equal load: resident before offloaded.
  ExpectRoute(Route({Gpu(0, 80, 10), Gpu(1, 80, 10)},
                    {Replica(0, 0, false, 1, 5, 2), Replica(1, 1, true, 1, 5)}, Working(1)),
              1, "least-loaded");
}

TEST(RouterTest, ExcludedDevicesAreSkipped) {
  RouteRequest retry = Working(1);
  retry.exclude = {"cuda:0"};
  ExpectRoute(Route({Gpu(0, 80, 10), Gpu(1, 80, 10)},
                    {Replica(0, 0, true), Replica(1, 1, true, 1, 30)}, retry),
              1, "least-loaded");
  auto none = Route({Gpu(0, 80, 10)}, {Replica(0, 0, true)}, retry);
  ASSERT_EQ(none.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(none.status().message(), "no other device has a replica of the pipeline");
}

TEST(RouterTest, ReplicasBeingMovedAreSkippedAndAllMovingIsUnavailable) {
  ReplicaSnapshot moving = Replica(0, 0, true);
  moving.available = false;
  ExpectRoute(
      Route({Gpu(0, 80, 10), Gpu(1, 80, 10)}, {moving, Replica(1, 1, true, 2, 8)}, Working(1)), 1,
      "least-loaded");
  auto all = Route({Gpu(0, 80, 10)}, {moving}, Working(1));
  EXPECT_EQ(all.status().code(), StatusCode::kUnavailable);
}

TEST(RouterTest, NoReplicaIsFailedPrecondition) {
  EXPECT_EQ(Route({Gpu(0, 80, 10)}, {}, Working(1)).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST(RouterTest, EvictableBytesMakeAReplicaFitAndSayHowMuchToFree) {
  // 2 GiB onload + 1 GiB working on a device with 1 GiB of headroom and 5 GiB idle elsewhere.
  ExpectRoute(Route({Gpu(0, 20, 19, 0, 5)}, {Replica(0, 0, false, 0, 0, 2)}, Working(1)), 0,
              "onload", 2 * kGiB);
}

TEST(RouterTest, ADeviceOverItsBudgetMustAlsoGiveBackTheExcess) {
  // Budget 10 GiB with 12 in use: a 1 GiB request needs 3 GiB evicted, not 1.
  ExpectRoute(Route({Gpu(0, 10, 12, 0, 3)}, {Replica(0, 0, true)}, Working(1)), 0, "idle",
              3 * kGiB);
  EXPECT_EQ(Route({Gpu(0, 10, 12, 0, 2)}, {Replica(0, 0, true)}, Working(1)).status().code(),
            StatusCode::kResourceExhausted);
}

TEST(RouterTest, AReplicaThatDoesNotFitIsPassedOver) {
  // Replica 0 is idle but its device is full; replica 1 is busy on a roomy device.
  ExpectRoute(Route({Gpu(0, 20, 20), Gpu(1, 80, 10)},
                    {Replica(0, 0, true), Replica(1, 1, true, 1, 10)}, Working(4)),
              1, "least-loaded");
}

TEST(RouterTest, NothingFitsNamesTheNeedAndTheBestDevice) {
  auto got = Route({Gpu(0, 20, 19, 0, 1), Gpu(1, 20, 18)},
                   {Replica(0, 0, false, 0, 0, 2), Replica(1, 1, false, 0, 0, 2)}, Working(2));
  ASSERT_EQ(got.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(got.status().message(),
            "the request needs 4.00 GiB on one device (2.00 GiB to onload + 2.00 GiB working "
            "memory); the most any replica's device can give is 2.00 GiB (cuda:0: budget "
            "20.0 GiB, 19.0 GiB in use, 1.00 GiB of it idle)");
}

TEST(RouterTest, NoBudgetIsUnlimited) {
  DeviceSnapshot cpu;
  cpu.device = "cpu";
  ReplicaSnapshot r;
  r.device = "cpu";
  r.resident = true;
  r.in_flight = 7;
  ExpectRoute(Route({cpu}, {r}, Working(1000)), 0, "least-loaded");
}

RouteRequest ScaleOut(uint64_t working_gib, uint64_t replica_gib, std::vector<std::string> spare) {
  RouteRequest r = Working(working_gib);
  r.replica_bytes = replica_gib * kGiB;
  r.spare_devices = std::move(spare);
  return r;
}

TEST(RouterTest, EveryReplicaBusyProposesASpareDeviceToScaleOutTo) {
  // The request waits on cuda:0's busy replica; a new replica would fit on cuda:1 and cuda:2,
  // and cuda:2 is the less queued.
  auto got = Route({Gpu(0, 80, 10), Gpu(1, 80, 10, 2), Gpu(2, 80, 60, 0)},
                   {Replica(0, 0, true, 2, 40)}, ScaleOut(1, 4, {"cuda:1", "cuda:2"}));
  ExpectRoute(got, 0, "least-loaded");
  EXPECT_EQ(got->scale_out, "cuda:2");
  // Equally queued: the most headroom.
  got = Route({Gpu(0, 80, 10), Gpu(1, 80, 10), Gpu(2, 80, 60)}, {Replica(0, 0, true, 2, 40)},
              ScaleOut(1, 4, {"cuda:1", "cuda:2"}));
  EXPECT_EQ(got->scale_out, "cuda:1");
}

TEST(RouterTest, NoScaleOutWhileAReplicaIsIdleOrWhenNothingFits) {
  auto idle =
      Route({Gpu(0, 80, 10), Gpu(1, 80, 10)}, {Replica(0, 0, true)}, ScaleOut(1, 4, {"cuda:1"}));
  ExpectRoute(idle, 0, "idle");
  EXPECT_EQ(idle->scale_out, "");
  // cuda:1 has 3 GiB of headroom and 1 GiB evictable: a 4 GiB replica plus 1 GiB does not fit.
  auto full = Route({Gpu(0, 80, 10), Gpu(1, 80, 77, 0, 1)}, {Replica(0, 0, true, 1, 10)},
                    ScaleOut(1, 4, {"cuda:1"}));
  ExpectRoute(full, 0, "least-loaded");
  EXPECT_EQ(full->scale_out, "");
  // With 2 GiB evictable it fits.
  auto evicting = Route({Gpu(0, 80, 10), Gpu(1, 80, 77, 0, 2)}, {Replica(0, 0, true, 1, 10)},
                        ScaleOut(1, 4, {"cuda:1"}));
  EXPECT_EQ(evicting->scale_out, "cuda:1");
  // An excluded device (a retry after running out there) is no spare.
  RouteRequest excluded = ScaleOut(1, 4, {"cuda:1"});
  excluded.exclude = {"cuda:1"};
  auto retry = Route({Gpu(0, 80, 10), Gpu(1, 80, 10)}, {Replica(0, 0, true, 1, 10)}, excluded);
  EXPECT_EQ(retry->scale_out, "");
}

TEST(RouterTest, SameSnapshotSameAnswer) {
  const std::vector<DeviceSnapshot> devices = {Gpu(0, 80, 10, 2), Gpu(1, 80, 10, 2)};
  const std::vector<ReplicaSnapshot> replicas = {Replica(0, 0, true, 1, 4),
                                                 Replica(1, 1, true, 1, 4)};
  for (int i = 0; i < 10; ++i) ExpectRoute(Route(devices, replicas, Working(1)), 0, "least-loaded");
}

// Closed-loop clients over one replica per GPU, each device running its requests one at a time
// step by step, every new request routed on the snapshot of that instant: no device may wait
// for work while requests are outstanding, whatever its speed. (In a four-H100 scaling run GPUs
// 1-3 sat idle 14-18% of the time while GPU 0, the slowest, served the most requests: the policy
// alone does not do that.)
TEST(RouterTest, ClosedLoopClientsKeepEveryDeviceBusy) {
  constexpr int kGpus = 4, kSteps = 30;
  const std::vector<double> step_ms = {298.0 / kSteps, 275.0 / kSteps, 275.0 / kSteps,
                                       275.0 / kSteps};
  for (int clients_per_gpu : {1, 2, 4}) {
    SCOPED_TRACE(clients_per_gpu);
    std::vector<std::vector<int>> queue(kGpus);  // steps left of each request, running first
    std::vector<size_t> in_flight(kGpus, 0);
    std::vector<uint64_t> pending(kGpus, 0);
    std::vector<double> step_end(kGpus, 0), busy_ms(kGpus, 0);
    std::vector<int> served(kGpus, 0);
    int idle_routes = 0;
    auto submit = [&](double now, bool measured) {
      std::vector<DeviceSnapshot> devices;
      std::vector<ReplicaSnapshot> replicas;
      for (int g = 0; g < kGpus; ++g) {
        devices.push_back(Gpu(g, 80, 10, in_flight[g]));
        replicas.push_back(Replica(g, g, true, in_flight[g], pending[g]));
      }
      auto route = Route(devices, replicas, Working(1));
      ASSERT_TRUE(route.ok());
      const int g = route->replica;
      if (measured && route->reason == "idle") ++idle_routes;
      if (queue[g].empty()) step_end[g] = now + step_ms[g];
      queue[g].push_back(kSteps);
      ++in_flight[g];
      pending[g] += kSteps;
    };
    for (int c = 0; c < clients_per_gpu * kGpus; ++c) submit(0, false);
    const double warmup_ms = 5000, end_ms = 65000;
    double now = 0;
    while (now < end_ms) {
      int g = 0;
      for (int d = 1; d < kGpus; ++d) {
        if (!queue[d].empty() && (queue[g].empty() || step_end[d] < step_end[g])) g = d;
      }
      ASSERT_FALSE(queue[g].empty());
      now = step_end[g];
      if (now > warmup_ms) busy_ms[g] += step_ms[g];
      --pending[g];
      if (--queue[g].front() > 0) {
        step_end[g] = now + step_ms[g];
        continue;
      }
      queue[g].erase(queue[g].begin());
      --in_flight[g];
      if (now >= warmup_ms) ++served[g];
      if (!queue[g].empty()) step_end[g] = now + step_ms[g];
      submit(now, now >= warmup_ms);  // its client sends the next request at once
    }
    for (int g = 0; g < kGpus; ++g) {
      SCOPED_TRACE(g);
      EXPECT_NEAR(busy_ms[g] / (now - warmup_ms), 1.0, 0.001);  // all but the last step
      // Each device serves at its own rate: 60 s over its time per request, give or take the
      // requests in flight at the window's edges.
      EXPECT_NEAR(served[g], 60000.0 / (step_ms[g] * kSteps), 1.0 + clients_per_gpu);
    }
    // With one client per device a finished request leaves its device idle for the next one.
    if (clients_per_gpu > 1) EXPECT_EQ(idle_routes, 0);
  }
}

TEST(FormatBytesTest, Units) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(12 * (1ull << 20)), "12.0 MiB");
  EXPECT_EQ(FormatBytes(3 * kGiB / 2), "1.50 GiB");
}

EvictionCandidate Candidate(std::string pipeline, uint64_t gib, uint64_t last_used,
                            bool idle = true, int replica = 0) {
  return {std::move(pipeline), replica, gib * kGiB, last_used, idle};
}

std::vector<std::string> Names(const std::vector<EvictionCandidate>& plan) {
  std::vector<std::string> out;
  for (const auto& c : plan) out.push_back(c.pipeline);
  return out;
}

TEST(EvictionTest, LeastRecentlyUsedFirstUntilEnough) {
  auto plan = PlanEviction({Candidate("b", 2, 300), Candidate("a", 2, 100), Candidate("c", 2, 200)},
                           3 * kGiB);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(Names(*plan), (std::vector<std::string>{"a", "c"}));
}

TEST(EvictionTest, BusyReplicasAreNeverChosen) {
  auto plan = PlanEviction({Candidate("old-busy", 8, 1, false), Candidate("new", 2, 500)}, kGiB);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(Names(*plan), (std::vector<std::string>{"new"}));
}

TEST(EvictionTest, TiesGoByNameThenReplica) {
  auto plan = PlanEviction(
      {Candidate("b", 1, 5), Candidate("a", 1, 5, true, 1), Candidate("a", 1, 5, true, 0)},
      3 * kGiB);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->size(), 3u);
  EXPECT_EQ((*plan)[0].pipeline, "a");
  EXPECT_EQ((*plan)[0].replica, 0);
  EXPECT_EQ((*plan)[1].replica, 1);
  EXPECT_EQ((*plan)[2].pipeline, "b");
}

TEST(EvictionTest, NothingNeededNothingEvicted) {
  auto plan = PlanEviction({Candidate("a", 1, 5)}, 0);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->empty());
}

TEST(EvictionTest, NotEnoughIdleBytesIsResourceExhausted) {
  auto plan = PlanEviction({Candidate("a", 1, 5), Candidate("busy", 10, 1, false)}, 2 * kGiB);
  ASSERT_EQ(plan.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(plan.status().message(), "needs 2.00 GiB more; idle pipelines hold 1.00 GiB");
}

TEST(WorkingMemoryTest, DefaultRateUntilTheFirstObservation) {
  WorkingMemoryModel model(4096);
  EXPECT_EQ(model.Estimate(512, 512, 1), 4096ull * 512 * 512);
  model.Observe(512, 512, 1, 256ull << 20);  // 1 KiB per pixel measured
  EXPECT_EQ(model.Estimate(512, 512, 1), 256ull << 20) << "a measurement replaces the default";
}

TEST(WorkingMemoryTest, ScalesWithPixelsAndKeepsTheLargestRate) {
  WorkingMemoryModel model(4096);
  model.Observe(512, 512, 1, 512ull << 20);  // 2 KiB per pixel
  model.Observe(256, 256, 1, 64ull << 20);   // 1 KiB per pixel: smaller, ignored
  EXPECT_DOUBLE_EQ(model.bytes_per_pixel(), 2048);
  EXPECT_EQ(model.Estimate(1024, 1024, 2), 2048ull * 1024 * 1024 * 2);
  model.Observe(64, 64, 4, 64ull << 20);  // 4 KiB per pixel
  EXPECT_EQ(model.Estimate(512, 512, 1), 4096ull * 512 * 512);
}

}  // namespace
}  // namespace qpool
