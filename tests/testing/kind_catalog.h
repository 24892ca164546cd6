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
            {{"tokenizer_2", TokenizerFormat::kSentencePiece}}}},
          {"hidream",
           {{"text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4", "transformer",
             "vae_decoder"},
            {"tokenizer_2", "tokenizer_3", "tokenizer_4", "conditioning"},
            ScheduleFamily::kFlowMatch,
            {{"tokenizer_3", TokenizerFormat::kSentencePiece},
             {"tokenizer_4", TokenizerFormat::kTokenizerJson}}}}};
}

}  // namespace qpool::testing
