// The request mix of `qpool bench`: request templates with weights, from a YAML or JSON file
// (--mix) or from the command's flags. A mix file is a list of entries such as
//
//   - name: small          # label in the reports (default: the pipeline)
//     weight: 3            # relative share of the requests (default 1)
//     pipeline: sd15
//     prompts: ["a red fox in the snow", "a lighthouse at dusk"]   # or prompt: TEXT
//     negative_prompt: blurry
//     steps: 20
//     width: 512
//     height: 512
//     guidance: 7.5
//     num_images: 2        # or batch: 2
//     seed: 42             # fixed seed (default: the server picks one)
//     scheduler: euler
//     deadline: 30         # seconds (default: --deadline)
//
// JSON is read by the same parser (YAML is a superset of it).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace qpool::cli {

// One kind of request. Unset fields take the pipeline's defaults on the server.
struct RequestTemplate {
  std::string name;  // unique within a mix
  double weight = 1;
  std::string pipeline;
  std::vector<std::string> prompts;            // request n of this template gets prompts[n % size]
  std::optional<std::string> negative_prompt;  // absent: none ("" is a given prompt)
  std::optional<uint32_t> steps;
  std::optional<uint32_t> width;
  std::optional<uint32_t> height;
  std::optional<double> guidance;
  std::optional<uint32_t> num_images;
  std::optional<uint64_t> seed;
  std::string scheduler;
  std::optional<double> deadline_seconds;
};

// The prompts of a template that names none.
const std::vector<std::string>& DefaultPrompts();

// Templates of a mix, or the error (never both): "FILE:LINE:COLUMN: what is wrong".
struct MixResult {
  std::vector<RequestTemplate> templates;
  std::string error;
};

// Parses the text of a mix file; `source` names it in errors.
MixResult ParseMix(const std::string& text, const std::string& source);
// Reads and parses the mix file at `path`.
MixResult LoadMix(const std::string& path);

// Draws template indices with probability proportional to their weights; the same seed gives
// the same sequence. Not thread-safe.
class MixPicker {
 public:
  MixPicker(const std::vector<RequestTemplate>& templates, uint64_t seed);
  size_t Next();

 private:
  std::mt19937_64 rng_;
  std::vector<double> cumulative_;  // running sum of the weights
};

}  // namespace qpool::cli
