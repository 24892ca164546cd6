// WorkingMemoryModel: the activation memory of a pipeline's requests, learned from the peaks
// measured on the GPU, so that routing and admission can reserve room for a request before it
// runs (Note [Working memory]).
#pragma once

#include <cstdint>
#include <mutex>

namespace qpool {

// Note [Working memory]
// What a diffusion request needs beyond the weights grows with the pixels it produces (latents,
// UNet activations, and above all the VAE decode at full resolution): bytes ~= rate * width *
// height * images. The model keeps the largest rate observed (a conservative estimate: the next
// request of the same size needs as much again), starting from a default rate until the first
// measurement. Measurements come from successful runs on a GPU (Note [Request memory]).
//
// Thread safety: all methods take the mutex.
class WorkingMemoryModel {
 public:
  // `default_bytes_per_pixel` is used until the first Observe.
  explicit WorkingMemoryModel(double default_bytes_per_pixel);

  // A run producing `images` images of width x height needed `bytes` of working memory.
  void Observe(int width, int height, int images, uint64_t bytes);
  // The estimate for such a run.
  uint64_t Estimate(int width, int height, int images) const;
  // The rate in use (bytes per output pixel).
  double bytes_per_pixel() const;

 private:
  mutable std::mutex mu_;
  double rate_;
  bool observed_ = false;
};

}  // namespace qpool
