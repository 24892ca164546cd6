// BatchProfiler: chosen batches recorded with PyTorch's profiler (Note [Batch profiler]).
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <string>

#include "util/status.h"

namespace qpool {

// Note [Batch profiler]
// `--profile-dir DIR` records batches with PyTorch's profiler (Kineto): the ATen operators the
// worker's thread runs and, on a GPU, every kernel, copy and memset of the device (CUPTI; a
// denoiser replayed from a CUDA graph shows its kernels one by one). Of the batches the server
// runs, counted from its start over all pipelines, the first `--profile-skip` (default 1: the
// first batch builds plans and captures graphs) run unrecorded and the next `--profile-batches`
// (default 1) are recorded, one at a time. Each recorded batch writes, on its worker once it
// has run (its requests answered before):
//   DIR/<pipeline>-<n>.trace.json  the trace (Perfetto or chrome://tracing open it);
//   DIR/<pipeline>-<n>.kernels.tsv the device's kernels by total time: name, calls, total and
//                                  mean microseconds, share of the device time. Without a GPU,
//                                  the ATen operators by total time (nested ones counted inside
//                                  their callers too).
// A recording costs the batch its own overhead and the writing: profile to find where time
// goes, time with it off. CUPTI sees every kernel of the device, so profile a server whose
// other replicas on that device are idle.
//
// Thread safety: Configure runs at start, before any batch; Begin and the recording's end run on
// the workers, the recordings one at a time.
class BatchProfiler {
 public:
  struct Options {
    std::string dir;  // empty: off
    int skip = 1;
    int batches = 1;
  };

  // A recording in progress; its destructor stops it and writes the files.
  class Recording {
   public:
    Recording(std::string stem, c10::Device device);
    ~Recording();
    Recording(const Recording&) = delete;
    Recording& operator=(const Recording&) = delete;

   private:
    const std::string stem_;
    const c10::Device device_;
    const std::chrono::steady_clock::time_point started_;  // the recording's start
  };

  // Checks and creates the directory (InvalidArgument when it cannot be written) and arms the
  // profiler; an empty dir leaves it off.
  static Status Configure(const Options& options);

  // The recording of the batch of `pipeline` about to run on `device` on this thread, when it
  // is one of those chosen; null otherwise (and always when off).
  static std::unique_ptr<Recording> Begin(const std::string& pipeline, c10::Device device);
};

}  // namespace qpool
