// The kind catalog of the kinds qpool ships, for torch-free tests of the manifest parser and the
// model repository (the server takes it from PipelineKinds::Catalog; a test checks they agree).
#pragma once

#include "config/manifest.h"

namespace qpool::testing {

inline KindCatalog BuiltinKindCatalog() {
  return {{"sd", {{"text_encoder", "unet", "vae_decoder"}, {}}},
          {"sdxl",
           {{"text_encoder", "text_encoder_2", "unet", "vae_decoder"},
            {"tokenizer_2", "conditioning"}}},
          {"flux",
           {{"text_encoder", "text_encoder_2", "transformer", "vae_decoder"},
            {"tokenizer_2"},
            ScheduleFamily::kFlowMatch,
            TokenizerFormat::kSentencePiece}}};
}

}  // namespace qpool::testing
