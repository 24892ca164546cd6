// CompiledForward: an ahead-of-time compiled (AOTInductor) forward of one component, reading
// the tensors qpool owns (Note [Compiled forward]).
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "util/model_file.h"
#include "util/status.h"

namespace torch::inductor {
class AOTIModelPackageLoader;
}

namespace qpool {

// Note [Compiled forward]
// TorchScript runs a forward op by op; an AOTInductor package (torch.export +
// torch._inductor.aoti_compile_and_package, written by `qpool_export --compile`) runs generated,
// fused kernels. The package is a second executable of a component, never a second owner of
// its tensors (Note [qpool owns the tensors]):
// - The exporter compiles with `aot_inductor.package_constants_in_so=False`: the package holds
//   code only, and its constants (the weights) are supplied at load as *user-managed* constants.
//   Their names are the qualified names of the eager module's parameters and buffers, which are
//   the names of the component's tensor slots (the TorchScript file was traced from the same
//   module): the package's constant "down_blocks.0.resnets.0.conv1.weight" is the slot of that
//   name. Every constant must name a slot; slots the package does not read (a bias the graph
//   never uses) are simply not bound.
// - Binding, as measured with LibTorch 2.11: the runtime caches each constant's data pointer
//   when constants are loaded, so a move must load them again; with user_managed it keeps a new
//   handle on each tensor it is given and never drops it (the old storage outlived its last
//   owner); and its other update path (update_inactive_constant_buffer) copies the weights into
//   a blob of its own. So the runtime is given one *binding* tensor per constant, made once per
//   runner, whose storage points into the slot's storage without owning it (the data pointer is
//   the slot's; no copy), and after every change of the slots (Rebind, RebindOne, Refresh: a
//   move, an offload, an unload) the bindings are re-pointed in place and loaded again as
//   user-managed constants before the next compiled run. Nothing of qpool's is ever referenced
//   by the runtime: freeing a slot's storage frees its memory. They are handed to the runner
//   itself (update_constant_buffer with pointers to the binding tensors, which live as long as
//   the runner). LibTorch 2.11's runtime allocates a tensor handle per user-managed constant on
//   every update and never frees it, so an update happens only when a tensor's address changed
//   since the last one; a rebind onto the same addresses costs nothing. Under `model` offload
//   every onload may move the weights, so each can cost an update.
// - A quantized component's package calls qpool::quant_linear for each quantized layer: the
//   runtime looks the op up in the dispatcher, where the server registered it, so the layer
//   runs the server's kernels (its CUDA paths, Note [Capture-safe kernels], included) on the
//   weights and quant state bound as constants. The exporter compiles against the quant state
//   in float32, the dtype the component keeps it in (Note [Tensors that keep their dtype]).
// - Inductor folds a small parameter into the generated code (tiny's 4-element conv_out.bias is
//   no constant of its package): that value is baked in, like a TorchScript tensor constant.
//   Components are immutable while they serve, so the output is unaffected.
// - A package is compiled for one device type; a CUDA runner for one GPU. The component binds
//   it while it lives on that device type (recreating the runner when it moves to another GPU)
//   and runs TorchScript elsewhere (offloaded to the host, streaming, inputs outside the
//   compiled signature, a dtype or layout the package was not compiled for): the forward's
//   callers see the same outputs within floating-point tolerance either way. The component
//   warns once for each distinct reason it ran TorchScript (Fits says which input, what it is
//   and what the package takes), so a package the pipeline's inputs never fit is seen, not
//   silently bypassed at TorchScript's speed.
// - The exporter records in the package's metadata the SHA-256 of the TorchScript file it was
//   compiled beside (a package from another export is refused at load), the signature of the
//   inputs (dtype and the size range of every dimension), the layout of the 4-d weights and the
//   attention priority order it was compiled under (Note [Attention backend]).
// - CUDA graphs (Note [Forward graphs]) capture whichever forward runs: the package launches its
//   kernels on the caller's current stream and allocates through the caching allocator, and a
//   failed capture turns the cache off as for TorchScript. The runner is opened single-threaded:
//   its threaded path records a CUDA event after every run and, before the next, queries it to
//   reclaim the model instance, and querying an event is forbidden while the thread captures, so
//   every capture of a compiled forward failed and it ran without graphs. The owning worker is
//   the runner's only caller, so nothing needs the threaded path. AOTInductor's own CUDA-graph
//   option is not used: it would capture inside the runtime, out of sight of qpool's accounting.
//
// One dimension of a compiled input: the sizes min, min + step, ... up to max.
struct CompiledDim {
  int64_t min = 0;
  int64_t max = 0;
  int64_t step = 1;
};

// Thread safety: none; the owning component's worker calls every method (Component's contract).
class CompiledForward {
 public:
  // The metadata keys the exporter writes (tools/qpool_export/qpool_export/compile.py).
  static constexpr const char* kSourceKey = "qpool.source_sha256";
  static constexpr const char* kInputsKey = "qpool.inputs";
  static constexpr const char* kLayoutKey = "qpool.weight_layout";
  static constexpr const char* kAttentionKey = "qpool.attention";

  // Opens the package `package` compiled for `device_type` next to the TorchScript file whose
  // SHA-256 is `source_sha256`, and keeps it open: every later read (a runner for another GPU)
  // is of the same file, and fails if it changed (Note [One descriptor per file] in
  // util/model_file.h). InvalidArgument naming the file when it cannot be opened, was compiled
  // for another device type or beside another TorchScript file, or lacks qpool's metadata. A
  // CUDA package is opened for GPU 0 (Bind recreates the runner for another GPU).
  static StatusOr<std::unique_ptr<CompiledForward>> Load(
      std::shared_ptr<const ModelFile> package, c10::DeviceType device_type,
      const std::string& source_sha256);
  ~CompiledForward();
  CompiledForward(const CompiledForward&) = delete;
  CompiledForward& operator=(const CompiledForward&) = delete;

  const std::string& file() const { return file_; }
  c10::DeviceType device_type() const { return device_type_; }
  // The qualified names of the package's constants (weights and buffers), sorted.
  const std::vector<std::string>& constant_names() const { return names_; }
  // The layout the package expects of 4-d floating constants.
  c10::MemoryFormat weight_layout() const { return layout_; }
  // The attention priority order the package was compiled under ("cudnn, flash, efficient, math,
  // overrideable"); empty when the exporter did not record it.
  const std::string& attention() const { return attention_; }

  // Points every constant at the tensor `lookup` gives for its name (null: none) on `device`,
  // without copying. InvalidArgument (nothing bound afterwards) when a constant has no tensor, or
  // its tensor is on another device or has another dtype, size or layout than the package's.
  using Lookup = std::function<const torch::Tensor*(const std::string&)>;
  Status Bind(const Lookup& lookup, const c10::Device& device);
  // Points every binding at no memory: nothing dangles once the tensors are freed.
  void Unbind();
  bool bound() const { return bound_; }
  // The tensors the package reads, by constant_names(): their data pointers are the slots'
  // while bound (empty before the runner's first Bind).
  const std::vector<torch::Tensor>& bindings() const { return bindings_; }

  // Ok when `inputs` are tensors on the bound device within the compiled signature; otherwise
  // InvalidArgument naming the first input outside it, what it is and what the package takes
  // (the caller runs TorchScript instead).
  Status Fits(const std::vector<c10::IValue>& inputs) const;
  // Runs the package on `inputs` (Fits must hold): one output as a tensor, several as a
  // tuple. Throws what the runtime throws.
  c10::IValue Run(const std::vector<c10::IValue>& inputs);

 private:
  struct InputSpec {
    c10::ScalarType dtype;
    std::vector<CompiledDim> dims;
  };

  CompiledForward(std::shared_ptr<const ModelFile> package, c10::DeviceType device_type);
  // (Re)creates the runner for `index` (-1: the CPU).
  void OpenRunner(c10::DeviceIndex index);
  Status ReadMetadata(const std::string& source_sha256);
  Status Check(const std::string& name, const torch::Tensor* t, const c10::Device& device) const;

  std::shared_ptr<const ModelFile> package_;
  std::string file_;     // the package's path, for messages
  std::string opened_;   // a path to package_'s descriptor, for the AOTInductor loader
  c10::DeviceType device_type_;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
  c10::DeviceIndex runner_index_ = -1;
  std::vector<std::string> names_;            // constant names (qualified), sorted
  std::vector<std::string> internal_;         // by names_: the runtime's names of the constants
  std::vector<c10::ScalarType> dtypes_;       // by names_
  std::vector<std::vector<int64_t>> sizes_;   // by names_: as first bound (the sizes are fixed)
  std::vector<torch::Tensor> bindings_;       // by names_, while bound
  std::vector<const void*> loaded_pointers_;  // by names_: the data pointers the runtime holds
  std::vector<InputSpec> inputs_;
  c10::MemoryFormat layout_ = c10::MemoryFormat::Contiguous;
  std::string attention_;
  c10::Device device_{c10::kCPU};
  bool bound_ = false;
};

}  // namespace qpool
