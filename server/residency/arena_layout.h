// ArenaLayout: where each tensor of a component sits inside one contiguous block of bytes.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace qpool {

// Note [One block per component]
// A component's tensors live as views into one block per place (host copy, device copy). A move
// is then one allocation and one copy, which is as fast as the link allows and either succeeds
// or fails as a whole; freeing a place frees one block. Offsets are aligned to 256 bytes, so
// vectorized kernels see the alignment of a fresh allocation.
class ArenaLayout {
 public:
  static constexpr int64_t kAlignment = 256;

  // Lays out tensors of these shapes, dtypes and (dense) strides, in order.
  static ArenaLayout Plan(const std::vector<torch::Tensor>& like);
  // Lays out the same tensors with offsets assigned in `order` (a permutation of their indices),
  // so that tensors streamed together are contiguous (Note [Streaming]). Views() stays in the
  // tensors' own order.
  static ArenaLayout Plan(const std::vector<torch::Tensor>& like, const std::vector<size_t>& order);

  // Bytes of the whole block.
  int64_t total_bytes() const { return total_bytes_; }
  size_t size() const { return entries_.size(); }
  // Views of `block` (uint8, total_bytes()) with the planned strides, one per planned tensor.
  std::vector<torch::Tensor> Views(const torch::Tensor& block) const;
  // Byte offset and size of tensor i in the block.
  int64_t offset(size_t i) const { return entries_[i].offset; }
  int64_t nbytes(size_t i) const { return entries_[i].nbytes; }
  // The view of tensor i in `part`, a block holding the layout's bytes [base, base + numel).
  torch::Tensor ViewIn(const torch::Tensor& part, size_t i, int64_t base) const;

 private:
  struct Entry {
    int64_t offset;
    int64_t nbytes;
    std::vector<int64_t> sizes;
    std::vector<int64_t> strides;  // dense: contiguous, or channels-last for 4-d tensors
    c10::ScalarType dtype;
  };
  std::vector<Entry> entries_;
  int64_t total_bytes_ = 0;
};

}  // namespace qpool
