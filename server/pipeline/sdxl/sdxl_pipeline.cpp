#include "pipeline/sdxl/sdxl_pipeline.h"

namespace qpool {
namespace {

StatusOr<ClipTokenizer> LoadTokenizer(const TokenizerSpec& spec) {
  return ClipTokenizer::Load(spec.vocab, spec.merges, spec.max_length, spec.pad_token);
}

}  // namespace

SdxlPipeline::SdxlPipeline(const PipelineKind& kind, PipelineManifest manifest,
                           ClipTokenizer tokenizer, ClipTokenizer tokenizer_2,
                           c10::ScalarType dtype)
    : SdPipeline(kind, std::move(manifest), std::move(tokenizer), dtype),
      tokenizer_2_(std::move(tokenizer_2)) {}

StatusOr<std::unique_ptr<SdxlPipeline>> SdxlPipeline::Load(const PipelineKind& kind,
                                                           const PipelineManifest& manifest,
                                                           const c10::Device& device,
                                                           c10::ScalarType dtype,
                                                           const ResidencyContext& residency) {
  if (!manifest.tokenizer_2.has_value()) {  // the parser requires it for this kind
    return InvalidArgument(StrCat(manifest.path, ": field 'tokenizer_2' is required"));
  }
  ASSIGN_OR_RETURN(ClipTokenizer tokenizer, LoadTokenizer(manifest.tokenizer));
  ASSIGN_OR_RETURN(ClipTokenizer tokenizer_2, LoadTokenizer(*manifest.tokenizer_2));
  if (tokenizer_2.max_length() != tokenizer.max_length()) {
    return InvalidArgument(StrCat(manifest.path, ": field 'tokenizer_2.max_length' must equal ",
                                  "tokenizer.max_length (", tokenizer.max_length(), "; got ",
                                  tokenizer_2.max_length(), "): the contexts are concatenated"));
  }
  std::unique_ptr<SdxlPipeline> pipeline(
      new SdxlPipeline(kind, manifest, std::move(tokenizer), std::move(tokenizer_2), dtype));
  RETURN_IF_ERROR(pipeline->LoadComponents(device, residency));
  pipeline->UseForwardGraphs("unet");
  return pipeline;
}

StatusOr<std::vector<Conditioning>> SdxlPipeline::EncodeTexts(
    const std::vector<std::vector<std::string>>& groups, Component* next) {
  Component& encoder_2 = component("text_encoder_2");
  ASSIGN_OR_RETURN(auto first,
                   RunTextEncoder(component("text_encoder"), tokenizer(), groups, 1, &encoder_2));
  ASSIGN_OR_RETURN(auto second, RunTextEncoder(encoder_2, tokenizer_2_, groups, 2, next));
  std::vector<Conditioning> out;
  for (size_t i = 0; i < groups.size(); ++i) {
    const int64_t rows = static_cast<int64_t>(groups[i].size());
    torch::Tensor pooled = second[i][1];
    if (pooled.dim() != 2 || pooled.size(0) != rows) {
      return Internal(StrCat("text_encoder_2 returned pooled embeddings of shape ", pooled.sizes(),
                             ", expected [", rows, ", dim]"));
    }
    torch::Tensor context = torch::cat({first[i][0].to(dtype()), second[i][0].to(dtype())}, -1);
    out.push_back({std::move(context), pooled.to(dtype())});
  }
  return out;
}

std::vector<torch::Tensor> SdxlPipeline::RequestInputs(const GenerateParams& params) const {
  const SizeConditioning& s = params.size;
  return {
      torch::tensor({static_cast<float>(s.original_height), static_cast<float>(s.original_width),
                     static_cast<float>(s.crop_top), static_cast<float>(s.crop_left),
                     static_cast<float>(s.target_height), static_cast<float>(s.target_width)})
          .unsqueeze(0)};
}

}  // namespace qpool
