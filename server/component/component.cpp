#include "component/component.h"

#include <ATen/ThreadLocalState.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <functional>
#include <mutex>
#include <unordered_map>

#include "component/attention_backend.h"
#include "component/compiled_forward.h"
#include "component/load_checks.h"
#include "component/stream_ops.h"
#include "util/file_digest.h"
#include "util/large_stack.h"
#include "util/log.h"
#include "util/model_file.h"

namespace qpool {
namespace {

// The stack LibTorch's load runs on: far more than what Note [Script source limits] lets through
// needs (about 2 MB), reserved and committed only as it is used.
constexpr size_t kLoadStackBytes = size_t{256} << 20;

bool BlockCalls(const torch::jit::Block* block, c10::Symbol op) {
  for (const torch::jit::Node* node : block->nodes()) {
    if (node->kind() == op) return true;
    for (const torch::jit::Block* sub : node->blocks()) {
      if (BlockCalls(sub, op)) return true;
    }
  }
  return false;
}

// Note [TorchScript executor]
// The profiling graph executor re-specializes and optimizes a graph during its first calls:
// the tiny pipeline's first request took many times as long as later ones. qpool runs
// graphs as exported, so the first request is as fast as the rest, and fuses the elementwise
// chains that cost real time into its own ops instead (Note [GEGLU op], Note [Joined GELU op]).
// The switch is thread-local in LibTorch (a setting made once, on the thread that loaded the
// first component, left every other device worker optimizing), so every forward sets it on the
// thread that runs it (Component::Run).

}  // namespace

// Whether the last part of `attr_name` ("up.0.proj.absmax" -> "absmax") is one of `names`.
template <size_t N>
bool LeafIsOneOf(const std::string& attr_name, const char* const (&names)[N]) {
  const size_t dot = attr_name.rfind('.');
  const std::string leaf = dot == std::string::npos ? attr_name : attr_name.substr(dot + 1);
  for (const char* n : names) {
    if (leaf == n) return true;
  }
  return false;
}

bool GraphCalls(const torch::jit::Module& module, const std::string& op) {
  const c10::Symbol symbol = c10::Symbol::fromQualString(op);
  for (const auto& named : module.named_modules()) {
    for (const auto& method : named.value.get_methods()) {
      if (BlockCalls(method.graph()->block(), symbol)) return true;
    }
  }
  return false;
}

bool GraphWaitsOnHost(const torch::jit::Module& module) {
  for (const char* op :
       {"aten::nonzero", "aten::nonzero_numpy", "aten::item", "aten::_local_scalar_dense"}) {
    if (GraphCalls(module, op)) return true;
  }
  return false;
}

bool IsQuantStateName(const std::string& attr_name) {
  return LeafIsOneOf(attr_name, kQuantStateNames);
}

bool KeepsSavedDtype(const std::string& attr_name) {
  return IsQuantStateName(attr_name) || LeafIsOneOf(attr_name, kFloat32BufferNames);
}

TensorRole RoleOf(const std::string& attr_name, bool is_parameter) {
  if (IsQuantStateName(attr_name)) return TensorRole::kQuantState;
  if (is_parameter || attr_name == "weight" || attr_name == "bias") return TensorRole::kWeight;
  return TensorRole::kOther;
}

Component::Component(std::string name, torch::jit::Module module)
    : name_(std::move(name)), module_(std::move(module)) {
  Refresh();
}

Component::~Component() = default;

// Note [Load errors]
// A component file is input, and a manifest without a sha256 hands it to LibTorch unchecked:
// whatever the load throws is INVALID_ARGUMENT naming the file. c10::Error is not all of it:
// torch::jit::load compiles the file's TorchScript source, and the compiler's errors
// (torch::jit::ErrorReport) are plain std::exceptions. A file without a forward method loads, but
// the kind's signature check (Note [Component signatures] in pipeline/pipeline.cpp) reads forward
// and threw. Either way the exception left the pipeline's load task: the device worker dropped
// it, and the load never answered. A tensor the residency cannot place (of a dtype it has no
// copy for, such as the sub-byte Int1) failed the placement as INTERNAL, naming no file; such
// tensors, and layouts other than strided, are refused here, and so is a tensor whose sizes and
// strides reach beyond its storage, which LibTorch's loader takes from the file unchecked: the
// placement's copy of one read past the end of a heap block. All four found by
// fuzz/fuzz_component.
//
// Nor does the load read a file's debug pickles (code/*.debug_pkl: where in the exporting Python
// code each line of its TorchScript came from), which LibTorch reads to point at an error, in
// full trust: a small file whose code does not parse and whose debug pickle is corrupt crashed
// the process (SEGV in SourceRangeDeserializer), another made it allocate and fill gigabytes (a
// string length). qpool shows an error's last line only (Note [Interpreter errors]), which the
// debug pickles do not change.
StatusOr<std::unique_ptr<Component>> Component::Load(const std::string& name,
                                                     const std::string& path) {
  StatusOr<std::unique_ptr<ModelFile>> file = ModelFile::Open(path);
  if (!file.ok()) {
    return InvalidArgument(StrCat(path, ": cannot load TorchScript component '", name,
                                  "': ", file.status().message()));
  }
  return Load(name, **file);
}

StatusOr<std::unique_ptr<Component>> Component::Load(const std::string& name,
                                                     const ModelFile& file) {
  const std::string& path = file.path();
  try {
    RETURN_IF_ERROR(CheckArchive(file));
    // LibTorch's compiler recurses as deep as the source nests: on a thread with a stack to
    // spare, carrying the caller's thread-local state (InferenceMode on a device worker).
    std::optional<torch::jit::Module> loaded;
    std::exception_ptr failure;
    const at::ThreadLocalState state;
    RETURN_IF_ERROR(RunWithStack(kLoadStackBytes, [&] {
      at::ThreadLocalStateGuard guard(state);
      try {
        loaded = torch::jit::load(std::make_shared<ModelFileReader>(file), c10::Device(c10::kCPU),
                                  /*load_debug_files=*/false);
      } catch (...) {
        failure = std::current_exception();
      }
    }));
    if (failure) std::rethrow_exception(failure);
    torch::jit::Module module = std::move(*loaded);
    if (!module.find_method("forward")) {  // Note [Load errors]
      return InvalidArgument(StrCat(path, ": TorchScript component '", name,
                                    "' has no forward method, which is what runs it"));
    }
    module.eval();
    RETURN_IF_ERROR(CheckNoTensorConstants(path, module));
    std::unique_ptr<Component> component(new Component(name, std::move(module)));
    RETURN_IF_ERROR(CheckPlaceableTensors(path, *component));
    component->source_file_ = path;
    return component;
  } catch (const c10::Error& e) {
    return InvalidArgument(StrCat(path, ": cannot load TorchScript component '", name,
                                  "': ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    // Note [Load errors].
    return InvalidArgument(
        StrCat(path, ": cannot load TorchScript component '", name, "': ", e.what()));
  }
}

void Component::Refresh() {
  graphs_.Clear();
  UnbindCompiled();
  std::lock_guard<std::mutex> lock(mu_);
  bytes_.reset();
  slots_.clear();
  slot_index_.clear();
  dtype_ = c10::kFloat;
  bool have_dtype = false;
  for (const auto& named : module_.named_modules()) {
    auto object = named.value._ivalue();
    const auto& type = object->type();
    for (size_t i = 0; i < type->numAttributes(); ++i) {
      if (!type->getAttribute(i)->isSubtypeOf(*c10::TensorType::get())) continue;
      if (!object->getSlot(i).isTensor()) continue;  // None-valued optional tensors
      const std::string attr = type->getAttributeName(i);
      std::string qualified = named.name.empty() ? attr : named.name + "." + attr;
      const TensorRole role = RoleOf(attr, type->is_parameter(i));
      const auto& t = object->getSlot(i).toTensor();
      if (!have_dtype && role == TensorRole::kWeight && t.is_floating_point()) {
        dtype_ = t.scalar_type();
        have_dtype = true;
      }
      slot_index_.emplace(qualified, slots_.size());
      slots_.push_back({object, i, std::move(qualified), role});
    }
  }
}

torch::Tensor Component::TensorAt(const Slot& slot) const {
  return slot.owner->getSlot(slot.index).toTensor();
}

std::string Component::quantization() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& slot : slots_) {
    if (slot.role != TensorRole::kWeight) continue;
    const auto t = TensorAt(slot);
    if (t.scalar_type() == c10::kChar) {
      // w8a8 is int8 plus activation scales in the layer's code (Note [Quantized weight layouts]).
      const auto code = slot.owner->type()->findAttributeSlot("code");
      const bool w8a8 = code && slot.owner->getSlot(*code).isTensor() &&
                        slot.owner->getSlot(*code).toTensor().numel() > 0;
      return w8a8 ? "w8a8" : "int8";
    }
    if (t.scalar_type() == c10::kByte) return "nf4";
  }
  return "none";
}

c10::Device Component::device() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_;
}

c10::ScalarType Component::dtype() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dtype_;
}

std::vector<torch::Tensor> Component::Tensors() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<torch::Tensor> out;
  out.reserve(slots_.size());
  for (const auto& slot : slots_) out.push_back(TensorAt(slot));
  return out;
}

void Component::Rebind(const std::vector<torch::Tensor>& tensors, const c10::Device& device,
                       c10::ScalarType dtype) {
  TORCH_CHECK(tensors.size() == slots_.size(), "Component::Rebind: ", tensors.size(),
              " tensors for ", slots_.size(), " slots");
  graphs_.Clear();  // they read the tensors being replaced
  UnbindCompiled();
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    slots_[i].owner->setSlot(slots_[i].index, c10::IValue(tensors[i]));
  }
  bytes_.reset();
  device_ = device;
  dtype_ = dtype;
}

void Component::RebindOne(size_t i, const torch::Tensor& tensor) {
  graphs_.Clear();
  UnbindCompiled();
  std::lock_guard<std::mutex> lock(mu_);
  slots_.at(i).owner->setSlot(slots_[i].index, c10::IValue(tensor));
  bytes_.reset();
}

// Note [Cached byte counts]
// Admission and routing read the bytes of every component of every loaded pipeline for each
// request (the device's budget snapshot), and walking a UNet's slots and hashing their storages
// took milliseconds per request once a GPU held several pipelines. The count changes only when
// the slots' tensors do, which is through Rebind, RebindOne and Refresh (after module() edits),
// all under mu_: each drops the cached count, and the next Bytes() counts again.
ComponentBytes Component::Bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!bytes_) bytes_ = CountBytes();
  ComponentBytes bytes = *bytes_;
  bytes.graph = graphs_.bytes();
  return bytes;
}

ComponentBytes Component::CountBytes() const {
  struct View {
    int64_t offset;
    uint64_t nbytes;
    TensorRole role;
  };
  struct Storage {
    uint64_t nbytes = 0;
    std::vector<View> views;
  };
  std::unordered_map<const void*, Storage> storages;
  for (const auto& slot : slots_) {
    const auto t = TensorAt(slot);
    if (!t.defined() || !t.has_storage()) continue;
    Storage& s = storages[t.storage().unsafeGetStorageImpl()];
    s.nbytes = t.storage().nbytes();
    const int64_t offset = t.storage_offset() * static_cast<int64_t>(t.element_size());
    const uint64_t nbytes = t.numel() * t.element_size();
    bool seen = false;
    for (const auto& v : s.views) seen = seen || (v.offset == offset && v.nbytes == nbytes);
    if (!seen) s.views.push_back({offset, nbytes, slot.role});
  }
  ComponentBytes bytes;
  auto add = [&bytes](TensorRole role, uint64_t n) {
    switch (role) {
      case TensorRole::kWeight:
        bytes.weight += n;
        break;
      case TensorRole::kQuantState:
        bytes.quant_state += n;
        break;
      case TensorRole::kOther:
        bytes.other += n;
        break;
    }
  };
  for (const auto& [impl, s] : storages) {
    uint64_t viewed = 0;
    const View* largest = &s.views.front();
    for (const auto& v : s.views) {
      add(v.role, v.nbytes);
      viewed += v.nbytes;
      if (v.nbytes > largest->nbytes) largest = &v;
    }
    if (s.nbytes > viewed) add(largest->role, s.nbytes - viewed);
  }
  return bytes;
}

Status Component::AttachCompiled(const std::string& file, c10::DeviceType device_type,
                                 const std::string& sha256, const std::string& repository) {
  StatusOr<std::unique_ptr<ModelFile>> opened = ModelFile::Open(file, repository);
  if (!opened.ok()) {
    return InvalidArgument(
        StrCat(file, ": cannot open the AOTInductor package: ", opened.status().message()));
  }
  std::shared_ptr<const ModelFile> package = std::move(*opened);
  if (!sha256.empty()) {
    ASSIGN_OR_RETURN(std::string digest, package->Sha256());
    if (digest != sha256) {
      return InvalidArgument(StrCat(file, " has SHA-256 ", digest, ", the manifest records ",
                                    sha256, ": the file is corrupt or not this component's"));
    }
  }
  ASSIGN_OR_RETURN(std::string source, CachedSha256File(source_file_));
  ASSIGN_OR_RETURN(auto compiled, CompiledForward::Load(std::move(package), device_type, source));
  // A CUDA package's names are read when it is first bound, on a GPU.
  for (const std::string& constant : compiled->constant_names()) {
    if (slot_index_.count(constant) == 0) {
      return InvalidArgument(StrCat(file, ": the package reads constant '", constant,
                                    "', which is no tensor of component '", name_, "'"));
    }
  }
  compiled_ = std::move(compiled);
  compiled_stale_ = true;
  log::Info("component '", name_, "': compiled forward ", file, " for ",
            c10::DeviceTypeName(device_type, /*lower_case=*/true), ", attention order ",
            compiled_->attention().empty() ? "(not recorded)" : compiled_->attention());
  // Note [Attention backend]: the server's order is set before any pipeline loads.
  if (device_type == c10::kCUDA) {
    const std::string mismatch =
        CompiledAttentionMismatch(compiled_->attention(), CurrentAttentionPriority());
    if (!mismatch.empty())
      log::Warn("component '", name_, "': compiled forward ", file, ": ", mismatch);
  }
  return Status::Ok();
}

void Component::UnbindCompiled() {
  compiled_stale_ = true;
  if (compiled_) compiled_->Unbind();
}

bool Component::UseCompiled(const std::vector<c10::IValue>& inputs) {
  // Streaming binds tensors during the forward through TorchScript's stream ops.
  if (!compiled_ || stream_hooks_ != nullptr) return false;
  const c10::Device where = device();
  if (where.type() != compiled_->device_type()) return false;
  if (compiled_stale_) {
    compiled_stale_ = false;
    const std::vector<torch::Tensor> tensors = Tensors();
    Status bound = compiled_->Bind(
        [this, &tensors](const std::string& name) -> const torch::Tensor* {
          auto it = slot_index_.find(name);
          return it == slot_index_.end() ? nullptr : &tensors[it->second];
        },
        where);
    if (!bound.ok()) {
      log::Warn("component '", name_, "': running TorchScript on ", where.str(),
                ", the compiled forward does not fit: ", bound.message());
    }
  }
  if (!compiled_->bound()) return false;
  // Note [Compiled forward]: inputs outside the signature run TorchScript, correct but without
  // the package's speed; each distinct reason is said once, so that a package that never
  // answers the pipeline's inputs is seen, not silently bypassed.
  Status fits = compiled_->Fits(inputs);
  if (!fits.ok() && refusals_logged_.size() < kMaxRefusalsLogged &&
      refusals_logged_.insert(fits.message()).second) {
    log::Warn("component '", name_, "': running TorchScript, the compiled forward ",
              compiled_->file(), " does not take these inputs: ", fits.message());
  }
  return fits.ok();
}

StatusOr<c10::IValue> Component::Run(std::vector<c10::IValue> inputs) {
  const torch::jit::GraphOptimizerEnabledGuard as_exported(false);  // Note [TorchScript executor]
  try {
    const bool compiled = UseCompiled(inputs);
    forwards_.fetch_add(1);
    if (compiled) compiled_forwards_.fetch_add(1);
    // Streaming binds tensors during the forward, which a graph cannot follow.
    if (stream_hooks_ == nullptr && graphs_.capacity() > 0 && device().is_cuda()) {
      auto replayed = graphs_.Run(inputs, [this, compiled](std::vector<c10::IValue> in) {
        return compiled ? compiled_->Run(in) : module_.forward(std::move(in));
      });
      if (replayed) return *std::move(replayed);
    }
    if (compiled) return compiled_->Run(inputs);
    StreamHooksScope streaming(stream_hooks_);
    return module_.forward(std::move(inputs));
  } catch (const std::exception& e) {
    return TorchErrorStatus(StrCat("component '", name_, "' failed"), e);
  }
}

StatusOr<torch::Tensor> Component::Forward(std::vector<c10::IValue> inputs) {
  ASSIGN_OR_RETURN(c10::IValue out, Run(std::move(inputs)));
  if (!out.isTensor()) {
    return Internal(
        StrCat("component '", name_, "' returned ", out.tagKind(), ", expected a Tensor"));
  }
  return out.toTensor();
}

StatusOr<std::vector<torch::Tensor>> Component::ForwardTuple(std::vector<c10::IValue> inputs,
                                                             size_t count) {
  ASSIGN_OR_RETURN(c10::IValue out, Run(std::move(inputs)));
  std::vector<torch::Tensor> tensors;
  if (out.isTuple()) {
    for (const c10::IValue& v : out.toTupleRef().elements()) {
      if (v.isTensor()) tensors.push_back(v.toTensor());
    }
  }
  if (!out.isTuple() || tensors.size() != count || out.toTupleRef().elements().size() != count) {
    return Internal(StrCat("component '", name_, "' returned ", out.tagKind(),
                           ", expected a tuple of ", count, " tensors"));
  }
  return tensors;
}

// Note [Interpreter errors]
// TorchScript's interpreter catches an op's c10::Error (c10::OutOfMemoryError included) and
// throws a std::runtime_error instead: "The following operation failed in the TorchScript
// interpreter.", the TorchScript stack, then "RuntimeError: <the op's message>". Catching only
// c10::Error let a CUDA OOM in a forward escape the request's task, so its call never finished.

Status TorchErrorStatus(const std::string& context, const std::exception& e) {
  std::string shown;
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    shown = c10_error->what_without_backtrace();
  } else {
    // Note [Interpreter errors]: the op's own message is the last non-empty line.
    const std::string text = e.what();
    const size_t end = text.find_last_not_of('\n');
    const size_t newline = end == std::string::npos ? std::string::npos : text.rfind('\n', end);
    const size_t begin = newline == std::string::npos ? 0 : newline + 1;
    shown = end == std::string::npos ? text : text.substr(begin, end + 1 - begin);
  }
  std::string msg = StrCat(context, ": ", shown);
  const bool oom = std::string(e.what()).find("out of memory") != std::string::npos;
  return oom ? ResourceExhausted(std::move(msg)) : Internal(std::move(msg));
}

}  // namespace qpool
