#include "pool/device_pool.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <regex>

#include "util/log.h"

namespace qpool {
namespace {

StatusOr<c10::Device> ParseDevice(const std::string& text, int num_gpus) {
  static const std::regex kPattern("^(cpu|cuda)(:([0-9]{1,3}))?$");
  std::smatch m;
  if (!std::regex_match(text, m, kPattern) || (m[1] == "cpu" && m[2].matched)) {
    return InvalidArgument(
        StrCat("invalid device '", text, "'; expected auto, cpu, cuda, cuda:N or cuda:N,cuda:M"));
  }
  if (m[1] == "cpu") return c10::Device(c10::kCPU);
  const int index = m[3].matched ? std::stoi(m[3]) : 0;
  if (index >= num_gpus) {
    return InvalidArgument(
        StrCat("device '", text, "' is not available: this server sees ", num_gpus, " GPU(s)"));
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace

StatusOr<std::unique_ptr<DevicePool>> DevicePool::Create(const DevicePoolOptions& options) {
  std::unique_ptr<DevicePool> pool(new DevicePool());
  const int num_gpus = static_cast<int>(torch::cuda::device_count());
  pool->workers_.push_back(
      std::make_unique<DeviceWorker>(c10::Device(c10::kCPU), options.max_queue));
  for (int i = 0; i < num_gpus; ++i) {
    c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(i));
    // Allocator statistics for a device throw until it has had an allocation.
    torch::empty({1}, torch::TensorOptions().device(device));
    pool->workers_.push_back(std::make_unique<DeviceWorker>(device, options.max_queue));
  }
  const std::string& d = options.default_device;
  if (d == "auto" || d.empty()) {
    for (int i = 0; i < num_gpus; ++i) pool->defaults_.emplace_back(c10::kCUDA, i);
    if (num_gpus == 0) pool->defaults_.emplace_back(c10::kCPU);
  } else {
    if (d == "cuda" && num_gpus == 0)
      return InvalidArgument("--devices cuda: this server sees no GPU");
    ASSIGN_OR_RETURN(pool->defaults_, pool->Candidates(d));
  }
  log::Info("devices: cpu + ", num_gpus, " GPU(s); default placement ", d);
  return pool;
}

DevicePool::~DevicePool() { Stop(); }

void DevicePool::Stop() {
  for (auto& worker : workers_) worker->Stop();
}

StatusOr<std::vector<c10::Device>> DevicePool::Candidates(const std::string& request) const {
  std::vector<c10::Device> out;
  const int num_gpus = static_cast<int>(workers_.size()) - 1;
  if (request.empty() || request == "auto") return defaults_;
  if (request == "cuda") {
    for (int i = 0; i < num_gpus; ++i) out.emplace_back(c10::kCUDA, i);
    if (out.empty()) return InvalidArgument("device 'cuda' requested but no GPU is visible");
    return out;
  }
  size_t start = 0;
  for (;;) {
    const size_t comma = request.find(',', start);
    const std::string one = request.substr(start, comma - start);
    if (one == "cpu" && request != "cpu") {
      return InvalidArgument(
          StrCat("invalid device list '", request, "': a list names GPUs only (cuda:0,cuda:1)"));
    }
    ASSIGN_OR_RETURN(c10::Device device, ParseDevice(one, num_gpus));
    if (std::find(out.begin(), out.end(), device) == out.end()) out.push_back(device);
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

StatusOr<c10::Device> DevicePool::Resolve(
    const std::string& request,
    const std::function<uint64_t(const c10::Device&)>& loaded_bytes) const {
  ASSIGN_OR_RETURN(std::vector<c10::Device> candidates, Candidates(request));
  c10::Device best = candidates.front();
  uint64_t best_bytes = loaded_bytes ? loaded_bytes(best) : 0;
  for (const auto& device : candidates) {
    const uint64_t bytes = loaded_bytes ? loaded_bytes(device) : 0;
    if (bytes < best_bytes) {
      best = device;
      best_bytes = bytes;
    }
  }
  return best;
}

void DevicePool::RunInTurn(std::vector<c10::Device> devices, Step step,
                           std::function<void(const Status&)> done) {
  if (devices.empty()) {
    done(Status::Ok());
    return;
  }
  const c10::Device device = devices.front();
  devices.erase(devices.begin());
  auto next = [this, device, devices = std::move(devices), step, done](bool run) mutable {
    if (!run) {
      done(Unavailable("server is shutting down"));
      return;
    }
    Status status = step(device);
    if (!status.ok()) {
      done(status);
      return;
    }
    RunInTurn(std::move(devices), std::move(step), std::move(done));
  };
  // Loads, unloads and residency changes: the admin lane (Note [Admin lane]).
  Status submitted = worker(device).Submit(std::move(next), DeviceWorker::Lane::kAdmin);
  if (!submitted.ok()) done(submitted);
}

DeviceWorker& DevicePool::worker(const c10::Device& device) {
  const size_t index = device.is_cuda() ? static_cast<size_t>(device.index()) + 1 : 0;
  return *workers_.at(index);
}

std::vector<c10::Device> DevicePool::devices() const {
  std::vector<c10::Device> out;
  for (const auto& worker : workers_) out.push_back(worker->device());
  return out;
}

}  // namespace qpool
