// DriverMemory: the NVIDIA driver's own figures for a GPU (what nvidia-smi shows), read through
// NVML loaded at run time (Note [Driver memory]).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace qpool {

// One GPU as the driver counts it.
struct DriverReading {
  // This process's memory on the GPU (nvidia-smi's per-process "GPU Memory Usage"); absent where
  // the driver does not list this process (a container without the host's PID namespace).
  std::optional<uint64_t> process_bytes;
  uint64_t used_bytes = 0;   // every process's, as nvidia-smi's memory.used
  uint64_t total_bytes = 0;  // the GPU's memory
};

// Note [Driver memory]
// The caching allocator knows what it reserved; the driver also counts the CUDA context, the
// kernels loaded (lazily, as they are first launched), library handles (cuBLAS, cuDNN) and
// anything allocated with cudaMalloc behind the allocator. NVML is the driver's library for
// those figures. It is opened with dlopen when the server starts (libnvidia-ml.so.1 ships with
// the driver, not the toolkit), so a build or a machine without it runs as before, with the
// driver's figures absent rather than zero. GPUs are matched by PCI bus id, which stays right
// under CUDA_VISIBLE_DEVICES where NVML's indices would not.
//
// Thread safety: Read may be called from any thread (NVML is thread-safe; the handle cache takes
// a mutex).
class DriverMemory {
 public:
  // NVML when libnvidia-ml.so.1 loads and initialises, else a reader that reads nothing
  // (available() false). Never fails.
  static std::unique_ptr<DriverMemory> Open();
  virtual ~DriverMemory();

  // Whether the driver's figures can be read at all.
  virtual bool available() const;
  // The driver's figures for the GPU on PCI bus `pci_bus_id` ("0000:3B:00.0"); nullopt when
  // unavailable. Virtual so that tests can stand in for a driver.
  virtual std::optional<DriverReading> Read(const std::string& pci_bus_id) const;

 protected:
  DriverMemory() = default;

 private:
  struct Nvml;
  explicit DriverMemory(std::unique_ptr<Nvml> nvml);
  std::unique_ptr<Nvml> nvml_;
};

}  // namespace qpool
