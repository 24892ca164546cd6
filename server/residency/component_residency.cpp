#include "residency/component_residency.h"

#include <chrono>

#include "util/clock.h"

namespace qpool {
namespace {

using Clock = std::chrono::steady_clock;

std::string PlaceName(Residency r, const c10::Device& d) {
  return r == Residency::kDevice ? d.str() : std::string(ResidencyName(r));
}

}  // namespace

ComponentResidency::ComponentResidency(Component& component, ArenaAllocator& arenas,
                                       BlockCopier& copier)
    : component_(component), arenas_(arenas), copier_(copier) {}

Residency ComponentResidency::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

c10::Device ComponentResidency::device() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_;
}

uint64_t ComponentResidency::host_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return host_bytes_;
}

StatusOr<ComponentResidency::Packing> ComponentResidency::PlanPacking(
    c10::ScalarType dtype, std::optional<uint64_t> stream_group_bytes) {
  Packing packing;
  packing.originals = component_.Tensors();
  std::vector<torch::Tensor> like;
  for (size_t i = 0; i < packing.originals.size(); ++i) {
    const auto& t = packing.originals[i];
    // Note [Tensors that keep their dtype].
    const bool c = t.is_floating_point() && !KeepsSavedDtype(component_.slot_name(i));
    // Note [Channels-last convolutions].
    const c10::MemoryFormat format = t.is_floating_point() && t.dim() == 4
                                         ? component_.weight_memory_format()
                                         : c10::MemoryFormat::Contiguous;
    like.push_back(torch::empty(
        t.sizes(),
        t.options().dtype(c ? dtype : t.scalar_type()).device(c10::kMeta).memory_format(format)));
  }
  if (stream_group_bytes) {
    std::vector<int64_t> slot_bytes;
    for (const auto& t : like) slot_bytes.push_back(t.numel() * int64_t{t.element_size()});
    ASSIGN_OR_RETURN(packing.plan, StreamPlan::Make(component_, slot_bytes, *stream_group_bytes));
  }
  packing.layout =
      packing.plan ? ArenaLayout::Plan(like, packing.plan->slot_order()) : ArenaLayout::Plan(like);
  if (packing.plan) packing.plan->SetRanges(*packing.layout);
  return packing;
}

Status ComponentResidency::PackInto(Packing& packing, const ArenaBlock& block,
                                    const c10::Device& device, c10::ScalarType dtype) {
  c10::InferenceMode normal(false);  // Views of a normal block, packed in place
  std::vector<torch::Tensor> views = packing.layout->Views(block.bytes);
  try {
    for (size_t i = 0; i < views.size(); ++i) {
      views[i].copy_(packing.originals[i]);
      component_.RebindOne(i, views[i]);  // the original is freed here if nothing else holds it
      packing.originals[i] = torch::Tensor();
    }
  } catch (const c10::Error& e) {
    return Internal(StrCat("component '", component_.name(), "': packing into ",
                           device.is_cpu() ? std::string("host memory") : device.str(),
                           " failed: ", e.what_without_backtrace()));
  }
  component_.Rebind(views, device, dtype);
  return Status::Ok();
}

Status ComponentResidency::Place(c10::ScalarType dtype, bool pinned,
                                 std::optional<uint64_t> stream_group_bytes) {
  RETURN_IF_ERROR(CheckTransition(component_.name(), state(), device(), Residency::kHost,
                                  c10::Device(c10::kCPU)));
  if (state() != Residency::kUnloaded) return Status::Ok();
  ASSIGN_OR_RETURN(Packing packing, PlanPacking(dtype, stream_group_bytes));
  ASSIGN_OR_RETURN(ArenaBlock block,
                   arenas_.Allocate(c10::Device(c10::kCPU),
                                    static_cast<uint64_t>(packing.layout->total_bytes()), pinned));
  RETURN_IF_ERROR(PackInto(packing, block, c10::Device(c10::kCPU), dtype));
  layout_ = std::move(packing.layout);
  plan_ = std::move(packing.plan);
  dtype_ = dtype;
  host_ = std::move(block);
  host_pinned_ = pinned;
  SetPlace(Residency::kHost, c10::Device(c10::kCPU));
  return Status::Ok();
}

StatusOr<size_t> ComponentResidency::CountTensorsOn(const c10::Device& device,
                                                    const char* after) const {
  size_t checked = 0;
  for (const auto& t : component_.Tensors()) {
    if (t.device() != device) {
      return Internal(StrCat("component '", component_.name(), "': a tensor is on ",
                             t.device().str(), " after ", after, " ", device.str()));
    }
    ++checked;
  }
  return checked;
}

void ComponentResidency::SetPlace(Residency state, const c10::Device& device) {
  std::lock_guard<std::mutex> lock(mu_);
  state_ = state;
  device_ = device;
  host_bytes_ = host_ ? host_->bytes.numel() : 0;
}

StatusOr<ComponentMove> ComponentResidency::PlaceOnDevice(c10::ScalarType dtype,
                                                          const c10::Device& target) {
  RETURN_IF_ERROR(
      CheckTransition(component_.name(), state(), device(), Residency::kDevice, target));
  if (state() != Residency::kUnloaded) {
    return FailedPrecondition(StrCat("component '", component_.name(), "' is already placed"));
  }
  const auto start = Clock::now();
  ASSIGN_OR_RETURN(Packing packing, PlanPacking(dtype, std::nullopt));
  const uint64_t size = static_cast<uint64_t>(packing.layout->total_bytes());
  ASSIGN_OR_RETURN(ArenaBlock block, arenas_.Allocate(target, size, /*pinned=*/false));
  RETURN_IF_ERROR(PackInto(packing, block, target, dtype));
  ComponentMove move;
  move.component = component_.name();
  move.from = "host";
  move.to = target.str();
  move.bytes = size;
  ASSIGN_OR_RETURN(move.tensors_checked, CountTensorsOn(target, "its load onto"));
  layout_ = std::move(packing.layout);
  dtype_ = dtype;
  device_block_ = std::move(block);
  host_pinned_ = false;
  SetPlace(Residency::kDevice, target);
  move.seconds = SecondsSince(start);
  return move;
}

StatusOr<ComponentResidency::Staged> ComponentResidency::Stage(Residency to,
                                                               const c10::Device& target) {
  // A prefetch that was never used may still be writing the device block this move reads or
  // frees (Note [Copy ordering]).
  pending_.Synchronize();
  pending_ = PendingCopy();
  const Residency from = state();
  const c10::Device from_device = device();
  RETURN_IF_ERROR(CheckTransition(component_.name(), from, from_device, to, target));
  if (from == Residency::kStreaming) {
    return FailedPrecondition(
        StrCat("component '", component_.name(), "' is streaming for a running request"));
  }
  if (from == Residency::kUnloaded || to == Residency::kUnloaded) {
    return FailedPrecondition(StrCat("component '", component_.name(), "' is not loaded"));
  }
  const auto start = Clock::now();
  Staged staged;
  staged.to = to;
  staged.device = to == Residency::kHost ? c10::Device(c10::kCPU) : target;
  const uint64_t size = static_cast<uint64_t>(layout_->total_bytes());
  // A host copy is needed (and missing) when going to the host or to the CPU as a device.
  const bool wants_host = to == Residency::kHost || staged.device.is_cpu();
  if (wants_host && !host_) {
    // Only a component on a device can lack a host copy.
    const bool pinned = from_device.is_cuda();
    ASSIGN_OR_RETURN(ArenaBlock host, arenas_.Allocate(c10::Device(c10::kCPU), size, pinned));
    ASSIGN_OR_RETURN(staged.copy, copier_.Copy(host.bytes, device_block_->bytes));
    staged.host_block = std::move(host);
    staged.bytes = size;
  } else if (!wants_host && !(from == Residency::kDevice && from_device == target)) {
    ASSIGN_OR_RETURN(ArenaBlock block, arenas_.Allocate(target, size, /*pinned=*/false));
    const torch::Tensor& source =
        (from == Residency::kDevice && device_block_) ? device_block_->bytes : host_->bytes;
    ASSIGN_OR_RETURN(staged.copy, copier_.Copy(block.bytes, source));
    staged.block = std::move(block);
    staged.bytes = size;
  }
  staged.seconds = SecondsSince(start);
  return staged;
}

StatusOr<ComponentMove> ComponentResidency::Commit(Staged staged, bool wait) {
  const auto start = Clock::now();
  const Residency from = state();
  const c10::Device from_device = device();
  ComponentMove move;
  move.component = component_.name();
  move.from = PlaceName(from, from_device);
  move.to = PlaceName(staged.to, staged.device);
  move.bytes = staged.bytes;
  if (wait || staged.host_block || from == Residency::kDevice) staged.copy.Synchronize();

  const torch::Tensor* source = nullptr;
  if (staged.block) {
    source = &staged.block->bytes;
  } else if (staged.to == Residency::kDevice && !staged.device.is_cpu()) {
    source = &device_block_->bytes;  // already there
  } else {
    source = staged.host_block ? &staged.host_block->bytes : &host_->bytes;
  }
  std::vector<torch::Tensor> previous = component_.Tensors();
  component_.Rebind(layout_->Views(*source), staged.device, dtype_);
  StatusOr<size_t> checked = CountTensorsOn(staged.device, "a move to");
  if (!checked.ok()) {
    component_.Rebind(previous, from_device, dtype_);
    return Internal(StrCat(checked.status().message(), "; the move was undone"));
  }
  move.tensors_checked = *checked;
  previous.clear();
  if (staged.host_block) host_ = std::move(staged.host_block);
  if (staged.block) {
    device_block_ = std::move(staged.block);
  } else if (staged.to == Residency::kHost || staged.device.is_cpu()) {
    device_block_.reset();
  }
  pending_ = wait ? PendingCopy() : std::move(staged.copy);
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_ = staged.to;
    device_ = staged.device;
    host_bytes_ = host_ ? host_->bytes.numel() : 0;
  }
  move.seconds = staged.seconds + SecondsSince(start);
  return move;
}

void ComponentResidency::AwaitPending() {
  pending_.Wait();
  pending_ = PendingCopy();
}

void ComponentResidency::DropHostCopy() {
  if (state() != Residency::kDevice || device().is_cpu() || !host_) return;
  pending_.Synchronize();  // the host copy may be the source of a copy still running
  pending_ = PendingCopy();
  host_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  host_bytes_ = 0;
}

std::vector<ComponentResidency::BlockRef> ComponentResidency::Blocks() const {
  std::vector<BlockRef> out;
  for (const auto* block : {&host_, &device_block_}) {
    if (!block->has_value()) continue;
    const torch::Tensor& t = (*block)->bytes;
    out.push_back({t.storage().getWeakStorageImpl(), t.device(), static_cast<uint64_t>(t.numel()),
                   (*block)->allocator_bytes});
  }
  return out;
}

Status ComponentResidency::BeginStreaming(const c10::Device& device, int prefetch,
                                          uint64_t resident_bytes, bool warm) {
  RETURN_IF_ERROR(
      CheckTransition(component_.name(), state(), this->device(), Residency::kStreaming, device));
  if (!plan_ || !host_) {
    return FailedPrecondition(StrCat("component '", component_.name(),
                                     "' was not loaded for streaming (offload policy sequential)"));
  }
  if (state() == Residency::kStreaming) return Status::Ok();
  streamer_ = std::make_unique<ComponentStreamer>(component_, *plan_, *layout_, host_->bytes,
                                                  device, prefetch, resident_bytes, arenas_,
                                                  copier_, stream_order_, stream_bytes_);
  if (warm) {
    try {
      streamer_->Warm();
    } catch (const c10::Error& e) {
      streamer_.reset();
      return TorchErrorStatus(StrCat("component '", component_.name(), "'"), e);
    }
  }
  component_.set_stream_hooks(streamer_.get());
  std::lock_guard<std::mutex> lock(mu_);
  state_ = Residency::kStreaming;
  device_ = device;
  return Status::Ok();
}

StreamStats ComponentResidency::EndStreaming() {
  if (!streamer_) return StreamStats{};
  streamer_->Finish();
  const StreamStats stats = streamer_->stats();
  component_.set_stream_hooks(nullptr);
  streamer_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  state_ = Residency::kHost;
  device_ = c10::Device(c10::kCPU);
  return stats;
}

void ComponentResidency::Unload() {
  EndStreaming();
  pending_.Synchronize();
  pending_ = PendingCopy();
  std::vector<torch::Tensor> empty(component_.num_tensors());
  component_.Rebind(empty, c10::Device(c10::kCPU), dtype_);
  device_block_.reset();
  host_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  state_ = Residency::kUnloaded;
  device_ = c10::Device(c10::kCPU);
  host_bytes_ = 0;
}

}  // namespace qpool
