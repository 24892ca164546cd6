#include "residency/arena_layout.h"

namespace qpool {

ArenaLayout ArenaLayout::Plan(const std::vector<torch::Tensor>& like) {
  ArenaLayout layout;
  int64_t offset = 0;
  for (const auto& t : like) {
    const int64_t nbytes = t.numel() * static_cast<int64_t>(t.element_size());
    layout.entries_.push_back({offset, nbytes, t.sizes().vec(), t.scalar_type()});
    offset += (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  layout.total_bytes_ = offset;
  return layout;
}

std::vector<torch::Tensor> ArenaLayout::Views(const torch::Tensor& block) const {
  TORCH_CHECK(
      block.scalar_type() == torch::kUInt8 && block.dim() == 1 && block.numel() >= total_bytes_,
      "ArenaLayout::Views: block of ", block.numel(), " bytes for a layout of ", total_bytes_);
  std::vector<torch::Tensor> views;
  views.reserve(entries_.size());
  for (const auto& e : entries_) {
    views.push_back(block.narrow(0, e.offset, e.nbytes).view(e.dtype).view(e.sizes));
  }
  return views;
}

}  // namespace qpool
