// A component's tensors in a safetensors file beside its graph: the file's index, read and
// checked, and the tensors bound into the component's slots.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "util/status.h"

namespace qpool {

class Component;
class ModelFile;

// Note [Weights beside the graph]
// An imported component is two files: its TorchScript graph (`unet.pt`), in which every tensor
// is a placeholder of the right dtype and sizes whose storage holds a single element (strides of
// zero), and its tensors in a safetensors file (`unet.safetensors`, manifest field
// `components.<name>.weights`) under the slot names of the graph's tensor table. The graph stays
// small (kilobytes to a few MB) whatever the model's size; the importer writes the tensors one
// at a time as it converts them (a safetensors header is known before any tensor is), and the
// server reads each one straight into its own tensor through the file's descriptor (Note [One
// descriptor per file]). The file is checked whole before anything is read: its header within
// kMaxWeightsHeaderBytes and valid JSON, each entry a known dtype with sizes whose bytes are its
// range, the ranges covering the data without holes or overlaps up to the file's end (as the
// safetensors format requires), and its entries exactly the graph's slots, dtype and sizes
// equal; a file that fails any of these names the file and the tensor and binds nothing. Tied
// tensors (T5's token embedding, held by two modules) are stored once: the header's metadata
// entry kTiedMetadataKey maps each other slot to the stored name, a JSON object in a string (the
// format's metadata values are strings), and both slots get the one tensor. A graph
// whose placeholders are left unbound (a manifest without `weights`) is refused, so that nothing
// runs on them. Graphs that hold their tensors (folders imported before the split) load as
// before.
inline constexpr uint64_t kMaxWeightsHeaderBytes = uint64_t{100} << 20;  // safetensors' own limit
inline constexpr const char* kTiedMetadataKey = "qpool.tied";

// One tensor of a weights file: its name, dtype, sizes and byte range (from the data's start).
struct WeightsEntry {
  std::string name;
  c10::ScalarType dtype = c10::kFloat;
  std::vector<int64_t> sizes;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// The index of a weights file (Note [Weights beside the graph]).
struct WeightsIndex {
  uint64_t data_offset = 0;           // where the data starts in the file (8 + the header's length)
  std::vector<WeightsEntry> entries;  // in the order of their ranges
  // Slot -> the stored tensor it shares (kTiedMetadataKey).
  std::vector<std::pair<std::string, std::string>> tied;
};

// Reads and checks the header of the safetensors file `file`; InvalidArgument naming the file
// and the entry or field that is wrong.
StatusOr<WeightsIndex> ReadWeightsIndex(const ModelFile& file);

// Reads every tensor of `component` from `file` into a tensor of its own and binds it into the
// slot of the same name. InvalidArgument naming the file when its index is wrong or does not
// match the slots (a tensor missing, one the graph has no slot for, another dtype or sizes);
// then nothing is bound.
Status BindWeights(Component& component, const ModelFile& file);

// InvalidArgument naming `path` when a slot of `component` spans more bytes than its storage
// holds: the placeholders of a graph whose weights file was not bound.
Status CheckHoldsData(const std::string& path, const Component& component);

}  // namespace qpool
