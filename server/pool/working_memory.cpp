#include "pool/working_memory.h"

#include <algorithm>

namespace qpool {
namespace {

double Pixels(int width, int height, int images) {
  return static_cast<double>(std::max(width, 0)) * std::max(height, 0) * std::max(images, 1);
}

}  // namespace

WorkingMemoryModel::WorkingMemoryModel(double default_bytes_per_pixel)
    : rate_(default_bytes_per_pixel) {}

void WorkingMemoryModel::Observe(int width, int height, int images, uint64_t bytes) {
  const double pixels = Pixels(width, height, images);
  if (pixels <= 0) return;
  const double rate = static_cast<double>(bytes) / pixels;
  std::lock_guard<std::mutex> lock(mu_);
  rate_ = observed_ ? std::max(rate_, rate) : rate;
  observed_ = true;
}

uint64_t WorkingMemoryModel::Estimate(int width, int height, int images) const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<uint64_t>(rate_ * Pixels(width, height, images));
}

double WorkingMemoryModel::bytes_per_pixel() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rate_;
}

}  // namespace qpool
