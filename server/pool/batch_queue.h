// BatchQueue: the Generate requests queued on one replica, taken by its device worker one batch
// at a time.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "config/manifest.h"
#include "pipeline/generate_request.h"
#include "pipeline/pipeline.h"

namespace qpool {

// Note [Dynamic batching]
// Every Generate request goes through the BatchQueue of the replica it was routed to: it is
// added there and one task is queued on the device worker for it. A task takes the oldest request
// and the BatchCompatible ones queued behind it (same size, steps, scheduler, guidance on or off),
// up to batching.max_batch images, waiting until batching.max_delay_ms after the oldest request
// arrived for more to come, and runs them as one Pipeline::GenerateBatch. A task that finds the
// queue empty does nothing (earlier tasks took its request), so each request runs in exactly one
// batch; at shutdown each task ends one request. max_batch 1, the default, runs every request
// alone and never waits.
//
// Only the UNet's denoising loop is batched. Each request's prompts are encoded, its noise drawn
// from its own seed and its images decoded on their own, and its guidance scale applies to its
// own rows; so a batch changes a request's image only by the rounding of the UNet's kernels, which
// BLAS and convolution libraries pick per batch size (bench/results/README.md has the measured
// differences).
// A request cancelled or past its deadline leaves the batch at the next step while the others go
// on. A failure, such as running out of memory, ends every request of the batch; each may then be
// retried on another device (RequestRun::RetryElsewhere). Admission counts the batch's images.

// A queued Generate request, as the batch runner sees it.
class BatchMember {
 public:
  virtual ~BatchMember() = default;
  // Resolved and validated; constant while queued.
  virtual const GenerateParams& params() const = 0;
  // The replica it was queued on.
  virtual Pipeline& pipeline() = 0;
  // On the worker, right before its batch of `batch_images` images runs; `run` false when the
  // worker is stopping. False when the member does not run: it has ended its call (shutdown,
  // deadline, no memory...) and the runner does not touch it again.
  virtual bool Start(bool run, int batch_images) = 0;
  // Its part of a batch of `batch_size` requests; `leader` for the first request of the batch.
  virtual BatchItem Item(int batch_size, bool leader) = 0;
};

// Thread safety: every method takes the mutex and may be called from any thread; Take and RunNext
// run on the replica's device worker, one at a time.
class BatchQueue {
 public:
  explicit BatchQueue(BatchingSpec options);

  // Queues `member`; the caller then queues RunNext on the device worker.
  void Add(std::shared_ptr<BatchMember> member);
  // Removes a member no batch has taken (its worker task could not be queued); false when a
  // batch has taken it already, and will end it.
  bool Remove(const BatchMember* member);
  // The oldest member and the compatible ones behind it, in arrival order, up to max_batch images
  // (the oldest alone may exceed it), after waiting until max_delay_ms past the oldest's arrival
  // for the batch to fill. Empty when nothing is queued.
  std::vector<std::shared_ptr<BatchMember>> Take();
  // The worker task queued with each Add: runs one batch (Take, Start each, GenerateBatch), or,
  // when `run` is false, ends the oldest member.
  void RunNext(bool run);
  // Members waiting.
  size_t size() const;

  const BatchingSpec& options() const { return options_; }

 private:
  struct Queued {
    std::shared_ptr<BatchMember> member;
    std::chrono::steady_clock::time_point arrived;
  };

  const BatchingSpec options_;
  mutable std::mutex mu_;
  std::condition_variable added_;
  std::deque<Queued> queue_;
};

}  // namespace qpool
