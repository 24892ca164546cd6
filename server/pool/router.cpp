#include "pool/router.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <tuple>

#include "util/log.h"

namespace qpool {
namespace {

constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

struct Candidate {
  const ReplicaSnapshot* replica;
  const DeviceSnapshot* device;
  uint64_t headroom;     // budget - used (kUnlimited without a budget)
  uint64_t needed;       // onload + working
  uint64_t evict_bytes;  // what must go so that used + needed fits the budget
  bool fits;
};

uint64_t Headroom(const DeviceSnapshot& d) {
  if (d.budget_bytes == 0) return kUnlimited;
  return d.budget_bytes > d.used_bytes ? d.budget_bytes - d.used_bytes : 0;
}

bool Contains(const std::vector<std::string>& items, const std::string& item) {
  return std::find(items.begin(), items.end(), item) != items.end();
}

// Less is better; a tuple per rule of Note [Routing].
auto IdleKey(const Candidate& c) {
  return std::make_tuple(c.device->queued, kUnlimited - c.headroom, c.replica->id);
}
auto OnloadKey(const Candidate& c) {
  return std::make_tuple(kUnlimited - c.headroom, c.device->queued, c.replica->id);
}
auto LoadKey(const Candidate& c) {
  return std::make_tuple(c.replica->in_flight, c.replica->pending_steps, !c.replica->resident,
                         kUnlimited - c.headroom, c.replica->id);
}

template <typename Key>
const Candidate* Best(const std::vector<Candidate>& candidates, bool (*pick)(const Candidate&),
                      Key key) {
  const Candidate* best = nullptr;
  for (const auto& c : candidates) {
    if (!c.fits || !pick(c)) continue;
    if (best == nullptr || key(c) < key(*best)) best = &c;
  }
  return best;
}

}  // namespace

std::string FormatBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 4) {
    v /= 1024;
    ++unit;
  }
  char text[32];
  if (unit == 0) {
    std::snprintf(text, sizeof(text), "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(text, sizeof(text), v < 10 ? "%.2f %s" : "%.1f %s", v, units[unit]);
  }
  return text;
}

namespace {

// The spare device for a scale-out (Note [Routing]), or "".
std::string SpareDevice(const std::vector<DeviceSnapshot>& devices, const RouteRequest& request) {
  const DeviceSnapshot* best = nullptr;
  for (const auto& name : request.spare_devices) {
    if (Contains(request.exclude, name)) continue;
    auto d = std::find_if(devices.begin(), devices.end(),
                          [&](const DeviceSnapshot& s) { return s.device == name; });
    if (d == devices.end()) continue;
    const uint64_t headroom = Headroom(*d);
    if (headroom != kUnlimited &&
        d->used_bytes + request.replica_bytes + request.working_bytes >
            d->budget_bytes + d->evictable_bytes) {
      continue;
    }
    if (best == nullptr || d->queued < best->queued ||
        (d->queued == best->queued && headroom > Headroom(*best))) {
      best = &*d;
    }
  }
  return best == nullptr ? "" : best->device;
}

}  // namespace

StatusOr<RouteDecision> Route(const std::vector<DeviceSnapshot>& devices,
                              const std::vector<ReplicaSnapshot>& replicas,
                              const RouteRequest& request) {
  if (replicas.empty()) return FailedPrecondition("the pipeline has no replica loaded");
  std::vector<Candidate> candidates;
  bool any_available = false;
  for (const auto& r : replicas) {
    if (!r.available) continue;
    any_available = true;
    if (Contains(request.exclude, r.device)) continue;
    auto d = std::find_if(devices.begin(), devices.end(),
                          [&](const DeviceSnapshot& s) { return s.device == r.device; });
    if (d == devices.end()) continue;
    Candidate c{&r, &*d, Headroom(*d), r.onload_bytes + request.working_bytes, 0, false};
    if (c.headroom == kUnlimited) {
      c.fits = true;
    } else {
      // A device already over its budget (a request's memory beyond its estimate) must first
      // give back the overshoot too.
      const uint64_t after = d->used_bytes + c.needed;
      c.evict_bytes = after > d->budget_bytes ? after - d->budget_bytes : 0;
      c.fits = c.evict_bytes <= d->evictable_bytes;
    }
    candidates.push_back(c);
  }
  if (!any_available) {
    return Unavailable("every replica of the pipeline is being moved or unloaded; retry shortly");
  }
  if (candidates.empty()) {
    return ResourceExhausted("no other device has a replica of the pipeline");
  }
  const Candidate* best = Best(
      candidates, +[](const Candidate& c) { return c.replica->resident && c.replica->in_flight == 0; },
      IdleKey);
  std::string reason = "idle";
  if (best == nullptr) {
    best = Best(
        candidates,
        +[](const Candidate& c) { return !c.replica->resident && c.replica->in_flight == 0; },
        OnloadKey);
    reason = "onload";
  }
  if (best == nullptr) {
    best = Best(candidates, +[](const Candidate&) { return true; }, LoadKey);
    reason = "least-loaded";
  }
  if (best == nullptr) {
    // Nothing fits: name the replica that came closest.
    const Candidate* closest = &candidates.front();
    for (const auto& c : candidates) {
      if (c.headroom + c.device->evictable_bytes >
          closest->headroom + closest->device->evictable_bytes) {
        closest = &c;
      }
    }
    const DeviceSnapshot& d = *closest->device;
    return ResourceExhausted(StrCat(
        "the request needs ", FormatBytes(closest->needed), " on one device (",
        FormatBytes(closest->replica->onload_bytes), " to onload + ",
        FormatBytes(request.working_bytes), " working memory); the most any replica's device "
        "can give is ", FormatBytes(closest->headroom + d.evictable_bytes), " (", d.device,
        ": budget ", FormatBytes(d.budget_bytes), ", ", FormatBytes(d.used_bytes), " in use, ",
        FormatBytes(d.evictable_bytes), " of it idle)"));
  }
  RouteDecision decision;
  decision.replica = best->replica->id;
  decision.device = best->replica->device;
  decision.reason = reason;
  decision.evict_bytes = best->evict_bytes;
  if (reason == "least-loaded") decision.scale_out = SpareDevice(devices, request);
  return decision;
}

}  // namespace qpool
