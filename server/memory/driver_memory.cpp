#include "memory/driver_memory.h"

#include <dlfcn.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "util/log.h"

namespace qpool {

namespace {

// The few declarations of nvml.h this reader needs (its C ABI is stable across drivers; the
// header ships with the toolkit, which a CPU-only build does not have).
using NvmlReturn = int;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlInsufficientSize = 7;
constexpr unsigned long long kNvmlValueNotAvailable = ~0ULL;
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlMemoryV1 {
  unsigned long long total, free, used;
};
struct NvmlMemoryV2 {
  unsigned int version;
  unsigned long long total, reserved, free, used;
};
constexpr unsigned int kNvmlMemoryV2Version = sizeof(NvmlMemoryV2) | (2u << 24);
struct NvmlProcessInfo {  // nvmlProcessInfo_t of the _v3 query
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};

template <typename Fn>
Fn Symbol(void* library, const char* name) {
  return reinterpret_cast<Fn>(dlsym(library, name));
}

}  // namespace

struct DriverMemory::Nvml {
  void* library = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  NvmlReturn (*handle_by_bus_id)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*memory_v1)(NvmlDevice, NvmlMemoryV1*) = nullptr;
  NvmlReturn (*memory_v2)(NvmlDevice, NvmlMemoryV2*) = nullptr;  // null on old drivers
  NvmlReturn (*processes)(NvmlDevice, unsigned int*, NvmlProcessInfo*) = nullptr;
  mutable std::mutex mu;
  mutable std::map<std::string, NvmlDevice> handles;  // by PCI bus id; guarded by mu

  ~Nvml() {
    if (shutdown != nullptr) shutdown();
    if (library != nullptr) dlclose(library);
  }

  NvmlDevice Handle(const std::string& bus_id) const {
    std::lock_guard<std::mutex> lock(mu);
    auto it = handles.find(bus_id);
    if (it != handles.end()) return it->second;
    NvmlDevice device = nullptr;
    if (handle_by_bus_id(bus_id.c_str(), &device) != kNvmlSuccess) device = nullptr;
    handles.emplace(bus_id, device);
    return device;
  }
};

std::unique_ptr<DriverMemory> DriverMemory::Open() {
  auto nvml = std::make_unique<Nvml>();
  nvml->library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (nvml->library == nullptr) {
    log::Info("driver memory figures: off (no libnvidia-ml.so.1: ", dlerror(), ")");
    return std::unique_ptr<DriverMemory>(new DriverMemory());
  }
  void* lib = nvml->library;
  auto init = Symbol<NvmlReturn (*)()>(lib, "nvmlInit_v2");
  nvml->handle_by_bus_id =
      Symbol<decltype(Nvml::handle_by_bus_id)>(lib, "nvmlDeviceGetHandleByPciBusId_v2");
  nvml->memory_v1 = Symbol<decltype(Nvml::memory_v1)>(lib, "nvmlDeviceGetMemoryInfo");
  nvml->memory_v2 = Symbol<decltype(Nvml::memory_v2)>(lib, "nvmlDeviceGetMemoryInfo_v2");
  nvml->processes =
      Symbol<decltype(Nvml::processes)>(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
  auto shutdown = Symbol<NvmlReturn (*)()>(lib, "nvmlShutdown");
  if (init == nullptr || shutdown == nullptr || nvml->handle_by_bus_id == nullptr ||
      nvml->memory_v1 == nullptr) {
    log::Warn("driver memory figures: off (libnvidia-ml.so.1 lacks the functions qpool reads)");
    return std::unique_ptr<DriverMemory>(new DriverMemory());
  }
  const NvmlReturn rc = init();
  if (rc != kNvmlSuccess) {
    log::Warn("driver memory figures: off (nvmlInit failed with NVML error ", rc, ")");
    return std::unique_ptr<DriverMemory>(new DriverMemory());
  }
  nvml->shutdown = shutdown;
  log::Info("driver memory figures: NVML");
  return std::unique_ptr<DriverMemory>(new DriverMemory(std::move(nvml)));
}

DriverMemory::DriverMemory(std::unique_ptr<Nvml> nvml) : nvml_(std::move(nvml)) {}
DriverMemory::~DriverMemory() = default;

bool DriverMemory::available() const { return nvml_ != nullptr; }

std::optional<DriverReading> DriverMemory::Read(const std::string& pci_bus_id) const {
  if (nvml_ == nullptr) return std::nullopt;
  NvmlDevice device = nvml_->Handle(pci_bus_id);
  if (device == nullptr) return std::nullopt;
  DriverReading reading;
  NvmlMemoryV2 v2{};
  v2.version = kNvmlMemoryV2Version;
  if (nvml_->memory_v2 != nullptr && nvml_->memory_v2(device, &v2) == kNvmlSuccess) {
    // v2's used leaves out what the driver reserves for itself, as nvidia-smi does.
    reading.used_bytes = v2.used;
    reading.total_bytes = v2.total;
  } else {
    NvmlMemoryV1 v1{};
    if (nvml_->memory_v1(device, &v1) != kNvmlSuccess) return std::nullopt;
    reading.used_bytes = v1.used;
    reading.total_bytes = v1.total;
  }
  if (nvml_->processes == nullptr) return reading;
  std::vector<NvmlProcessInfo> infos(16);
  for (int attempt = 0; attempt < 4; ++attempt) {
    unsigned int count = static_cast<unsigned int>(infos.size());
    const NvmlReturn rc = nvml_->processes(device, &count, infos.data());
    if (rc == kNvmlInsufficientSize) {
      infos.resize(count + 16);  // processes started meanwhile: room for some more
      continue;
    }
    if (rc != kNvmlSuccess) break;
    const auto pid = static_cast<unsigned int>(getpid());
    for (unsigned int i = 0; i < count; ++i) {
      if (infos[i].pid == pid && infos[i].used_gpu_memory != kNvmlValueNotAvailable) {
        reading.process_bytes = infos[i].used_gpu_memory;
      }
    }
    break;
  }
  return reading;
}

}  // namespace qpool
