#include "pool/batch_profiler.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <vector>

#include "util/log.h"

namespace qpool {
namespace {

namespace fs = std::filesystem;
namespace prof = torch::profiler::impl;
using torch::autograd::profiler::KinetoEvent;

BatchProfiler::Options g_options;      // written by Configure before any batch
std::atomic<int> g_batches{0};         // batches begun since start
std::atomic<bool> g_recording{false};  // one recording at a time

struct Row {
  int64_t calls = 0;
  uint64_t ns = 0;
};

// The kernels of `device` (or, on the CPU, the ATen operators) of `events` by total time.
void WriteSummary(const std::vector<KinetoEvent>& events, c10::Device device, double wall_ms,
                  const std::string& path) {
  std::map<std::string, Row> rows;
  uint64_t busy_ns = 0;
  for (const KinetoEvent& e : events) {
    const std::string name = e.name();
    const bool take =
        device.is_cuda()
            ? e.deviceType() == c10::DeviceType::CUDA && e.deviceIndex() == device.index()
            : e.deviceType() == c10::DeviceType::CPU && name.rfind("aten::", 0) == 0;
    if (!take) continue;
    Row& row = rows[name];
    ++row.calls;
    row.ns += e.durationNs();
    busy_ns += e.durationNs();
  }
  std::vector<std::pair<std::string, Row>> sorted(rows.begin(), rows.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  // Shares of the device's busy time on a GPU; of the batch's wall time on the CPU, where
  // nested operators overlap their callers.
  const double whole_ns = device.is_cuda() ? static_cast<double>(busy_ns) : wall_ms * 1e6;
  std::ofstream out(path);
  out << "# " << device.str() << ": batch " << wall_ms << " ms on the worker; "
      << (device.is_cuda() ? "device busy " : "operators (inclusive) ") << busy_ns / 1e6
      << " ms\nname\tcalls\ttotal_us\tmean_us\tshare\n";
  for (const auto& [name, row] : sorted) {
    out << name << '\t' << row.calls << '\t' << row.ns / 1e3 << '\t'
        << row.ns / 1e3 / static_cast<double>(row.calls) << '\t'
        << (whole_ns > 0 ? static_cast<double>(row.ns) / whole_ns : 0.0) << '\n';
  }
  if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace

Status BatchProfiler::Configure(const Options& options) {
  if (options.dir.empty()) return Status::Ok();
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  const fs::path probe = fs::path(options.dir) / ".qpool-profile-probe";
  if (ec || !std::ofstream(probe)) {
    return InvalidArgument(StrCat("--profile-dir ", options.dir, ": cannot write there",
                                  ec ? " (" + ec.message() + ")" : ""));
  }
  fs::remove(probe, ec);
  g_options = options;
  log::Info("profiling batches ", options.skip + 1, " to ", options.skip + options.batches,
            " into ", options.dir, " (Note [Batch profiler])");
  return Status::Ok();
}

std::unique_ptr<BatchProfiler::Recording> BatchProfiler::Begin(const std::string& pipeline,
                                                               c10::Device device) {
  if (g_options.dir.empty()) return nullptr;
  const int n = g_batches.fetch_add(1);
  if (n < g_options.skip || n >= g_options.skip + g_options.batches) return nullptr;
  bool idle = false;
  if (!g_recording.compare_exchange_strong(idle, true)) {
    log::Warn("profile: batch ", n + 1, " of ", pipeline, " not recorded: another is");
    return nullptr;
  }
  try {
    std::set<prof::ActivityType> activities = {prof::ActivityType::CPU};
    if (device.is_cuda()) activities.insert(prof::ActivityType::CUDA);
    const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
  } catch (const std::exception& e) {
    log::Warn("profile: cannot start the profiler: ", e.what());
    g_recording = false;
    return nullptr;
  }
  const std::string stem =
      (fs::path(g_options.dir) / StrCat(pipeline, "-", n - g_options.skip + 1)).string();
  return std::make_unique<Recording>(stem, device);
}

BatchProfiler::Recording::Recording(std::string stem, c10::Device device)
    : stem_(std::move(stem)), device_(device), started_(std::chrono::steady_clock::now()) {}

BatchProfiler::Recording::~Recording() {
  try {
    if (device_.is_cuda()) {
      c10::impl::getDeviceGuardImpl(device_.type())->synchronizeDevice(device_.index());
    }
    const double wall_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started_)
            .count();
    std::unique_ptr<torch::autograd::profiler::ProfilerResult> result =
        torch::autograd::profiler::disableProfiler();
    result->save(stem_ + ".trace.json");
    WriteSummary(result->events(), device_, wall_ms, stem_ + ".kernels.tsv");
    log::Info("profile: ", stem_, ".trace.json and .kernels.tsv written (", wall_ms, " ms batch)");
  } catch (const std::exception& e) {
    log::Warn("profile: ", stem_, " not written: ", e.what());
  }
  g_recording = false;
}

}  // namespace qpool
