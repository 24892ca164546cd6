#include "pipeline/pipeline_kind.h"

#include "util/log.h"

namespace qpool {

ComponentDecl VaeDecoderDecl() {
  ComponentDecl decl{"vae_decoder", ComponentRole::kDecoder, {"latents"}};
  decl.channels_last = true;
  // An export whose decoder norms through ATen's operations would copy every channels-last
  // activation back to NCHW at each norm (Note [Channels-last convolutions]).
  decl.channels_last_needs = "qpool::group_norm";
  return decl;
}

StatusOr<GenerateParams> PipelineKind::ResolveGenerate(const GenerateRequestIn& in,
                                                       const PipelineManifest& manifest) const {
  return ResolveGenerateRequest(in, manifest);
}

Status PipelineKind::CheckDefaults(const PipelineManifest& manifest) const {
  GenerateRequestIn defaults;
  defaults.seed = 0;  // no random draw
  const StatusOr<GenerateParams> resolved = ResolveGenerate(defaults, manifest);
  if (resolved.ok()) return Status::Ok();
  return InvalidArgument(StrCat(manifest.path, ": the defaults make no valid request for kind '",
                                manifest.kind, "': ", resolved.status().message()));
}

Status PipelineKind::ValidateEncode(const std::vector<std::string>& prompts,
                                    const PipelineManifest& manifest) const {
  return ValidateEncodePrompts(prompts, manifest);
}

const std::vector<std::string>& PipelineKind::manifest_sections() const {
  static const std::vector<std::string> kNone;
  return kNone;
}

KindManifestSpec PipelineKind::ManifestSpec() const {
  return {ComponentNames(), manifest_sections(), schedule(), tokenizer_formats()};
}

std::vector<std::string> PipelineKind::ComponentNames() const {
  std::vector<std::string> names;
  for (const auto& c : components()) names.push_back(c.name);
  return names;
}

}  // namespace qpool
