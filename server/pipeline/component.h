// Component: one executable part of a pipeline (text encoder, UNet, VAE decoder) plus the table of
// every tensor it holds, which qpool owns.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "util/status.h"

namespace qpool {

// What a tensor is for; accounting reports bytes per role.
enum class TensorRole { kWeight, kQuantState, kOther };

// Bytes a component holds, by role, counting each storage once.
struct ComponentBytes {
  uint64_t weight = 0;
  uint64_t quant_state = 0;
  uint64_t other = 0;
  uint64_t total() const { return weight + quant_state + other; }
};

// Note [qpool owns the tensors]
// A TorchScript module's `to()` moves parameters and buffers but not plain tensor attributes, and
// it converts integer buffers when asked for a dtype. qpool therefore keeps its own table of
// every tensor slot (parameters, buffers and attributes of every submodule), moves them itself,
// and checks afterwards that every one of them is on the target device. Quant state (absmax,
// code tables) keeps its dtype; floating weights and buffers take the compute dtype.
//
// Note [No tensor constants]
// torch.jit.trace bakes tensors computed during tracing into the graph as constants. No mover
// can reach them, so a component with a non-scalar tensor constant is refused at load, naming
// the node.
//
// Thread safety: none. A component belongs to one pipeline, which one device worker runs at a
// time; loading, moving and unloading happen while no request runs on it.
class Component {
 public:
  // Loads a TorchScript file onto the CPU. InvalidArgument for unreadable files or graphs that
  // hold tensor constants; the message names the file.
  static StatusOr<std::unique_ptr<Component>> Load(const std::string& name, const std::string& path);

  const std::string& name() const { return name_; }
  const c10::Device& device() const { return device_; }
  c10::ScalarType dtype() const { return dtype_; }
  // "none", "int8" or "nf4", derived from the weights of the quantized linear layers.
  std::string quantization() const;

  // Moves every tensor to `device`, converting floating weights and buffers to `dtype`.
  // All or nothing: if any copy fails (e.g. out of memory) nothing changes.
  Status MoveTo(const c10::Device& device, c10::ScalarType dtype);

  // Bytes held now, by role, each storage counted once.
  ComponentBytes Bytes() const;
  // Number of tensor slots (parameters, buffers, attributes).
  size_t num_tensors() const { return slots_.size(); }

  // Runs `forward`. Catches c10 errors: InvalidArgument for shape/device problems is not
  // distinguishable from bugs here, so they are Internal with the component's name.
  StatusOr<torch::Tensor> Forward(std::vector<c10::IValue> inputs);

  // The executable, for load-time quantization (which rebinds buffers); call Refresh() after.
  torch::jit::Module& module() { return module_; }
  // Rebuilds the tensor table after the module's tensors were replaced.
  void Refresh();

 private:
  struct Slot {
    c10::intrusive_ptr<c10::ivalue::Object> owner;
    size_t index;
    std::string name;  // qualified, e.g. "mid.attn.to_q.absmax"
    TensorRole role;
  };

  Component(std::string name, torch::jit::Module module);
  torch::Tensor TensorAt(const Slot& slot) const;

  std::string name_;
  torch::jit::Module module_;
  std::vector<Slot> slots_;
  c10::Device device_{c10::kCPU};
  c10::ScalarType dtype_ = c10::kFloat;
};

// The role of an attribute by its name: absmax/code/nested_*/offset are quant state, parameters
// and weight/bias are weights, the rest are other buffers.
TensorRole RoleOf(const std::string& attr_name, bool is_parameter);

}  // namespace qpool
