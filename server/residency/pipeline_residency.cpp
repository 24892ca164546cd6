#include "residency/pipeline_residency.h"

#include <algorithm>

#include "util/clock.h"
#include "util/log.h"

namespace qpool {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

PipelineResidency::PipelineResidency(std::string pipeline, std::vector<Component*> components,
                                     ResidencyContext context, OffloadPolicy policy)
    : pipeline_(std::move(pipeline)), context_(context), policy_(policy) {
  for (Component* c : components) {
    components_.push_back(
        std::make_unique<ComponentResidency>(*c, *context_.arenas, *context_.copier));
  }
}

PipelineResidency::~PipelineResidency() = default;

c10::Device PipelineResidency::device() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_;
}

OffloadPolicy PipelineResidency::policy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return policy_;
}

ComponentResidency& PipelineResidency::of(const Component& component) {
  for (auto& c : components_) {
    if (&c->component() == &component) return *c;
  }
  throw std::logic_error("component " + component.name() + " is not part of pipeline " + pipeline_);
}

// The bytes of `c` that count against `device`'s counters: on the CPU its host copy (which a
// component on the CPU computes from, too), on a GPU its device copy.
static int64_t BytesOn(const ComponentResidency& c, const c10::Device& device) {
  if (device.is_cpu()) return static_cast<int64_t>(c.host_bytes());
  if (c.state() == Residency::kDevice && c.device() == device) {
    return static_cast<int64_t>(c.component().Bytes().total());
  }
  if (c.state() == Residency::kStreaming && c.device() == device) {
    return static_cast<int64_t>(c.streaming_bytes());
  }
  return 0;
}

DeviceMemoryStats PipelineResidency::Counters(const c10::Device& device) const {
  if (context_.memory == nullptr) return DeviceMemoryStats{device.str()};
  return context_.memory->Read(device);
}

void PipelineResidency::Record(MemoryEventKind kind, const std::string& component,
                               const c10::Device& device, const DeviceMemoryStats& before,
                               int64_t delta, double seconds, const Status& status,
                               const std::string& from, const std::string& to,
                               const std::string& message, uint64_t copied_bytes) {
  if (context_.events == nullptr) return;
  const DeviceMemoryStats after = Counters(device);
  MemoryEvent e;
  e.kind = kind;
  e.pipeline = pipeline_;
  e.component = component;
  e.device = device.str();
  e.from_device = from;
  e.to_device = to;
  e.allocated_before = before.allocated_bytes;
  e.allocated_after = after.allocated_bytes;
  e.reserved_before = before.reserved_bytes;
  e.reserved_after = after.reserved_bytes;
  e.attributed_delta = status.ok() ? delta : 0;
  e.duration_seconds = seconds;
  e.outcome = status.ok() ? MemoryEventOutcome::kOk : MemoryEventOutcome::kError;
  e.message = status.ok() ? message : status.message();
  e.copied_bytes = copied_bytes;
  context_.events->Append(std::move(e));
}

Status PipelineResidency::Place(const c10::Device& device, c10::ScalarType dtype) {
  return Place(device, std::vector<c10::ScalarType>(components_.size(), dtype));
}

Status PipelineResidency::Place(const c10::Device& device,
                                const std::vector<c10::ScalarType>& dtypes, PlaceSeconds* seconds) {
  const auto start = Clock::now();
  if (dtypes.size() != components_.size()) {
    return Internal(StrCat("pipeline '", pipeline_, "': ", dtypes.size(), " dtypes for ",
                           components_.size(), " components"));
  }
  const OffloadPolicy p = policy();
  const OffloadMode mode = p.mode;
  if (mode == OffloadMode::kNone && !device.is_cpu()) return PlaceOnDevice(device, dtypes, seconds);
  // Note [The host copy is the master]: pinned only when it will be used again.
  const bool pinned = device.is_cuda() && mode != OffloadMode::kNone;
  std::optional<uint64_t> group_bytes;
  if (mode == OffloadMode::kSequential) {
    group_bytes = static_cast<uint64_t>(p.stream.group_mib * 1024 * 1024);
  }
  for (size_t i = 0; i < components_.size(); ++i) {
    RETURN_IF_ERROR(components_[i]->Place(dtypes[i], pinned, group_bytes));
  }
  if (seconds) seconds->pack = SecondsSince(start);
  const auto packed = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    device_ = device;
    streamable_ = group_bytes.has_value();
  }
  if (RestsOnHost(mode)) return Status::Ok();  // resting residency: the host
  ASSIGN_OR_RETURN(ResidencyReport report,
                   MoveAll(Residency::kDevice, device, MemoryEventKind::kOnload));
  (void)report;
  if (!pinned) {
    for (auto& c : components_) c->DropHostCopy();
  }
  if (seconds) seconds->device = SecondsSince(packed);
  return Status::Ok();
}

Status PipelineResidency::PlaceOnDevice(const c10::Device& device,
                                        const std::vector<c10::ScalarType>& dtypes,
                                        PlaceSeconds* seconds) {
  // Note [Loads straight to the GPU]. One onload event per component, as a move from the host
  // would record.
  const auto start = Clock::now();
  for (size_t i = 0; i < components_.size(); ++i) {
    ComponentResidency& c = *components_[i];
    const DeviceMemoryStats before = Counters(device);
    const auto placing = Clock::now();
    StatusOr<ComponentMove> placed = c.PlaceOnDevice(dtypes[i], device);
    Record(MemoryEventKind::kOnload, c.component().name(), device, before, BytesOn(c, device),
           SecondsSince(placing), placed.status(), "host", device.str(), "",
           placed.ok() ? placed->bytes : 0);
    if (!placed.ok()) {
      for (auto& other : components_) other->Unload();  // all or nothing
      return Status(placed.status().code(),
                    StrCat("pipeline '", pipeline_, "': ", placed.status().message(),
                           "; nothing stays loaded"));
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    device_ = device;
    streamable_ = false;
  }
  if (seconds) seconds->device = SecondsSince(start);
  return Status::Ok();
}

StatusOr<ComponentMove> PipelineResidency::MoveOne(ComponentResidency& c, Residency to,
                                                   const c10::Device& device, bool wait,
                                                   MemoryEventKind kind) {
  const auto start = Clock::now();
  const c10::Device counted = to == Residency::kHost ? c.device() : device;
  const DeviceMemoryStats before = Counters(counted);
  const int64_t on_device_before = BytesOn(c, counted);
  const std::string from = c.state() == Residency::kDevice ? c.device().str() : "host";
  auto staged = c.Stage(to, device);
  StatusOr<ComponentMove> moved = staged.ok() ? c.Commit(std::move(staged).value(), wait)
                                              : StatusOr<ComponentMove>(staged.status());
  const int64_t on_device_after = BytesOn(c, counted);
  // Nothing copied and nothing changed on the counted device (e.g. host <-> the CPU as device,
  // or an offload that reused the host copy on the CPU): no event.
  if (moved.ok() && moved->bytes == 0 && on_device_after == on_device_before && counted.is_cpu()) {
    return moved;
  }
  Record(kind, c.component().name(), counted, before, on_device_after - on_device_before,
         SecondsSince(start), moved.status(), from, to == Residency::kHost ? "host" : device.str());
  return moved;
}

StatusOr<ResidencyReport> PipelineResidency::MoveAll(Residency to, const c10::Device& device,
                                                     MemoryEventKind kind) {
  const auto start = Clock::now();
  // Note [Staged moves]: stage everything first; any failure drops what was staged.
  std::vector<ComponentResidency::Staged> staged;
  std::vector<DeviceMemoryStats> before;
  std::vector<int64_t> bytes_before;
  std::vector<std::string> from;
  for (auto& c : components_) {
    const c10::Device counted = to == Residency::kHost ? c->device() : device;
    before.push_back(Counters(counted));
    bytes_before.push_back(BytesOn(*c, counted));
    from.push_back(c->state() == Residency::kDevice ? c->device().str() : "host");
    auto s = c->Stage(to, device);
    if (!s.ok()) {
      staged.clear();  // frees every staged block
      Record(kind, c->component().name(), counted, before.back(), 0, SecondsSince(start),
             s.status(), from.back(), to == Residency::kHost ? "host" : device.str());
      return Status(s.status().code(), StrCat("pipeline '", pipeline_, "': ", s.status().message(),
                                              "; nothing was moved"));
    }
    staged.push_back(std::move(s).value());
  }
  ResidencyReport report;
  std::vector<std::string> committed;
  for (size_t i = 0; i < components_.size(); ++i) {
    auto& c = *components_[i];
    const c10::Device counted = to == Residency::kHost ? c.device() : device;
    const bool moves = staged[i].bytes > 0 || c.state() != to ||
                       (to == Residency::kDevice && c.device() != device);
    auto moved = c.Commit(std::move(staged[i]), /*wait=*/true);
    if (!moved.ok()) {
      // Verification failed: this component was restored; earlier ones stay moved, which is a
      // consistent state of its own (each component is whole on one device).
      return Status(moved.status().code(),
                    StrCat("pipeline '", pipeline_, "': ", moved.status().message(),
                           committed.empty()
                               ? ""
                               : StrCat(" (already moved: ", committed.size(), " component(s))")));
    }
    committed.push_back(moved->component);
    if (!moves) continue;
    const int64_t bytes_after = BytesOn(c, counted);
    if (moved->bytes == 0 && bytes_after == bytes_before[i] && counted.is_cpu()) {
      report.moves.push_back(std::move(moved).value());
      continue;
    }
    Record(kind, c.component().name(), counted, before[i], bytes_after - bytes_before[i],
           moved->seconds, Status::Ok(), from[i], moved->to);
    report.bytes += moved->bytes;
    report.moves.push_back(std::move(moved).value());
  }
  if (to == Residency::kDevice) {
    std::lock_guard<std::mutex> lock(mu_);
    device_ = device;
  }
  report.seconds = SecondsSince(start);
  return report;
}

Status PipelineResidency::SetPolicy(OffloadPolicy policy) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (policy.mode == OffloadMode::kSequential) {
      if (!streamable_) {
        return FailedPrecondition(StrCat(
            "pipeline '", pipeline_,
            "' was not loaded for streaming; set offload.policy: sequential in its manifest and "
            "load it again"));
      }
    }
    // The groups were planned at load; keep that plan's settings.
    if (streamable_) policy.stream = policy_.stream;
    policy_ = policy;
    last_used_ = Clock::now();
  }
  Settle();
  return Status::Ok();
}

void PipelineResidency::BeginRequest() {
  std::lock_guard<std::mutex> lock(mu_);
  in_request_ = true;
}

Status PipelineResidency::BeginStreaming(ComponentResidency& c, bool warm) {
  const c10::Device target = device();
  const DeviceMemoryStats before = Counters(target);
  const auto start = Clock::now();
  const StreamSettings stream = policy().stream;
  Status status = c.BeginStreaming(target, stream.prefetch,
                                   static_cast<uint64_t>(stream.resident_mib * 1024 * 1024), warm);
  if (!status.ok()) {
    Record(MemoryEventKind::kStream, c.component().name(), target, before, 0, SecondsSince(start),
           status, "host", target.str());
    return status;
  }
  stream_started_[&c] = {before, start};
  return Status::Ok();
}

void PipelineResidency::EndStreaming(ComponentResidency& c) {
  if (c.state() != Residency::kStreaming) return;
  const c10::Device target = c.device();
  const StreamStats stats = c.EndStreaming();
  auto started = stream_started_.find(&c);
  DeviceMemoryStats before = Counters(target);
  double seconds = 0;
  if (started != stream_started_.end()) {
    before = started->second.first;
    seconds = SecondsSince(started->second.second);
    stream_started_.erase(started);
  }
  Record(MemoryEventKind::kStream, c.component().name(), target, before, 0, seconds, Status::Ok(),
         "host", target.str(),
         StrCat("streamed ", stats.bytes_copied, " bytes in ", stats.copies, " copies for ",
                stats.enters, " group runs; at most ", stats.peak_bytes,
                " bytes on the device at once"),
         stats.bytes_copied);
}

Status PipelineResidency::Use(Component& component) {
  ComponentResidency& c = of(component);
  const c10::Device target = device();
  if (policy().mode == OffloadMode::kSequential && c.state() != Residency::kDevice) {
    if (c.state() == Residency::kStreaming && c.device() == target) return Status::Ok();
    EndStreaming(c);
    return BeginStreaming(c, /*warm=*/false);
  }
  if (c.state() != Residency::kDevice || c.device() != target) {
    ASSIGN_OR_RETURN(ComponentMove moved, MoveOne(c, Residency::kDevice, target, /*wait=*/false,
                                                  MemoryEventKind::kOnload));
    (void)moved;
  }
  c.AwaitPending();
  return Status::Ok();
}

void PipelineResidency::Prefetch(Component& component) {
  const OffloadMode mode = policy().mode;
  ComponentResidency& c = of(component);
  if (mode == OffloadMode::kSequential) {
    if (c.state() != Residency::kHost) return;
    Status status = BeginStreaming(c, /*warm=*/true);
    if (!status.ok()) {
      log::Warn("pipeline '", pipeline_, "': prefetch of ", component.name(),
                " failed (Use will retry): ", status.message());
    }
    return;
  }
  if (mode != OffloadMode::kModel) return;
  const c10::Device target = device();
  if (c.state() == Residency::kDevice && c.device() == target) return;
  auto moved = MoveOne(c, Residency::kDevice, target, /*wait=*/false, MemoryEventKind::kOnload);
  if (!moved.ok()) {
    log::Warn("pipeline '", pipeline_, "': prefetch of ", component.name(),
              " failed (Use will retry): ", moved.status().message());
  }
}

void PipelineResidency::Done(Component& component) {
  if (!RestsOnHost(policy().mode)) return;
  ComponentResidency& c = of(component);
  if (c.state() == Residency::kStreaming) return EndStreaming(c);
  if (c.state() != Residency::kDevice) return;
  auto moved = MoveOne(c, Residency::kHost, c.device(), /*wait=*/true, MemoryEventKind::kOffload);
  if (!moved.ok()) {
    log::Error("pipeline '", pipeline_, "': offloading ", component.name(),
               " failed: ", moved.status().message());
  }
}

void PipelineResidency::Settle() {
  OffloadPolicy policy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_request_ = false;
    last_used_ = Clock::now();
    policy = policy_;
  }
  const c10::Device target = device();
  for (auto& c : components_) {
    if (c->state() == Residency::kUnloaded) continue;
    EndStreaming(*c);  // a request that ended early (error, cancellation) or a policy change
    StatusOr<ComponentMove> moved = ComponentMove{};
    if (RestsOnHost(policy.mode) && c->state() == Residency::kDevice) {
      moved = MoveOne(*c, Residency::kHost, c->device(), /*wait=*/true, MemoryEventKind::kOffload);
    } else if (policy.mode == OffloadMode::kNone &&
               (c->state() != Residency::kDevice || c->device() != target)) {
      moved = MoveOne(*c, Residency::kDevice, target, /*wait=*/true, MemoryEventKind::kOnload);
    }
    if (!moved.ok()) {
      log::Error("pipeline '", pipeline_, "': bringing ", c->component().name(),
                 " to its resting residency failed: ", moved.status().message());
    }
  }
}

StatusOr<ResidencyReport> PipelineResidency::Offload() {
  if (device().is_cpu()) {
    return FailedPrecondition(
        StrCat("pipeline '", pipeline_, "' runs on the CPU; there is no device memory to free"));
  }
  return MoveAll(Residency::kHost, device(), MemoryEventKind::kOffload);
}

StatusOr<ResidencyReport> PipelineResidency::Onload(const c10::Device& device) {
  return MoveAll(Residency::kDevice, device, MemoryEventKind::kOnload);
}

StatusOr<ResidencyReport> PipelineResidency::MoveTo(const c10::Device& device) {
  if (RestsOnHost(policy().mode)) {
    // Between requests everything is on the host: only the device the next request uses changes.
    std::lock_guard<std::mutex> lock(mu_);
    device_ = device;
    return ResidencyReport{};
  }
  for (auto& c : components_) {
    if (c->state() == Residency::kHost && policy().mode == OffloadMode::kNone) {
      return FailedPrecondition(StrCat("pipeline '", pipeline_,
                                       "' is offloaded; onload it to a device instead of moving"));
    }
  }
  return MoveAll(Residency::kDevice, device, MemoryEventKind::kMove);
}

void PipelineResidency::Unload() {
  for (auto& c : components_) c->Unload();
}

uint64_t PipelineResidency::BytesToRun() const {
  const OffloadPolicy p = policy();
  const c10::Device target = device();
  uint64_t out = 0;
  for (const auto& c : components_) {
    if (c->state() == Residency::kDevice && c->device() == target) continue;
    const uint64_t whole = c->component().Bytes().total();
    const StreamPlan* plan = c->stream_plan();
    if (p.mode != OffloadMode::kSequential || plan == nullptr) {
      out += whole;
      continue;
    }
    // One streamed component at a time (plus the next one's first prefetched groups, which the
    // finished one's release makes room for): the largest window and resident set count.
    std::vector<uint64_t> sizes;
    for (const auto& g : plan->groups()) sizes.push_back(static_cast<uint64_t>(g.end - g.begin));
    std::sort(sizes.rbegin(), sizes.rend());
    uint64_t window = 0;
    for (size_t i = 0; i < sizes.size() && i < static_cast<size_t>(p.stream.prefetch) + 2; ++i) {
      window += sizes[i];
    }
    window += static_cast<uint64_t>(p.stream.resident_mib * 1024 * 1024);
    out = std::max(out, std::min(window, whole));
  }
  return out;
}

std::vector<ComponentPlace> PipelineResidency::Snapshot() const {
  std::vector<ComponentPlace> out;
  for (const auto& c : components_) {
    out.push_back({c->component().name(), c->state(), c->device(), c->host_bytes()});
  }
  return out;
}

std::vector<ComponentResidency::BlockRef> PipelineResidency::Blocks() const {
  std::vector<ComponentResidency::BlockRef> out;
  for (const auto& c : components_) {
    for (auto& b : c->Blocks()) out.push_back(std::move(b));
  }
  return out;
}

std::map<std::string, uint64_t> PipelineResidency::BytesByDevice() const {
  std::map<std::string, uint64_t> out;
  for (const auto& c : components_) {
    if (c->host_bytes() > 0) out["cpu"] += c->host_bytes();
    if (c->state() == Residency::kDevice && !c->device().is_cpu()) {
      out[c->device().str()] += c->component().Bytes().total();
    }
    if (c->state() == Residency::kStreaming && !c->device().is_cpu()) {
      out[c->device().str()] += c->streaming_bytes();
    }
  }
  return out;
}

double PipelineResidency::idle_for() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_request_ ? 0.0 : SecondsSince(last_used_);
}

bool PipelineResidency::IdleOffloadDue() const {
  const OffloadPolicy p = policy();
  if (p.mode != OffloadMode::kIdle || device().is_cpu()) return false;
  bool resident = false;
  for (const auto& c : components_) resident = resident || c->state() == Residency::kDevice;
  return resident && idle_for() >= p.idle_seconds;
}

RequestResidencyScope::RequestResidencyScope(PipelineResidency& residency) : residency_(residency) {
  residency_.BeginRequest();
}

RequestResidencyScope::~RequestResidencyScope() { residency_.Settle(); }

}  // namespace qpool
