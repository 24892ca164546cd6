#include "residency/residency_state.h"

#include "util/log.h"

namespace qpool {

const char* ResidencyName(Residency residency) {
  switch (residency) {
    case Residency::kUnloaded:
      return "unloaded";
    case Residency::kHost:
      return "host";
    case Residency::kDevice:
      return "device";
    case Residency::kStreaming:
      return "streaming";
  }
  return "unknown";
}

Status CheckTransition(const std::string& component, Residency from, const c10::Device& from_device,
                       Residency to, const c10::Device& to_device) {
  auto describe = [](Residency r, const c10::Device& d) {
    return r == Residency::kDevice || r == Residency::kStreaming
               ? StrCat(ResidencyName(r), "(", d.str(), ")")
               : std::string(ResidencyName(r));
  };
  auto refuse = [&](const std::string& why) {
    return FailedPrecondition(StrCat("component '", component, "' cannot go from ",
                                     describe(from, from_device), " to ", describe(to, to_device),
                                     ": ", why));
  };
  if (to == Residency::kUnloaded) return Status::Ok();
  switch (from) {
    case Residency::kUnloaded:
      if (to == Residency::kHost) return Status::Ok();
      // A load straight to a GPU (Note [Loads straight to the GPU]); meta stands in for one.
      if (to == Residency::kDevice && (to_device.is_cuda() || to_device.is_meta())) {
        return Status::Ok();
      }
      return refuse("it is not loaded");
    case Residency::kHost:
      if (to == Residency::kHost) return Status::Ok();
      if (to_device.is_cpu() || to_device.is_cuda() || to_device.is_meta()) return Status::Ok();
      return refuse("qpool serves on the CPU and CUDA devices only");
    case Residency::kStreaming:
      if (to == Residency::kHost) return Status::Ok();
      if (to == Residency::kStreaming && to_device == from_device) return Status::Ok();
      return refuse("it is streaming for a running request; it returns to the host when it ends");
    case Residency::kDevice:
      if (to == Residency::kHost) return Status::Ok();
      if (to == Residency::kStreaming) return refuse("it is whole on a device; offload it first");
      if (to_device.is_cpu() || to_device.is_cuda() || to_device.is_meta()) return Status::Ok();
      return refuse("qpool serves on the CPU and CUDA devices only");
  }
  return refuse("unknown state");
}

}  // namespace qpool
