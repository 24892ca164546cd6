// An exported component loaded as the server loads it: its graph with the weights file beside it
// bound (Note [Weights beside the graph] in component/weights_file.h).
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "component/component.h"
#include "component/weights_file.h"
#include "util/model_file.h"

namespace qpool::testing {

// Component::Load of the graph `path` ("…/unet.pt"), then BindWeights of "…/unet.safetensors"
// when that file exists.
inline StatusOr<std::unique_ptr<Component>> LoadExported(const std::string& name,
                                                         const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<Component> component, Component::Load(name, path));
  const std::string weights =
      std::filesystem::path(path).replace_extension(".safetensors").string();
  if (!std::filesystem::exists(weights)) return component;
  ASSIGN_OR_RETURN(std::unique_ptr<ModelFile> file, ModelFile::Open(weights));
  RETURN_IF_ERROR(BindWeights(*component, *file));
  return component;
}

}  // namespace qpool::testing
