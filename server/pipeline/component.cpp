#include "pipeline/component.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <functional>
#include <mutex>
#include <unordered_set>

#include "quant/module_quantizer.h"
#include "util/log.h"

namespace qpool {
namespace {

// Finds the first non-scalar tensor constant in a graph (recursing into blocks).
const torch::jit::Node* FindTensorConstant(const torch::jit::Block* block) {
  for (const torch::jit::Node* node : block->nodes()) {
    if (node->kind() == c10::prim::Constant && node->outputs().size() == 1 &&
        node->output()->type()->kind() == c10::TypeKind::TensorType) {
      auto value = torch::jit::toIValue(node->output());
      if (value && value->isTensor() && value->toTensor().numel() > 1) return node;
    }
    for (const torch::jit::Block* sub : node->blocks()) {
      if (const auto* found = FindTensorConstant(sub)) return found;
    }
  }
  return nullptr;
}

Status CheckNoTensorConstants(const std::string& path, const torch::jit::Module& module) {
  for (const auto& named : module.named_modules()) {
    for (const auto& method : named.value.get_methods()) {
      const auto* node = FindTensorConstant(method.graph()->block());
      if (node == nullptr) continue;
      auto tensor = torch::jit::toIValue(node->output())->toTensor();
      std::ostringstream where;
      where << *node;
      std::string text = where.str();
      if (!text.empty() && text.back() == '\n') text.pop_back();
      return InvalidArgument(StrCat(
          path, ": method '", named.name.empty() ? "" : named.name + ".", method.name(),
          "' holds a tensor constant of shape ", tensor.sizes(), " (", text,
          "); re-export it with every tensor in a buffer (tensor constants stay on the export "
          "device and cannot be moved)"));
    }
  }
  return Status::Ok();
}

// Note [TorchScript executor]
// The profiling graph executor re-specializes and optimizes a graph during its first calls:
// the tiny pipeline's first request took ~12 s on 2 CPU cores, later ones ~0.7 s, and the gain
// on convolution/attention-bound diffusion graphs is nil (their time is in ATen kernels). qpool
// runs graphs as exported, so the first request is as fast as the rest.
void ConfigureExecutorOnce() {
  static std::once_flag once;
  std::call_once(once, [] { torch::jit::setGraphExecutorOptimize(false); });
}

}  // namespace

TensorRole RoleOf(const std::string& attr_name, bool is_parameter) {
  if (quant::IsQuantStateName(attr_name)) return TensorRole::kQuantState;
  if (is_parameter || attr_name == "weight" || attr_name == "bias") return TensorRole::kWeight;
  return TensorRole::kOther;
}

Component::Component(std::string name, torch::jit::Module module)
    : name_(std::move(name)), module_(std::move(module)) {
  Refresh();
}

StatusOr<std::unique_ptr<Component>> Component::Load(const std::string& name,
                                                     const std::string& path) {
  ConfigureExecutorOnce();
  try {
    torch::jit::Module module = torch::jit::load(path, c10::Device(c10::kCPU));
    module.eval();
    RETURN_IF_ERROR(CheckNoTensorConstants(path, module));
    return std::unique_ptr<Component>(new Component(name, std::move(module)));
  } catch (const c10::Error& e) {
    return InvalidArgument(StrCat(path, ": cannot load TorchScript component '", name,
                                  "': ", e.what_without_backtrace()));
  }
}

void Component::Refresh() {
  slots_.clear();
  for (const auto& named : module_.named_modules()) {
    auto object = named.value._ivalue();
    const auto& type = object->type();
    for (size_t i = 0; i < type->numAttributes(); ++i) {
      if (!type->getAttribute(i)->isSubtypeOf(*c10::TensorType::get())) continue;
      if (!object->getSlot(i).isTensor()) continue;  // None-valued optional tensors
      const std::string attr = type->getAttributeName(i);
      std::string qualified = named.name.empty() ? attr : named.name + "." + attr;
      slots_.push_back({object, i, std::move(qualified), RoleOf(attr, type->is_parameter(i))});
    }
  }
}

torch::Tensor Component::TensorAt(const Slot& slot) const {
  return slot.owner->getSlot(slot.index).toTensor();
}

std::string Component::quantization() const {
  for (const auto& slot : slots_) {
    if (slot.role != TensorRole::kWeight) continue;
    const auto t = TensorAt(slot);
    if (t.scalar_type() == c10::kChar) return "int8";
    if (t.scalar_type() == c10::kByte) return "nf4";
  }
  return "none";
}

Status Component::MoveTo(const c10::Device& device, c10::ScalarType dtype) {
  // Note [qpool owns the tensors]: first make every new tensor, then swap them all in.
  std::vector<torch::Tensor> moved;
  moved.reserve(slots_.size());
  try {
    c10::InferenceMode guard(false);
    for (const auto& slot : slots_) {
      torch::Tensor t = TensorAt(slot);
      const bool convert = t.is_floating_point() && slot.role != TensorRole::kQuantState;
      moved.push_back(t.to(device, convert ? dtype : t.scalar_type(), /*non_blocking=*/false,
                           /*copy=*/false));
    }
  } catch (const c10::Error& e) {
    moved.clear();
    const bool oom = std::string(e.what()).find("out of memory") != std::string::npos;
    std::string msg = StrCat("moving component '", name_, "' to ", device.str(), " failed: ",
                             e.what_without_backtrace());
    return oom ? ResourceExhausted(msg) : Internal(msg);
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    slots_[i].owner->setSlot(slots_[i].index, c10::IValue(moved[i]));
  }
  moved.clear();
  for (const auto& slot : slots_) {
    if (TensorAt(slot).device() != device) {
      return Internal(StrCat("component '", name_, "': tensor '", slot.name, "' is on ",
                             TensorAt(slot).device().str(), " after a move to ", device.str()));
    }
  }
  device_ = device;
  dtype_ = dtype;
  return Status::Ok();
}

ComponentBytes Component::Bytes() const {
  ComponentBytes bytes;
  std::unordered_set<const void*> seen;
  for (const auto& slot : slots_) {
    const auto t = TensorAt(slot);
    if (!t.defined() || !t.has_storage()) continue;
    const void* key = t.storage().unsafeGetStorageImpl();
    if (!seen.insert(key).second) continue;
    const uint64_t n = t.storage().nbytes();
    switch (slot.role) {
      case TensorRole::kWeight: bytes.weight += n; break;
      case TensorRole::kQuantState: bytes.quant_state += n; break;
      case TensorRole::kOther: bytes.other += n; break;
    }
  }
  return bytes;
}

StatusOr<torch::Tensor> Component::Forward(std::vector<c10::IValue> inputs) {
  try {
    c10::IValue out = module_.forward(std::move(inputs));
    if (!out.isTensor()) {
      return Internal(StrCat("component '", name_, "' returned ", out.tagKind(),
                             ", expected a Tensor"));
    }
    return out.toTensor();
  } catch (const c10::Error& e) {
    const bool oom = std::string(e.what()).find("out of memory") != std::string::npos;
    std::string msg =
        StrCat("component '", name_, "' failed: ", e.what_without_backtrace());
    return oom ? ResourceExhausted(msg) : Internal(msg);
  }
}

}  // namespace qpool
