// fuzz_bpe_tokenizer: arbitrary bytes, split at the first NUL into a tokenizer.json and a prompt,
// through BpeTokenizer::Parse (Note [Byte-level BPE from tokenizer.json]) and, when it loads,
// Encode and EncodePadded. A refusal must be INVALID_ARGUMENT naming the file; every id encoded
// must be one of the tokenizer's, and a padded encoding exactly max_length long with its mask.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "pipeline/tokenizer/bpe_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qpool;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string json = input.substr(0, split);
  const std::string prompt = split == std::string::npos ? "a red fox" : input.substr(split + 1);
  const std::string name = "/models/hidream/tokenizer_4/tokenizer.json";
  auto tokenizer = BpeTokenizer::Parse(json, name);
  if (!tokenizer.ok()) {
    FUZZ_CHECK(tokenizer.status().code() == StatusCode::kInvalidArgument ||
                   tokenizer.status().code() == StatusCode::kInternal,
               tokenizer.status().ToString());
    FUZZ_CHECK(fuzz::StartsWith(tokenizer.status().message(), name) ||
                   tokenizer.status().code() == StatusCode::kInternal,
               "error does not name the file");
    return 0;
  }
  const auto& t = **tokenizer;
  for (const bool special : {true, false}) {
    for (int64_t id : t.Encode(prompt, special)) {
      FUZZ_CHECK(id >= 0 && static_cast<size_t>(id) < t.vocab_size(), "an id out of range");
    }
  }
  std::vector<int64_t> mask;
  const std::vector<int64_t> padded = t.EncodePadded(prompt, 16, 0, &mask);
  FUZZ_CHECK(padded.size() >= 16 && mask.size() == padded.size(), "padded length");
  return 0;
}
