// Where a pipeline load's time went (Note [Load stages]).
#pragma once

#include <cstdint>

namespace qpool {

// Note [Load stages]
// A load reports where its time went, because "the load took 56 s" does not say what to do about
// it: waiting for the files' SHA-256 (cached per file, so a reload skips it; the files are hashed
// in parallel, so this is the wait past the reading of earlier files), reading and parsing
// the component files (read_bytes of them: a rate near the disk's says the page cache did not
// hold them), quantizing at load time, packing the tensors into host blocks (pinned where the
// policy offloads; any dtype conversion happens here) and copying them to the device (under
// `none` on a GPU the tensors go straight into device blocks: all of it is the device stage,
// Note [Loads straight to the GPU]), and the
// warm-up request. LoadPipeline's response carries them (LoadStages in qpool.proto) and the
// server logs them with the load; a load onto several devices sums each stage over its replicas.
struct LoadStages {
  double verify_seconds = 0;
  double read_seconds = 0;
  uint64_t read_bytes = 0;
  double quantize_seconds = 0;
  double pack_seconds = 0;
  double device_seconds = 0;
  double warmup_seconds = 0;

  LoadStages& operator+=(const LoadStages& o) {
    verify_seconds += o.verify_seconds;
    read_seconds += o.read_seconds;
    read_bytes += o.read_bytes;
    quantize_seconds += o.quantize_seconds;
    pack_seconds += o.pack_seconds;
    device_seconds += o.device_seconds;
    warmup_seconds += o.warmup_seconds;
    return *this;
  }
};

}  // namespace qpool
