// fuzz_clip_tokenizer: arbitrary bytes as a prompt through the CLIP BPE tokenizer (Encode,
// EncodePadded, Decode) and the UTF-8 helpers it uses, with the tiny test pipeline's vocabulary
// (fixtures/clip: 1514 tokens, 1000 merges), padded with <|endoftext|> (SD 1.x) and with "!"
// (SD 2.x, Note [Pad token in prompts]). Prompts longer than kMaxPromptBytes never reach the
// tokenizer (every RPC refuses them first), so they are skipped.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "pipeline/generate_request.h"
#include "pipeline/tokenizer/clip_tokenizer.h"
#include "pipeline/tokenizer/utf8.h"

namespace qpool::fuzz {
namespace {

ClipTokenizer LoadFixture(const std::string& pad_token) {
  const std::string dir = QPOOL_FUZZ_FIXTURES "/clip/";
  StatusOr<ClipTokenizer> tokenizer =
      ClipTokenizer::Load(dir + "vocab.json", dir + "merges.txt", 77, pad_token);
  FUZZ_CHECK(tokenizer.ok(), tokenizer.status().ToString());
  return std::move(tokenizer).value();
}

// Valid UTF-8 is what SanitizeUtf8 leaves unchanged.
bool IsValidUtf8(const std::string& s) { return SanitizeUtf8(s) == s; }

void CheckTokenizer(const ClipTokenizer& tok, const std::string& prompt) {
  const std::vector<int64_t> ids = tok.Encode(prompt);
  // The fixture's ids are dense: 0 .. vocab_size - 1.
  for (int64_t id : ids) {
    FUZZ_CHECK(id >= 0 && static_cast<size_t>(id) < tok.vocab_size(), "id out of the vocab");
  }

  const std::vector<int64_t> padded = tok.EncodePadded(prompt);
  FUZZ_CHECK(padded.size() == static_cast<size_t>(tok.max_length()), "padded length");
  FUZZ_CHECK(padded.front() == tok.bos_id(), "padded starts with BOS");
  const size_t kept = std::min(ids.size(), static_cast<size_t>(tok.max_length() - 2));
  for (size_t i = 0; i < kept; ++i) FUZZ_CHECK(padded[i + 1] == ids[i], "padded keeps the ids");
  FUZZ_CHECK(padded[kept + 1] == tok.eos_id(), "EOS after the kept ids");
  for (size_t i = kept + 2; i < padded.size(); ++i) {
    FUZZ_CHECK(padded[i] == tok.pad_id(), "padding");
  }

  const std::string text = tok.Decode(ids);
  FUZZ_CHECK(IsValidUtf8(text), "Decode returned invalid UTF-8");
  FUZZ_CHECK(text.empty() || (text.front() != ' ' && text.back() != ' '), "Decode is trimmed");
}

}  // namespace

}  // namespace qpool::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qpool;
  if (size > kMaxPromptBytes) return 0;
  static const ClipTokenizer sd1 = fuzz::LoadFixture("<|endoftext|>");
  static const ClipTokenizer sd2 = fuzz::LoadFixture("!");

  const std::string prompt(reinterpret_cast<const char*>(data), size);
  // The UTF-8 helpers: one replacement per bad byte, idempotent, never longer in code points.
  const std::u32string points = DecodeUtf8(prompt);
  FUZZ_CHECK(points.size() <= prompt.size(), "more code points than bytes");
  for (char32_t cp : points) {
    FUZZ_CHECK(cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF), "invalid code point decoded");
  }
  const std::string clean = EncodeUtf8(points);
  FUZZ_CHECK(clean == SanitizeUtf8(prompt), "SanitizeUtf8");
  FUZZ_CHECK(SanitizeUtf8(clean) == clean, "SanitizeUtf8 is not idempotent");

  fuzz::CheckTokenizer(sd1, prompt);
  fuzz::CheckTokenizer(sd2, prompt);
  return 0;
}
