// AdmissionOptions: the memory limits the pool admits loads and requests under.
#pragma once

#include <cstdint>

namespace qpool {

// Admission limits (Note [Memory budget], Note [Host memory budget] in pool/pipeline_registry.h).
struct AdmissionOptions {
  // Fraction of each GPU's total memory that pipelines and the running request may use.
  double memory_budget = 0.9;
  // Working memory per output pixel assumed until a pipeline's first request on a GPU has been
  // measured; 0: its kind's estimate (PipelineKind::default_working_bytes_per_pixel).
  uint64_t default_working_bytes_per_pixel = 0;
  // Host memory pipelines may hold, all devices together; 0: no limit.
  uint64_t host_budget_bytes = 0;
};

}  // namespace qpool
