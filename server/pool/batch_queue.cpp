#include "pool/batch_queue.h"

#include <algorithm>

#include "pool/batch_profiler.h"

namespace qpool {

BatchQueue::BatchQueue(BatchingSpec options) : options_(options) {}

void BatchQueue::Add(std::shared_ptr<BatchMember> member) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({std::move(member), std::chrono::steady_clock::now()});
  }
  added_.notify_all();
}

bool BatchQueue::Remove(const BatchMember* member) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(queue_.begin(), queue_.end(),
                         [member](const Queued& q) { return q.member.get() == member; });
  if (it == queue_.end()) return false;
  queue_.erase(it);
  return true;
}

size_t BatchQueue::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

std::vector<std::shared_ptr<BatchMember>> BatchQueue::Take() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto delay = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double, std::milli>(options_.max_delay_ms));
  for (;;) {
    if (queue_.empty()) return {};
    const GenerateParams& oldest = queue_.front().member->params();
    std::vector<size_t> chosen = {0};
    int images = oldest.num_images;
    for (size_t i = 1; i < queue_.size() && images < options_.max_batch; ++i) {
      const GenerateParams& p = queue_[i].member->params();
      if (!BatchCompatible(oldest, p) || images + p.num_images > options_.max_batch) continue;
      chosen.push_back(i);
      images += p.num_images;
    }
    const auto deadline = queue_.front().arrived + delay;
    if (images >= options_.max_batch || std::chrono::steady_clock::now() >= deadline) {
      std::vector<std::shared_ptr<BatchMember>> batch;
      for (size_t i : chosen) batch.push_back(queue_[i].member);
      for (auto it = chosen.rbegin(); it != chosen.rend(); ++it) {
        queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(*it));
      }
      return batch;
    }
    added_.wait_until(lock, deadline);
  }
}

void BatchQueue::RunNext(bool run) {
  if (!run) {
    std::shared_ptr<BatchMember> oldest;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) return;
      oldest = std::move(queue_.front().member);
      queue_.pop_front();
    }
    oldest->Start(/*run=*/false, 0);
    return;
  }
  std::vector<std::shared_ptr<BatchMember>> batch = Take();
  int images = 0;
  for (const auto& member : batch) images += member->params().num_images;
  std::vector<std::shared_ptr<BatchMember>> started;
  for (auto& member : batch) {
    if (member->Start(/*run=*/true, images)) started.push_back(std::move(member));
  }
  if (started.empty()) return;
  std::vector<BatchItem> items;
  for (size_t i = 0; i < started.size(); ++i) {
    items.push_back(started[i]->Item(static_cast<int>(started.size()), /*leader=*/i == 0));
  }
  Pipeline& pipeline = started.front()->pipeline();
  // Recorded while the batch runs, when it is one of those chosen (Note [Batch profiler]).
  const std::unique_ptr<BatchProfiler::Recording> recording =
      BatchProfiler::Begin(pipeline.manifest().name, pipeline.device());
  pipeline.GenerateBatch(std::move(items));
}

}  // namespace qpool
