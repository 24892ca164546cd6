// ClipTokenizer: the byte-level BPE tokenizer of CLIP text encoders (SD 1.x / 2.x / SDXL),
// torch-free.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "util/status.h"

namespace qpool {

// Turns prompts into CLIP token ids and back, as OpenAI CLIP's SimpleTokenizer does
// (Note [CLIP tokenization] in clip_tokenizer.cpp lists where we knowingly differ).
// Thread-safety: a loaded tokenizer is immutable apart from its BPE cache, which has its own
// mutex; Encode/EncodePadded/Decode may be called from any number of threads at once.
class ClipTokenizer {
 public:
  // Reads the standard CLIP vocab.json (token -> id) and merges.txt ("#version" header line
  // optional). Needs <|startoftext|>, <|endoftext|> and `pad_token` in the vocab and
  // max_length >= 2. Errors (NOT_FOUND for a missing file, INVALID_ARGUMENT for bad contents)
  // name the file.
  static StatusOr<ClipTokenizer> Load(const std::string& vocab_path, const std::string& merges_path,
                                      int max_length = 77,
                                      const std::string& pad_token = "<|endoftext|>");

  ClipTokenizer(ClipTokenizer&&) noexcept;
  ClipTokenizer& operator=(ClipTokenizer&&) noexcept;
  ~ClipTokenizer();

  // Token ids of `text`: no BOS/EOS, no truncation. Never fails; invalid UTF-8 becomes U+FFFD.
  std::vector<int64_t> Encode(const std::string& text) const;
  // BOS + Encode(text) truncated to max_length-2 + EOS, padded with pad_id to max_length.
  std::vector<int64_t> EncodePadded(const std::string& text) const;
  // Inverse of Encode: drops special and unknown ids, each "</w>" word end becomes a space,
  // the result is trimmed. Yields the normalized, pre-tokenized text ("hi , you").
  std::string Decode(const std::vector<int64_t>& ids) const;

  int64_t bos_id() const { return bos_id_; }  // <|startoftext|>
  int64_t eos_id() const { return eos_id_; }  // <|endoftext|>
  // What EncodePadded pads with: <|endoftext|> for SD 1.x's CLIP, "!" for SD 2.x's OpenCLIP.
  // A pad token other than <|endoftext|> is a special token in prompts too.
  int64_t pad_id() const { return pad_id_; }
  int max_length() const { return max_length_; }         // length of EncodePadded's output
  size_t vocab_size() const { return encoder_.size(); }  // entries of vocab.json

 private:
  ClipTokenizer() = default;

  // Appends the ids of one pre-token (already lowercased UTF-8) to `out`.
  void EncodeWord(const std::string& word, std::vector<int64_t>* out) const;
  // BPE of a byte-mapped word: the final symbols, the last one ending in "</w>".
  std::vector<std::string> Bpe(const std::vector<std::string>& symbols) const;
  // Rank of merging (a, b), or -1 when the pair is not a merge.
  int MergeRank(const std::string& a, const std::string& b) const;

  std::unordered_map<std::string, int64_t> encoder_;  // vocab.json
  std::unordered_map<int64_t, std::string> decoder_;  // its inverse
  std::unordered_map<std::string, int> merge_ranks_;  // "a b" -> line order
  int64_t bos_id_ = 0;
  int64_t eos_id_ = 0;
  int64_t pad_id_ = 0;
  // The pad token when it is not <|endoftext|>: a special token in prompts too (Note [Pad token
  // in prompts] in clip_tokenizer.cpp).
  std::u32string pad_special_;
  int max_length_ = 77;

  // Note [BPE cache]: word -> ids, bounded; guarded by its own mutex so Encode stays const.
  struct Cache {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int64_t>> entries;
  };
  std::unique_ptr<Cache> cache_;
};

}  // namespace qpool
