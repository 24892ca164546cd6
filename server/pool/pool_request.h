// The requests PipelinePool runs (Generate, Encode): what a caller hands in, what it gets back,
// and the listener through which it gets it. Torch-free apart from the Encode tensors.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "pipeline/generate_request.h"
#include "pipeline/pipeline.h"
#include "util/status.h"

namespace qpool {

// A Generate call as the client sent it.
struct GenerateCall {
  std::string pipeline;
  GenerateRequestIn request;
  // Past it the request stops before it starts or at its next denoising step, DeadlineExceeded.
  std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
};

// Where and how a request ran.
struct RunInfo {
  std::string device;  // of the run that answered
  std::string route;   // why the pool chose it: "idle", "onload", "least-loaded", "retry-oom", ...
  int attempts = 1;    // runs started: 2 after a retry on another device
  double queue_seconds = 0;  // arrival to the start of its first run
  double total_seconds = 0;  // arrival to the result
};

struct GenerateReply {
  std::vector<GeneratedImage> images;
  GenerateParams params;  // as resolved: defaults filled in, the seed drawn
  StageTimings timings;
  int batch_size = 1;  // requests whose denoising loop ran with this one's, itself included
  RunInfo run;
};

// Receives one Generate call's progress and end. The pool calls OnProgress on a device worker,
// Cancelled from any thread, and OnReply exactly once (on a worker, or on the thread that called
// PipelinePool::Generate when the call ends before it is queued); nothing after OnReply.
class GenerateListener {
 public:
  virtual ~GenerateListener() = default;
  // After each denoising step: (1-based step, total, seconds since the run started).
  virtual void OnProgress(int step, int total, double elapsed_seconds) = 0;
  // Whether the client went away; polled before the run and between steps.
  virtual bool Cancelled() const = 0;
  // The images, or why the call ended.
  virtual void OnReply(StatusOr<GenerateReply> reply) = 0;
};

struct EncodeCall {
  std::string pipeline;
  std::vector<std::string> prompts;
  std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
};

struct EncodeReply {
  EncodeOutput output;
  RunInfo run;
};

// Receives one Encode call's end, exactly once (as GenerateListener::OnReply).
class EncodeListener {
 public:
  virtual ~EncodeListener() = default;
  virtual void OnReply(StatusOr<EncodeReply> reply) = 0;
};

}  // namespace qpool
