#include "residency/arena_layout.h"

namespace qpool {

ArenaLayout ArenaLayout::Plan(const std::vector<torch::Tensor>& like) {
  std::vector<size_t> order(like.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  return Plan(like, order);
}

ArenaLayout ArenaLayout::Plan(const std::vector<torch::Tensor>& like,
                              const std::vector<size_t>& order) {
  TORCH_CHECK(order.size() == like.size(), "ArenaLayout::Plan: order of ", order.size(), " for ",
              like.size(), " tensors");
  ArenaLayout layout;
  layout.entries_.resize(like.size());
  int64_t offset = 0;
  for (size_t i : order) {
    const auto& t = like.at(i);
    const int64_t nbytes = t.numel() * static_cast<int64_t>(t.element_size());
    TORCH_CHECK(t.is_non_overlapping_and_dense(), "ArenaLayout::Plan: tensor ", i, " is not dense");
    layout.entries_[i] = {offset, nbytes, t.sizes().vec(), t.strides().vec(), t.scalar_type()};
    offset += (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  layout.total_bytes_ = offset;
  return layout;
}

torch::Tensor ArenaLayout::ViewIn(const torch::Tensor& part, size_t i, int64_t base) const {
  const Entry& e = entries_.at(i);
  TORCH_CHECK(e.offset >= base && e.offset + e.nbytes <= base + part.numel(),
              "ArenaLayout::ViewIn: tensor ", i, " is outside the part");
  return part.narrow(0, e.offset - base, e.nbytes).view(e.dtype).as_strided(e.sizes, e.strides);
}

std::vector<torch::Tensor> ArenaLayout::Views(const torch::Tensor& block) const {
  TORCH_CHECK(
      block.scalar_type() == torch::kUInt8 && block.dim() == 1 && block.numel() >= total_bytes_,
      "ArenaLayout::Views: block of ", block.numel(), " bytes for a layout of ", total_bytes_);
  std::vector<torch::Tensor> views;
  views.reserve(entries_.size());
  for (const auto& e : entries_) {
    views.push_back(
        block.narrow(0, e.offset, e.nbytes).view(e.dtype).as_strided(e.sizes, e.strides));
  }
  return views;
}

}  // namespace qpool
