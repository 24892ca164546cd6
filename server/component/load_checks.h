// The checks a component file passes before and after LibTorch reads it (Note [Load errors] in
// component.cpp), and LibTorch's reader on a ModelFile's descriptor.
#pragma once

#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/script.h>

#include <cstdint>
#include <string>

#include "util/status.h"

namespace qpool {

class Component;
class ModelFile;

// LibTorch's zip reader on a ModelFile's descriptor (Note [One descriptor per file] in
// util/model_file.h): every byte the load reads comes through it. A failed read throws c10::Error.
class ModelFileReader final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit ModelFileReader(const ModelFile& file);  // `file` outlives the reader
  size_t size() const override;
  size_t read(uint64_t pos, void* buf, size_t n, const char* what) const override;

 private:
  const ModelFile& file_;
};

// Before the load: the archive's TorchScript source (Note [Script source limits]), its pickles'
// lengths (Note [Pickle bounds]) and what its records inflate to. InvalidArgument naming the file
// and the record; c10::Error for what is not a zip.
Status CheckArchive(const ModelFile& file);

// After it: no graph of `module` holds a tensor constant (they stay on the export device).
Status CheckNoTensorConstants(const std::string& path, const torch::jit::Module& module);

// Every tensor of `component` is one qpool places: strided, on the CPU, of a dtype the
// residency copies, inside its storage.
Status CheckPlaceableTensors(const std::string& path, const Component& component);

}  // namespace qpool
