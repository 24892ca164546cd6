#include "component/weights_file.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>
#include <utility>

#include "component/component.h"
#include "util/log.h"
#include "util/model_file.h"

namespace qpool {
namespace {

using Json = nlohmann::json;

// Far more tensors than any component has (a 20B transformer: a few thousand).
constexpr size_t kMaxEntries = size_t{1} << 20;
constexpr size_t kMaxDims = 8;

std::optional<c10::ScalarType> DtypeOf(const std::string& name) {
  static const std::unordered_map<std::string, c10::ScalarType> kDtypes = {
      {"F64", c10::kDouble},
      {"F32", c10::kFloat},
      {"F16", c10::kHalf},
      {"BF16", c10::kBFloat16},
      {"I64", c10::kLong},
      {"I32", c10::kInt},
      {"I16", c10::kShort},
      {"I8", c10::kChar},
      {"U8", c10::kByte},
      {"BOOL", c10::kBool},
      {"F8_E4M3", c10::kFloat8_e4m3fn},
      {"F8_E5M2", c10::kFloat8_e5m2}};
  const auto it = kDtypes.find(name);
  if (it == kDtypes.end()) return std::nullopt;
  return it->second;
}

std::string SizesText(const std::vector<int64_t>& sizes) {
  std::string text = "[";
  for (size_t i = 0; i < sizes.size(); ++i) text += (i ? ", " : "") + std::to_string(sizes[i]);
  return text + "]";
}

// Reads exactly `n` bytes at `offset`.
Status ReadFully(const ModelFile& file, uint64_t offset, void* buffer, size_t n) {
  auto* out = static_cast<char*>(buffer);
  while (n > 0) {
    ASSIGN_OR_RETURN(size_t got, file.ReadAt(offset, out, n));
    if (got == 0) {
      return InvalidArgument(StrCat(file.path(), ": ends at byte ", offset,
                                    " inside the tensors its header describes"));
    }
    out += got;
    offset += got;
    n -= got;
  }
  return Status::Ok();
}

Status ParseEntry(const std::string& path, const std::string& name, const Json& value,
                  WeightsEntry* entry) {
  const auto bad = [&](const std::string& why) {
    return InvalidArgument(StrCat(path, ": tensor '", name, "' ", why));
  };
  if (!value.is_object()) return bad("is not an object of dtype, shape and data_offsets");
  for (const auto& [key, unused] : value.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return bad(StrCat("has an unknown field '", key, "'"));
    }
  }
  const auto dtype = value.find("dtype");
  const auto shape = value.find("shape");
  const auto offsets = value.find("data_offsets");
  if (dtype == value.end() || !dtype->is_string()) return bad("has no dtype string");
  const std::optional<c10::ScalarType> type = DtypeOf(dtype->get<std::string>());
  if (!type)
    return bad(StrCat("has dtype '", dtype->get<std::string>(),
                      "', which qpool places"
                      " no tensor of"));
  if (shape == value.end() || !shape->is_array() || shape->size() > kMaxDims) {
    return bad(StrCat("has no shape of at most ", kMaxDims, " sizes"));
  }
  if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return bad("has no data_offsets [begin, end]");
  }
  entry->name = name;
  entry->dtype = *type;
  // Bytes of the sizes, each multiplication checked (a size of 2^62 must not wrap to a small
  // range).
  uint64_t bytes = c10::elementSize(*type);
  for (const Json& size : *shape) {
    if (!size.is_number_unsigned()) return bad("has a shape entry that is not a size");
    const uint64_t s = size.get<uint64_t>();
    if (s > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        (s != 0 && bytes > std::numeric_limits<uint64_t>::max() / s)) {
      return bad(StrCat("has sizes ", shape->dump(), " of more bytes than a file holds"));
    }
    bytes *= s;
    entry->sizes.push_back(static_cast<int64_t>(s));
  }
  entry->begin = (*offsets)[0].get<uint64_t>();
  entry->end = (*offsets)[1].get<uint64_t>();
  if (entry->end < entry->begin || entry->end - entry->begin != bytes) {
    return bad(StrCat("has data_offsets [", entry->begin, ", ", entry->end, "], not the ", bytes,
                      " bytes of its dtype and sizes ", SizesText(entry->sizes)));
  }
  return Status::Ok();
}

// The tied slots of the metadata's kTiedMetadataKey entry: a JSON object of names in a string.
Status ParseTied(const std::string& path, const Json& metadata,
                 std::vector<std::pair<std::string, std::string>>* tied) {
  if (!metadata.is_object()) {
    return InvalidArgument(StrCat(path, ": its header's __metadata__ is not an object"));
  }
  const auto entry = metadata.find(kTiedMetadataKey);
  if (entry == metadata.end()) return Status::Ok();
  const Json names =
      entry->is_string() ? Json::parse(entry->get<std::string>(), nullptr, false) : Json();
  if (!names.is_object()) {
    return InvalidArgument(StrCat(path, ": its metadata '", kTiedMetadataKey,
                                  "' is not a JSON object of names in a string"));
  }
  for (const auto& [slot, stored] : names.items()) {
    if (!stored.is_string()) {
      return InvalidArgument(StrCat(path, ": its metadata '", kTiedMetadataKey, "' ties '", slot,
                                    "' to something that is not a tensor's name"));
    }
    tied->emplace_back(slot, stored.get<std::string>());
  }
  return Status::Ok();
}

}  // namespace

StatusOr<WeightsIndex> ReadWeightsIndex(const ModelFile& file) {
  const std::string& path = file.path();
  const uint64_t size = static_cast<uint64_t>(file.size());
  unsigned char prefix[8] = {};
  if (size < sizeof(prefix)) {
    return InvalidArgument(StrCat(path, ": ", size, " bytes are too few for a safetensors file"));
  }
  RETURN_IF_ERROR(ReadFully(file, 0, prefix, sizeof(prefix)));
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | prefix[i];  // little-endian
  if (header_bytes > kMaxWeightsHeaderBytes || header_bytes > size - sizeof(prefix)) {
    return InvalidArgument(StrCat(path, ": its safetensors header says it is ", header_bytes,
                                  " bytes long; the file has ", size - sizeof(prefix),
                                  " after the length and qpool reads at most ",
                                  kMaxWeightsHeaderBytes, ": not a safetensors file, or cut"));
  }
  std::string text(header_bytes, '\0');
  RETURN_IF_ERROR(ReadFully(file, sizeof(prefix), text.data(), text.size()));
  const Json header = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) {
    return InvalidArgument(StrCat(path, ": its safetensors header is not a JSON object"));
  }
  if (header.size() > kMaxEntries) {
    return InvalidArgument(StrCat(path, ": its header lists ", header.size(),
                                  " tensors; qpool reads at most ", kMaxEntries));
  }
  WeightsIndex index;
  index.data_offset = sizeof(prefix) + header_bytes;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      RETURN_IF_ERROR(ParseTied(path, value, &index.tied));
      continue;
    }
    WeightsEntry entry;
    RETURN_IF_ERROR(ParseEntry(path, name, value, &entry));
    index.entries.push_back(std::move(entry));
  }
  std::sort(index.entries.begin(), index.entries.end(),
            [](const WeightsEntry& a, const WeightsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  // The ranges tile the data (the format allows no holes, so no bytes hide in the file).
  uint64_t at = 0;
  for (const WeightsEntry& e : index.entries) {
    if (e.begin != at) {
      return InvalidArgument(StrCat(path, ": tensor '", e.name, "' starts at byte ", e.begin,
                                    " of the data, where ", at,
                                    e.begin < at ? " overlaps the tensor before it"
                                                 : " leaves a hole after the tensor before it"));
    }
    at = e.end;
  }
  if (at != size - index.data_offset) {
    return InvalidArgument(StrCat(path, ": its tensors take ", at,
                                  " bytes after the header, the "
                                  "file has ",
                                  size - index.data_offset,
                                  at > size - index.data_offset
                                      ? ": the file is cut short"
                                      : ": bytes follow the last tensor"));
  }
  return index;
}

Status BindWeights(Component& component, const ModelFile& file) {
  const std::string& path = file.path();
  ASSIGN_OR_RETURN(WeightsIndex index, ReadWeightsIndex(file));
  std::unordered_map<std::string, size_t> by_name;
  for (size_t i = 0; i < index.entries.size(); ++i) by_name.emplace(index.entries[i].name, i);
  std::unordered_map<std::string, size_t> tied;  // slot name -> the entry it shares
  for (const auto& [slot, stored] : index.tied) {
    const auto it = by_name.find(stored);
    if (it == by_name.end() || by_name.count(slot) != 0) {
      return InvalidArgument(StrCat(
          path, ": ties '", slot, "' to '", stored, "', ",
          it == by_name.end() ? "which it does not hold" : "and holds a tensor of that name"));
    }
    tied.emplace(slot, it->second);
  }
  // Every check before the first read: a file that does not fit binds nothing.
  const std::vector<torch::Tensor> slots = component.Tensors();
  std::vector<size_t> entry_of(slots.size());
  std::vector<bool> used(index.entries.size(), false);
  for (size_t i = 0; i < slots.size(); ++i) {
    const std::string& name = component.slot_name(i);
    const auto stored = by_name.find(name);
    const auto shared = tied.find(name);
    if (stored == by_name.end() && shared == tied.end()) {
      return InvalidArgument(StrCat(path, ": holds no tensor '", name, "' of component '",
                                    component.name(),
                                    "'; the graph and its weights file are "
                                    "from different imports: import the pipeline again"));
    }
    const size_t j = stored != by_name.end() ? stored->second : shared->second;
    const WeightsEntry& e = index.entries[j];
    const torch::Tensor& slot = slots[i];
    if (e.dtype != slot.scalar_type() || c10::IntArrayRef(e.sizes) != slot.sizes()) {
      return InvalidArgument(StrCat(path, ": tensor '", name, "' is ", e.dtype, " of sizes ",
                                    SizesText(e.sizes), "; component '", component.name(), "' has ",
                                    slot.scalar_type(), " of sizes ", slot.sizes(),
                                    " there: import the pipeline again"));
    }
    entry_of[i] = j;
    used[j] = true;
  }
  for (size_t j = 0; j < index.entries.size(); ++j) {
    if (!used[j]) {
      return InvalidArgument(StrCat(path, ": holds tensor '", index.entries[j].name,
                                    "', which component '", component.name(), "' has no slot for"));
    }
  }
  // Each stored tensor read once; tied slots share it.
  std::vector<torch::Tensor> read(index.entries.size());
  std::vector<torch::Tensor> loaded;
  loaded.reserve(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    const WeightsEntry& e = index.entries[entry_of[i]];
    torch::Tensor& t = read[entry_of[i]];
    if (!t.defined()) {
      t = torch::empty(e.sizes, torch::TensorOptions().dtype(e.dtype));
      RETURN_IF_ERROR(ReadFully(file, index.data_offset + e.begin, t.data_ptr(), e.end - e.begin));
    }
    loaded.push_back(t);
  }
  for (size_t i = 0; i < loaded.size(); ++i) component.RebindOne(i, loaded[i]);
  return Status::Ok();
}

Status CheckHoldsData(const std::string& path, const Component& component) {
  const std::vector<torch::Tensor> tensors = component.Tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const torch::Tensor& t = tensors[i];
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    if (t.numel() > 1 && t.storage().nbytes() < bytes) {
      return InvalidArgument(
          StrCat(path, ": tensor '", component.slot_name(i), "' of sizes ", t.sizes(),
                 " is a "
                 "placeholder (",
                 t.storage().nbytes(), " bytes for ", bytes,
                 "): this graph keeps its "
                 "tensors in a weights file beside it, which the manifest must name in components.",
                 component.name(), ".weights (docs/model-repository.md)"));
    }
  }
  return Status::Ok();
}

}  // namespace qpool
