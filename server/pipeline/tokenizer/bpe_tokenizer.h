// BpeTokenizer: the byte-level BPE tokenizers of LLM text encoders (Llama 3, Qwen2/2.5/3), read
// from the tokenizer.json that Hugging Face's tokenizers library writes; torch-free.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "util/status.h"

namespace qpool {

// Note [Byte-level BPE from tokenizer.json]
// What transformers' PreTrainedTokenizerFast does with a prompt, for the tokenizer.json shapes
// that LLM text encoders ship:
//   1. added tokens (special or not) are split out of the text first, by leftmost-longest
//      literal match, their lstrip/rstrip taking the whitespace beside them;
//   2. the rest is cut by the pre-tokenizer: a Split on its regex (behavior Isolated: matches and
//      the gaps between them are pieces), run by PCRE2 with Unicode properties and Unicode \s,
//      then ByteLevel without a regex; or a ByteLevel with GPT-2's regex;
//   3. each piece's bytes become GPT-2's printable characters, and BPE merges them by rank
//      (lowest first, the leftmost of equal pairs first); with ignore_merges (Llama 3) a piece
//      that is a whole vocabulary entry is that entry;
//   4. a TemplateProcessing post-processor adds its special tokens (Llama 3's
//      <|begin_of_text|>); a ByteLevel one adds nothing.
// Qwen's normalizer, NFC, composes the text between added tokens (utf8proc) before step 2; added
// tokens are matched in the text as given (tokenizers matches those marked normalized in the
// composed text: the same for every added token that composition leaves alone, as ASCII ones).
// Anything else a tokenizer.json may say (other normalizers, other split behaviors,
// add_prefix_space, byte_fallback, a continuing-subword prefix, dropout) is refused at load,
// naming the field: loading it anyway would give other ids than transformers, and the encoder
// wrong embeddings.
class BpeTokenizer {
 public:
  // The largest tokenizer.json read (Qwen's and Llama 3's are 7 and 9 MB).
  static constexpr int64_t kMaxFileBytes = int64_t{64} << 20;

  // Reads a tokenizer.json; NOT_FOUND for a missing file, INVALID_ARGUMENT naming the file and
  // the field for contents it cannot follow (Note [Byte-level BPE from tokenizer.json]).
  static StatusOr<std::unique_ptr<BpeTokenizer>> Load(const std::string& path);
  // The same from the file's text, named `name` in errors.
  static StatusOr<std::unique_ptr<BpeTokenizer>> Parse(const std::string& json,
                                                       const std::string& name);
  ~BpeTokenizer();
  BpeTokenizer(const BpeTokenizer&) = delete;
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;

  // The ids of `text`; with `add_special_tokens`, the post-processor's template around them
  // (transformers' default). Never fails: invalid UTF-8 is read as U+FFFD.
  std::vector<int64_t> Encode(const std::string& text, bool add_special_tokens = true) const;
  // Encode truncated on the right so that, with the template's tokens, at most `max_length`
  // ids remain, then padded with `pad_id` to `max_length` when `pad`; `mask` (when given) is 1
  // for every id that is not padding. transformers' padding="max_length", truncation=True.
  std::vector<int64_t> EncodePadded(const std::string& text, int max_length, int64_t pad_id,
                                    std::vector<int64_t>* mask = nullptr,
                                    bool add_special_tokens = true) const;

  // The id of a vocabulary entry or added token, or -1.
  int64_t TokenId(const std::string& token) const;
  // Vocabulary entries and added tokens: one more than the largest id.
  size_t vocab_size() const { return vocab_size_; }

 private:
  struct AddedToken {
    std::string content;
    int64_t id;
    bool lstrip;
    bool rstrip;
  };
  struct Regex;  // a compiled PCRE2 pattern

  BpeTokenizer();
  // Parse, which turns what the JSON library throws into INVALID_ARGUMENT.
  static StatusOr<std::unique_ptr<BpeTokenizer>> ParseJson(const std::string& json,
                                                           const std::string& name);
  // Appends the ids of text that holds no added token.
  void EncodePlain(const std::string& text, std::vector<int64_t>* out) const;
  // Appends the ids of one pre-token.
  void EncodePiece(const std::string& piece, std::vector<int64_t>* out) const;

  std::unordered_map<std::string, int64_t> vocab_;  // byte-mapped token -> id
  // Merges: (left id, right id) packed in 64 bits -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<int32_t, int64_t>> merges_;
  std::vector<AddedToken> added_;  // longest first
  std::unique_ptr<Regex> split_;   // the pre-tokenizer's regex
  bool ignore_merges_ = false;
  bool nfc_ = false;  // Qwen's normalizer: the text between added tokens composed (NFC) first
  std::vector<int64_t> prefix_;  // the template's ids before the text
  std::vector<int64_t> suffix_;  // and after it
  size_t vocab_size_ = 0;
};

}  // namespace qpool
