// SentencePieceTokenizer: T5's tokenizer (FLUX's tokenizer_2), a SentencePiece model read with
// the packaged sentencepiece library (through libqpool_sentencepiece); torch-free.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "util/status.h"

struct qpool_spm;

namespace qpool {

// Note [T5 tokenization]
// As transformers' T5TokenizerFast called the way FluxPipeline calls it (padding to max_length,
// truncation): the model's pieces of the prompt (SentencePiece normalizes it: NFKC, runs of
// spaces collapsed, a leading "▁" added), truncated to max_length - 1, then </s>, then <pad> up
// to max_length. T5TokenizerFast's added tokens written in the prompt are single ids, matched in
// the raw text before SentencePiece sees it, with the text between them encoded piece by piece on
// its own (each part as a prompt of its own: a leading "▁", surrounding spaces dropped): </s>
// (eos), <pad>, <unk> and the sentinels <extra_id_0>..<extra_id_99>, whose ids follow the model's
// pieces in reverse (<extra_id_N> is pieces + 99 - N, 32099 - N for T5's 32000 pieces; T5's
// default of 100 sentinels, which FLUX's tokenizer_2 keeps). Invalid UTF-8 is replaced by U+FFFD
// before encoding.
//
// Thread-safety: immutable once loaded; EncodePadded may be called from any number of threads.
class SentencePieceTokenizer {
 public:
  // Reads a SentencePiece model file (spiece.model). It must define </s> (its eos) and a pad
  // piece (its pad id, else "<pad>"); max_length >= 2. NOT_FOUND for a missing file,
  // INVALID_ARGUMENT for one the library cannot read; both name the file. FAILED_PRECONDITION
  // when libqpool_sentencepiece cannot be loaded (an installation without it).
  static StatusOr<SentencePieceTokenizer> Load(const std::string& model_path, int max_length);

  // The ids of `text`'s pieces and added tokens, no final </s>, no truncation. Never fails.
  std::vector<int64_t> Encode(const std::string& text) const;
  // Encode(text) truncated to max_length - 1, </s>, padded with pad_id to max_length; `mask`
  // (when given) is 1 for every id that is not padding (T5TokenizerFast's attention_mask).
  std::vector<int64_t> EncodePadded(const std::string& text,
                                    std::vector<int64_t>* mask = nullptr) const;

  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }
  int max_length() const { return max_length_; }
  size_t vocab_size() const { return vocab_size_; }

 private:
  SentencePieceTokenizer() = default;
  // Appends the ids of `text`'s pieces (no added tokens) to `ids`.
  void EncodePieces(const std::string& text, std::vector<int64_t>* ids) const;
  // The id of the added token that starts at text[pos] and its length in bytes, or -1.
  int64_t AddedTokenAt(const std::string& text, size_t pos, size_t* length) const;

  std::shared_ptr<qpool_spm> model_;  // freed through the shim
  size_t vocab_size_ = 0;
  int64_t eos_id_ = 1;
  int64_t pad_id_ = 0;
  int64_t unk_id_ = -1;  // -1: the model has none
  int max_length_ = 512;
};

}  // namespace qpool
