#include "component/compiled_forward.h"

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "util/log.h"

namespace qpool {
namespace {

StatusOr<c10::ScalarType> ParseDtype(const std::string& name) {
  static const std::unordered_map<std::string, c10::ScalarType> kDtypes = {
      {"float32", c10::kFloat}, {"float16", c10::kHalf}, {"bfloat16", c10::kBFloat16},
      {"int64", c10::kLong},    {"int32", c10::kInt},    {"bool", c10::kBool}};
  auto it = kDtypes.find(name);
  if (it == kDtypes.end()) return InvalidArgument(StrCat("unknown dtype '", name, "'"));
  return it->second;
}

// "n", "lo:hi" or "lo:hi:step" (sizes lo, lo + step, ... up to hi).
StatusOr<CompiledDim> ParseDim(const std::string& text) {
  std::vector<int64_t> parts;
  try {
    size_t start = 0;
    for (;;) {
      const size_t colon = text.find(':', start);
      size_t used = 0;
      const std::string part = text.substr(start, colon - start);
      parts.push_back(static_cast<int64_t>(std::stoll(part, &used)));
      if (used != part.size()) throw std::invalid_argument(part);
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
  } catch (const std::exception&) {
    parts.clear();
  }
  CompiledDim dim;
  if (parts.size() == 1) parts.push_back(parts[0]);
  if (parts.size() == 2) parts.push_back(1);
  if (parts.size() != 3 || parts[0] < 0 || parts[1] < parts[0] || parts[2] < 1) {
    return InvalidArgument(StrCat("bad dimension '", text, "'"));
  }
  dim.min = parts[0];
  dim.max = parts[1];
  dim.step = parts[2];
  return dim;
}

// One input of a signature as an error names it: "Half[1:64, 4, 8:256:8]".
std::string SignatureText(c10::ScalarType dtype, const std::vector<CompiledDim>& dims) {
  std::string text = StrCat(c10::toString(dtype), "[");
  for (size_t d = 0; d < dims.size(); ++d) {
    const CompiledDim& dim = dims[d];
    text += d == 0 ? "" : ", ";
    text += dim.min == dim.max ? std::to_string(dim.min) : StrCat(dim.min, ":", dim.max);
    if (dim.min != dim.max && dim.step != 1) text += StrCat(":", dim.step);
  }
  return text + "]";
}

// Points `binding`'s storage at `source`'s bytes, owning nothing; sizes and strides are fixed
// (Check).
void PointAt(torch::Tensor& binding, const torch::Tensor& source) {
  const size_t offset = static_cast<size_t>(source.storage_offset()) * source.element_size();
  const size_t nbytes = source.storage().nbytes();
  c10::StorageImpl* storage = binding.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(
      c10::DataPtr(const_cast<void*>(source.const_data_ptr()), source.device()));
  storage->set_nbytes(nbytes > offset ? nbytes - offset : 0);
}

std::string ErrorMessage(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

torch::Tensor NewBinding(const torch::Tensor& source) {
  return torch::from_blob(
      const_cast<void*>(source.const_data_ptr()), source.sizes(), source.strides(), [](void*) {},
      source.options());
}

}  // namespace

CompiledForward::CompiledForward(std::shared_ptr<const ModelFile> package,
                                 c10::DeviceType device_type)
    : package_(std::move(package)),
      file_(package_->path()),
      opened_(package_->descriptor_path()),
      device_type_(device_type) {}

CompiledForward::~CompiledForward() { Unbind(); }

StatusOr<std::unique_ptr<CompiledForward>> CompiledForward::Load(
    std::shared_ptr<const ModelFile> package, c10::DeviceType device_type,
    const std::string& source_sha256) {
  const std::string file = package->path();
  std::unique_ptr<CompiledForward> forward(new CompiledForward(std::move(package), device_type));
  try {
    RETURN_IF_ERROR(forward->ReadMetadata(source_sha256));
    // A CUDA runner needs a GPU: it is opened by the first Bind on one.
    if (device_type == c10::kCPU) forward->OpenRunner(-1);
  } catch (const std::exception& e) {
    return InvalidArgument(
        StrCat(file, ": cannot open the AOTInductor package: ", ErrorMessage(e)));
  }
  return forward;
}

Status CompiledForward::ReadMetadata(const std::string& source_sha256) {
  const auto metadata =
      torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(opened_, "model");
  RETURN_IF_ERROR(package_->CheckUnchanged());
  auto get = [&metadata](const std::string& key) {
    auto it = metadata.find(key);
    return it == metadata.end() ? std::string() : it->second;
  };
  const std::string expected = c10::DeviceTypeName(device_type_, /*lower_case=*/true);
  const std::string device = get("AOTI_DEVICE_KEY");
  if (device != expected) {
    return InvalidArgument(StrCat(file_, ": the package was compiled for device '",
                                  device.empty() ? "(not recorded)" : device,
                                  "', the manifest says '", expected, "'"));
  }
  const std::string source = get(kSourceKey);
  if (source.empty() || get(kInputsKey).empty()) {
    return InvalidArgument(StrCat(file_, ": the package lacks qpool's metadata (", kSourceKey, ", ",
                                  kInputsKey, "); compile it with qpool_export --compile"));
  }
  if (!source_sha256.empty() && source != source_sha256) {
    return InvalidArgument(StrCat(file_,
                                  ": the package was compiled beside a TorchScript file with "
                                  "SHA-256 ",
                                  source, ", not this component's (", source_sha256,
                                  "); export both files together"));
  }
  layout_ = get(kLayoutKey) == "channels_last" ? c10::MemoryFormat::ChannelsLast
                                               : c10::MemoryFormat::Contiguous;
  attention_ = get(kAttentionKey);
  // "float32[1:64,4,4:256,4:256];float32[1:64]": one entry per input.
  std::stringstream entries(get(kInputsKey));
  std::string entry;
  while (std::getline(entries, entry, ';')) {
    const size_t open = entry.find('[');
    if (open == std::string::npos || entry.back() != ']') {
      return InvalidArgument(StrCat(file_, ": bad ", kInputsKey, " entry '", entry, "'"));
    }
    InputSpec spec;
    auto dtype = ParseDtype(entry.substr(0, open));
    if (!dtype.ok())
      return InvalidArgument(StrCat(file_, ": ", kInputsKey, ": ", dtype.status().message()));
    spec.dtype = *dtype;
    std::stringstream dims(entry.substr(open + 1, entry.size() - open - 2));
    std::string dim;
    while (std::getline(dims, dim, ',')) {
      auto range = ParseDim(dim);
      if (!range.ok())
        return InvalidArgument(StrCat(file_, ": ", kInputsKey, ": ", range.status().message()));
      spec.dims.push_back(*range);
    }
    inputs_.push_back(std::move(spec));
  }
  return Status::Ok();
}

void CompiledForward::OpenRunner(c10::DeviceIndex index) {
  Unbind();
  bindings_.clear();
  loaded_pointers_.clear();
  loader_.reset();
  // Single-threaded runs: the owning worker is the only caller, and the runtime's threaded
  // path records an event after each run and queries it before the next, which a CUDA graph
  // capture forbids (Note [Compiled forward]).
  loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
      opened_, "model", /*run_single_threaded=*/true, /*num_runners=*/1, index);
  const Status unchanged = package_->CheckUnchanged();  // what the runner read was verified
  if (!unchanged.ok()) {
    loader_.reset();
    throw std::runtime_error(unchanged.message());
  }
  runner_index_ = index;
  auto* runner = loader_->get_runner();
  const auto fqns = runner->getConstantNamesToOriginalFQNs();
  const auto dtypes = runner->getConstantNamesToDtypes();
  std::vector<std::tuple<std::string, std::string, c10::ScalarType>> named;
  for (const auto& [internal, fqn] : fqns) {
    named.emplace_back(fqn, internal, static_cast<c10::ScalarType>(dtypes.at(internal)));
  }
  std::sort(named.begin(), named.end());
  names_.clear();
  internal_.clear();
  dtypes_.clear();
  sizes_.clear();
  for (auto& [fqn, internal, dtype] : named) {
    names_.push_back(fqn);
    internal_.push_back(internal);
    dtypes_.push_back(dtype);
  }
}

Status CompiledForward::Check(const std::string& name, const torch::Tensor* t,
                              const c10::Device& device) const {
  if (t == nullptr || !t->defined() || !t->has_storage()) {
    return InvalidArgument(StrCat("constant '", name, "' has no tensor in the component"));
  }
  if (t->device() != device) {
    return InvalidArgument(
        StrCat("constant '", name, "' is on ", t->device().str(), ", not ", device.str()));
  }
  const size_t i = std::lower_bound(names_.begin(), names_.end(), name) - names_.begin();
  if (t->scalar_type() != dtypes_[i]) {
    return InvalidArgument(StrCat("constant '", name, "' is ", c10::toString(t->scalar_type()),
                                  ", the package was compiled for ", c10::toString(dtypes_[i])));
  }
  const bool layout_ok =
      t->dim() == 4 && t->is_floating_point() ? t->is_contiguous(layout_) : t->is_contiguous();
  if (!layout_ok) {
    return InvalidArgument(StrCat("constant '", name, "' has strides ", t->strides(),
                                  ", not the layout the package was compiled for"));
  }
  if (!sizes_.empty() && sizes_[i] != t->sizes().vec()) {
    return InvalidArgument(StrCat("constant '", name, "' has sizes ", t->sizes(), ", it had ",
                                  c10::IntArrayRef(sizes_[i]), " when first bound"));
  }
  return Status::Ok();
}

Status CompiledForward::Bind(const Lookup& lookup, const c10::Device& device) {
  Unbind();
  if (device.type() != device_type_) {
    return InvalidArgument(StrCat(file_, ": compiled for ", c10::DeviceTypeName(device_type_, true),
                                  ", the component is on ", device.str()));
  }
  try {
    const c10::DeviceIndex index = device.is_cuda() ? device.index() : -1;
    if (!loader_ || index != runner_index_) OpenRunner(index);
    std::vector<const torch::Tensor*> sources;
    sources.reserve(names_.size());
    for (const auto& name : names_) {
      const torch::Tensor* t = lookup(name);
      Status ok = Check(name, t, device);
      if (!ok.ok()) return InvalidArgument(StrCat(file_, ": ", ok.message()));
      sources.push_back(t);
    }
    // Note [Compiled forward]: the runner's borrowing tensors, made once and re-pointed in
    // place, then handed to the runtime again, which caches each constant's data pointer. The
    // runtime keeps pointers to the binding tensors themselves (user-managed constants), which
    // live as long as the runner: nothing is allocated per bind.
    const bool first = bindings_.empty();
    if (first) bindings_.reserve(names_.size());  // the runtime holds their addresses
    torch::inductor::TensorConstantMap constants;
    std::vector<const void*> pointers;
    pointers.reserve(names_.size());
    for (size_t i = 0; i < names_.size(); ++i) {
      if (first) {
        bindings_.push_back(NewBinding(*sources[i]));
      } else {
        PointAt(bindings_[i], *sources[i]);
      }
      constants.emplace(internal_[i], &bindings_[i]);
      pointers.push_back(sources[i]->const_data_ptr());
    }
    // The runtime's cached pointers are still right when every tensor is back where it was
    // (a rebind onto the same storages; an onload into the same addresses): no update, which
    // would allocate a handle per constant (Note [Compiled forward]).
    if (pointers != loaded_pointers_) {
      loader_->get_runner()->update_constant_buffer(constants, /*use_inactive=*/false,
                                                    /*validate_full_updates=*/true,
                                                    /*user_managed=*/true);
      loaded_pointers_ = std::move(pointers);
    }
  } catch (const std::exception& e) {
    bindings_.clear();
    loader_.reset();
    return InvalidArgument(
        StrCat(file_, ": cannot bind the package's constants: ", ErrorMessage(e)));
  }
  if (sizes_.empty()) {
    for (const auto& b : bindings_) sizes_.push_back(b.sizes().vec());
  }
  device_ = device;
  bound_ = true;
  return Status::Ok();
}

void CompiledForward::Unbind() {
  // The runtime keeps its cached (non-owning) pointers until the next Bind replaces them; it
  // reads them only in Run, which needs bound().
  bound_ = false;
  for (auto& binding : bindings_) {
    c10::StorageImpl* storage = binding.storage().unsafeGetStorageImpl();
    storage->set_data_ptr_noswap(c10::DataPtr(nullptr, binding.device()));
    storage->set_nbytes(0);
  }
}

Status CompiledForward::Fits(const std::vector<c10::IValue>& inputs) const {
  if (!bound_) return FailedPrecondition(StrCat(file_, ": not bound"));
  if (inputs.size() != inputs_.size()) {
    return InvalidArgument(
        StrCat(inputs.size(), " inputs, the package was compiled for ", inputs_.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].isTensor()) {
      return InvalidArgument(StrCat("input ", i, " is a ", inputs[i].tagKind(), ", not a tensor"));
    }
    const torch::Tensor& t = inputs[i].toTensor();
    const InputSpec& spec = inputs_[i];
    bool fits = t.device() == device_ && t.scalar_type() == spec.dtype &&
                t.dim() == static_cast<int64_t>(spec.dims.size());
    for (int64_t d = 0; fits && d < t.dim(); ++d) {
      const CompiledDim& dim = spec.dims[d];
      fits = t.size(d) >= dim.min && t.size(d) <= dim.max && (t.size(d) - dim.min) % dim.step == 0;
    }
    if (!fits) {
      return InvalidArgument(StrCat("input ", i, " is ", c10::toString(t.scalar_type()), t.sizes(),
                                    " on ", t.device().str(), ", the package takes ",
                                    SignatureText(spec.dtype, spec.dims), " on ", device_.str()));
    }
  }
  return Status::Ok();
}

c10::IValue CompiledForward::Run(const std::vector<c10::IValue>& inputs) {
  std::vector<at::Tensor> tensors;
  tensors.reserve(inputs.size());
  for (const auto& v : inputs) tensors.push_back(v.toTensor());
  std::vector<at::Tensor> out = loader_->run(tensors);
  if (out.size() == 1) return c10::IValue(std::move(out[0]));
  std::vector<c10::IValue> elements(out.begin(), out.end());
  return c10::ivalue::Tuple::create(std::move(elements));
}

}  // namespace qpool
