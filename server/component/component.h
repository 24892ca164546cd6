// Component: one executable part of a pipeline (text encoder, UNet, VAE decoder) plus the table of
// every tensor it holds, which qpool owns.
#pragma once

#include <torch/script.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "component/graph_cache.h"
#include "util/status.h"

namespace qpool {

class ModelFile;

class StreamHooks;      // component/stream_ops.h
class CompiledForward;  // component/compiled_forward.h

// What a tensor is for; accounting reports bytes per role.
enum class TensorRole { kWeight, kQuantState, kOther };

// Bytes a component holds, by role, counting each storage once.
struct ComponentBytes {
  uint64_t weight = 0;
  uint64_t quant_state = 0;
  uint64_t other = 0;
  // CUDA graphs of the forward: their memory pools and static inputs (Note [Forward graphs]).
  uint64_t graph = 0;
  uint64_t total() const { return weight + quant_state + other + graph; }
};

// Note [qpool owns the tensors]
// A TorchScript module's `to()` moves parameters and buffers but not plain tensor attributes, and
// it converts integer buffers when asked for a dtype. qpool therefore keeps its own table of
// every tensor slot (parameters, buffers and attributes of every submodule); the residency layer
// (residency/component_residency.h) moves them itself and checks afterwards that every one of
// them is on the target device. Floating weights and buffers take the compute dtype, except
// those of Note [Tensors that keep their dtype].
//
// Note [Channels-last convolutions]
// cuDNN runs convolutions on Hopper in NHWC. Given NCHW weights and activations it converts
// both on every call and converts the result back: in an SD-1.5 UNet step those conversions
// were a large share of the GPU's time (bench/results/stages_sd15_h100.json). A convolution
// whose weight is channels-last takes channels-last activations and returns channels-last ones,
// which the elementwise ops keep, so the kind marks its convolutional denoiser and its 4-d
// weights are laid out channels-last (in the host copy and every device copy alike: moves copy
// the block's bytes). Only on GPUs: a CPU pipeline keeps the layout its images are checked
// against. The VAE decoder too, where its graph norms through qpool::group_norm, which keeps the
// layout: a decoder exported with ATen's norms would copy channels-last activations back to NCHW
// at each of them, which costs more than the conversions, so it stays NCHW.
//
// Note [No tensor constants]
// torch.jit.trace bakes tensors computed during tracing into the graph as constants. No mover
// can reach them, so a component with a non-scalar tensor constant is refused at load, naming
// the node.
//
// Thread safety: Tensors, Rebind, Bytes and device take an internal mutex, so snapshots may be
// read from any thread while the owning worker rebinds. Forward, module() and EnableGraphs are
// the owning worker's only: a component belongs to one pipeline, which one device worker runs at
// a time. Rebind, RebindOne and Refresh drop the forward's CUDA graphs (Note [Forward graphs]) and
// unbind the compiled forward (Note [Compiled forward]); AttachCompiled is the owning worker's.
class Component {
 public:
  // Loads a TorchScript file onto the CPU (Note [Load errors] in component.cpp). InvalidArgument,
  // naming the file, for unreadable or uncompilable files, a module without forward, graphs that
  // hold tensor constants, and tensors qpool cannot place (dtype, or sizes past their storage).
  static StatusOr<std::unique_ptr<Component>> Load(const std::string& name,
                                                   const std::string& path);
  // The same from a file already open: every byte is read through its descriptor (Note [One
  // descriptor per file] in util/model_file.h).
  static StatusOr<std::unique_ptr<Component>> Load(const std::string& name, const ModelFile& file);

  const std::string& name() const { return name_; }
  // Where the tensors are (the device of the last Rebind; the CPU after Load).
  c10::Device device() const;
  // The floating-point dtype of the weights (of the last Rebind; as loaded after Load).
  c10::ScalarType dtype() const;
  // "none", "int8", "nf4" or "w8a8", derived from the tensors of the quantized linear layers.
  std::string quantization() const;

  // Bytes held now, by role. Each storage is counted once; several slots viewing one storage (an
  // arena) count their own bytes, and the storage's remainder goes to its largest view's role.
  // Counted once per change of the slots' tensors (Note [Cached byte counts]); the forward's CUDA
  // graphs count as `graph`.
  ComponentBytes Bytes() const;
  // Number of tensor slots (parameters, buffers, attributes).
  size_t num_tensors() const { return slots_.size(); }
  // Slot i's qualified name ("mid.attn.to_q.absmax") and role.
  const std::string& slot_name(size_t i) const { return slots_[i].name; }
  TensorRole slot_role(size_t i) const { return slots_[i].role; }
  // The module object that holds slot i (a submodule of module(), or its root).
  const c10::ivalue::Object* slot_owner(size_t i) const { return slots_[i].owner.get(); }

  // Every slot's tensor, in slot order.
  std::vector<torch::Tensor> Tensors() const;
  // Puts tensors[i] into slot i (sizes must match num_tensors()) and records where they live.
  // The previous tensors are released by the component.
  void Rebind(const std::vector<torch::Tensor>& tensors, const c10::Device& device,
              c10::ScalarType dtype);
  // Puts one tensor into slot i, leaving device and dtype as they are (for packing a component
  // slot by slot, so that each original tensor is freed as soon as it is copied).
  void RebindOne(size_t i, const torch::Tensor& tensor);

  // Hooks that the stream ops of an instrumented forward call (Note [Streaming] in
  // residency/stream_plan.h) while Forward runs; null: none. The owning worker's only.
  void set_stream_hooks(StreamHooks* hooks) { stream_hooks_ = hooks; }
  // The layout of its 4-d floating tensors wherever the residency places them (Note
  // [Channels-last convolutions]); set before the first placement.
  void set_weight_memory_format(c10::MemoryFormat format) { weight_memory_format_ = format; }
  c10::MemoryFormat weight_memory_format() const { return weight_memory_format_; }

  // Runs `forward`, through a CUDA graph where EnableGraphs allows one (Note [Forward graphs]):
  // on a GPU, on a stream other than the default one, without stream hooks. Catches its errors
  // (c10's and the TorchScript interpreter's): an allocation failure is ResourceExhausted;
  // anything else is Internal with the component's name (shape/device problems are not
  // distinguishable from bugs here).
  StatusOr<torch::Tensor> Forward(std::vector<c10::IValue> inputs);
  // Forward for a component whose forward returns a tuple of `count` tensors (sdxl's second
  // text encoder: hidden states and pooled embeddings); anything else is Internal.
  StatusOr<std::vector<torch::Tensor>> ForwardTuple(std::vector<c10::IValue> inputs, size_t count);

  // Lets Forward replay CUDA graphs of up to `max_graphs` input signatures (least recently used
  // dropped first); 0 (the default) turns graphs off and frees those held.
  void EnableGraphs(size_t max_graphs) { graphs_.set_capacity(max_graphs); }
  // Drops the forward's graphs and frees their memory; later forwards capture again.
  void DropGraphs() { graphs_.Clear(); }
  // What the forward's graphs did and hold now; any thread.
  GraphStats graph_stats() const { return graphs_.stats(); }

  // The executable, for load-time quantization (which rebinds buffers); call Refresh() after.
  torch::jit::Module& module() { return module_; }
  // Rebuilds the tensor table after the module's tensors were replaced.
  void Refresh();

  // Adds an AOTInductor package of the forward compiled for `device_type` (Note [Compiled
  // forward]): Forward runs it while the component lives on that device type and its inputs fit
  // the compiled signature, TorchScript otherwise. InvalidArgument naming `file` when its SHA-256
  // is not `sha256` (unless empty), it cannot be opened (or, with `repository`, lies outside
  // it), was compiled for another device type or beside another TorchScript file, or reads a
  // constant that is no slot of this component. The digest is of the bytes the package is read
  // from (Note [One descriptor per file] in util/model_file.h).
  Status AttachCompiled(const std::string& file, c10::DeviceType device_type,
                        const std::string& sha256, const std::string& repository = "");
  // The attached compiled forward, or null. AttachCompiled runs before the component serves and
  // never replaces it, so any thread may read the const one's metadata (file, attention).
  CompiledForward* compiled() { return compiled_.get(); }
  const CompiledForward* compiled() const { return compiled_.get(); }
  // Forwards run so far, and those of them the compiled forward answered; any thread.
  uint64_t forwards() const { return forwards_.load(); }
  uint64_t compiled_forwards() const { return compiled_forwards_.load(); }
  ~Component();

 private:
  struct Slot {
    c10::intrusive_ptr<c10::ivalue::Object> owner;
    size_t index;
    std::string name;  // qualified, e.g. "mid.attn.to_q.absmax"
    TensorRole role;
  };

  Component(std::string name, torch::jit::Module module);
  StatusOr<c10::IValue> Run(std::vector<c10::IValue> inputs);
  // Whether the compiled forward answers `inputs`, binding it first after a change of the slots.
  bool UseCompiled(const std::vector<c10::IValue>& inputs);
  // Marks the compiled forward's bindings stale and points them at no memory.
  void UnbindCompiled();
  torch::Tensor TensorAt(const Slot& slot) const;
  ComponentBytes CountBytes() const;  // with mu_ held

  std::string name_;
  torch::jit::Module module_;
  std::vector<Slot> slots_;  // fixed after Refresh(); the tensors in them change under mu_
  mutable std::mutex mu_;
  mutable std::optional<ComponentBytes> bytes_;  // Bytes() since the last change of the slots
  c10::Device device_{c10::kCPU};
  c10::ScalarType dtype_ = c10::kFloat;
  StreamHooks* stream_hooks_ = nullptr;
  c10::MemoryFormat weight_memory_format_ = c10::MemoryFormat::Contiguous;
  GraphCache graphs_{name_, 0};  // the owning worker's; after module_, which its graphs read
  std::string source_file_;      // the TorchScript file Load read
  std::unordered_map<std::string, size_t> slot_index_;  // slot by qualified name
  std::unique_ptr<CompiledForward> compiled_;           // the owning worker's
  bool compiled_stale_ = true;  // the slots changed since the compiled forward was bound
  // The owning worker's: why the compiled forward refused inputs, each warned once.
  static constexpr size_t kMaxRefusalsLogged = 16;
  std::unordered_set<std::string> refusals_logged_;
  std::atomic<uint64_t> forwards_{0};
  std::atomic<uint64_t> compiled_forwards_{0};
};

// Whether a method of `module` or of one of its submodules calls the operator `op` (qualified,
// e.g. "qpool::group_norm"), at any depth of its graphs' blocks.
bool GraphCalls(const torch::jit::Module& module, const std::string& op);

// Whether `module`'s graphs call an operator that reads a device tensor's values on the host
// (nonzero and its traced form, item): such a forward waits for the GPU mid-way, and no CUDA
// graph can capture it (Note [Forward graphs] in component/graph_cache.h). The operators of
// traced graphs; a scripted bool(tensor) in control flow is not looked for.
bool GraphWaitsOnHost(const torch::jit::Module& module);

// The attribute names of a quantized linear layer's quant state (Note [Load-time quantization]
// in quant/module_quantizer.h): what accounting counts as quant state and moves with the weight.
inline constexpr const char* kQuantStateNames[] = {"absmax", "code", "nested_absmax", "nested_code",
                                                   "offset"};

// True for the names of quant-state tensors (kQuantStateNames), given either a plain attribute
// name or a qualified one ("up.0.proj.absmax").
bool IsQuantStateName(const std::string& attr_name);

// Note [Tensors that keep their dtype]
// A component's floating-point tensors take its compute dtype when it is placed, except quant
// state (absmax, code tables: their formats define them in float32) and sinusoidal frequency
// tables (`freqs`): a UNet multiplies them by timesteps up to 1000 and, in SDXL, by sizes up to
// thousands, and in float16 or bfloat16 those products lose whole units of phase (diffusers
// computes them in float32). The modules compute the product in the table's dtype and cast the
// embedding back to the compute dtype, and the pipelines pass timesteps and size conditioning in
// float32 (docs/model-repository.md).
inline constexpr const char* kFloat32BufferNames[] = {"freqs"};

// True for tensors that keep the dtype they were saved in (Note [Tensors that keep their dtype]),
// given a plain attribute name or a qualified one.
bool KeepsSavedDtype(const std::string& attr_name);

// The role of an attribute by its name: absmax/code/nested_*/offset are quant state, parameters
// and weight/bias are weights, the rest are other buffers.
TensorRole RoleOf(const std::string& attr_name, bool is_parameter);

// The status of an exception out of LibTorch (a c10::Error, or the std::runtime_error TorchScript's
// interpreter turns an op's error into: Note [Interpreter errors]): ResourceExhausted for an
// allocation failure, else Internal, with `context` and the error's one-line message.
Status TorchErrorStatus(const std::string& context, const std::exception& e);

}  // namespace qpool
