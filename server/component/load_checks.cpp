#include "component/load_checks.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/ir/constants.h>

#include <sstream>

#include "component/component.h"
#include "component/pickle_bounds.h"
#include "component/script_source_limits.h"
#include "util/log.h"
#include "util/model_file.h"

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

// Whether qpool places tensors of `dtype`: the residency copies them into a block and converts
// floating ones to a compute dtype (Note [Load errors]). The sub-byte integers and the quantized
// dtypes have no such copy, float4 no conversion, and the bit dtypes no use in a component.
bool IsPlaceableDtype(c10::ScalarType dtype) {
  return dtype == c10::kFloat || dtype == c10::kDouble || dtype == c10::kHalf ||
         dtype == c10::kBFloat16 || c10::isFloat8Type(dtype) || c10::isComplexType(dtype) ||
         c10::isIntegralType(dtype, /*includeBool=*/true);
}

// Whether every element of strided `t` lies inside its storage. LibTorch's loader takes a
// tensor's sizes, strides and offset from the file as they are (Note [Load errors]).
bool WithinStorage(const torch::Tensor& t) {
  if (!t.has_storage() || t.storage_offset() < 0) return false;
  int64_t last = t.storage_offset();  // the index of the last element, in elements
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 0) return true;  // no elements
    int64_t step = 0;
    if (t.size(d) < 0 || t.stride(d) < 0 ||
        __builtin_mul_overflow(t.size(d) - 1, t.stride(d), &step) ||
        __builtin_add_overflow(last, step, &last)) {
      return false;
    }
  }
  uint64_t bytes = 0;
  return !__builtin_mul_overflow(static_cast<uint64_t>(last) + 1, t.element_size(), &bytes) &&
         bytes <= t.storage().nbytes();
}

}  // namespace

ModelFileReader::ModelFileReader(const ModelFile& file) : file_(file) {}

size_t ModelFileReader::size() const { return static_cast<size_t>(file_.size()); }

size_t ModelFileReader::read(uint64_t pos, void* buf, size_t n, const char* what) const {
  StatusOr<size_t> got = file_.ReadAt(pos, buf, n);
  TORCH_CHECK(got.ok(), got.status().message(), " (", what, ")");
  return *got;
}

// Note [Script source limits]: the file's TorchScript source records, scanned before the
// compiler reads them, and what the records inflate to. torch.jit.save deflates the source and
// its debug pickles (which the load does not read) and stores everything else, so the other
// records together cannot be larger than the file: a zip whose records claim more (a small file
// inflating to gigabytes) is refused before anything is read.
Status CheckArchive(const ModelFile& file) {
  const std::string& path = file.path();
  const uint64_t file_bytes = static_cast<uint64_t>(file.size());
  // c10::Error for what is not a zip.
  caffe2::serialize::PyTorchStreamReader reader(std::make_shared<ModelFileReader>(file));
  uint64_t source_bytes = 0;
  uint64_t other_bytes = 0;
  for (const std::string& record : reader.getAllRecords()) {
    const uint64_t size = reader.getRecordSize(record);
    auto ends_with = [&](const std::string& suffix) {
      return record.size() > suffix.size() &&
             record.compare(record.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (ends_with(".debug_pkl")) continue;  // deflated too, and never read (Note [Load errors])
    const bool source = record.rfind("code/", 0) == 0 && ends_with(".py");
    if (!source) {
      other_bytes += size;
      if (other_bytes > file_bytes) {
        return InvalidArgument(StrCat(path,
                                      ": the component file's records inflate to more than "
                                      "its ",
                                      file_bytes, " bytes (at ", record,
                                      "): refused before they are read"));
      }
      if (ends_with(".pkl")) {  // data.pkl, constants.pkl: Note [Pickle bounds]
        auto [data, bytes] = reader.getRecord(record);
        RETURN_IF_ERROR(CheckPickleBounds(
            std::string_view(static_cast<const char*>(data.get()), bytes), path, record));
      }
      continue;
    }
    source_bytes += size;
    if (source_bytes > kMaxSourceBytes) {
      return InvalidArgument(StrCat(path, ": the component's TorchScript source is larger than ",
                                    kMaxSourceBytes >> 20, " MiB (at ", record, ")"));
    }
    auto [data, bytes] = reader.getRecord(record);
    RETURN_IF_ERROR(CheckScriptSource(std::string_view(static_cast<const char*>(data.get()), bytes),
                                      path, record));
  }
  return Status::Ok();
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

Status CheckPlaceableTensors(const std::string& path, const Component& component) {
  const std::vector<torch::Tensor> tensors = component.Tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const torch::Tensor& t = tensors[i];
    if (t.layout() != c10::kStrided || !t.device().is_cpu() || !IsPlaceableDtype(t.scalar_type())) {
      return InvalidArgument(StrCat(path, ": tensor '", component.slot_name(i), "' is a ",
                                    t.layout(), " ", t.scalar_type(), " tensor on ", t.device(),
                                    "; qpool places strided tensors of floating-point, complex, "
                                    "integer or boolean dtypes"));
    }
    if (!WithinStorage(t)) {
      return InvalidArgument(StrCat(path, ": tensor '", component.slot_name(i), "' of sizes ",
                                    t.sizes(), ", strides ", t.strides(), " and offset ",
                                    t.storage_offset(), " reaches beyond its storage of ",
                                    t.storage().nbytes(), " bytes"));
    }
  }
  return Status::Ok();
}

}  // namespace qpool
