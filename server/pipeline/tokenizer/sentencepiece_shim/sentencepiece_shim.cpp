// libqpool_sentencepiece: the packaged SentencePiece library behind a C interface, loaded by
// qpool with dlopen (Note [SentencePiece behind a shim] in ../sentencepiece_tokenizer.cpp).
#include "sentencepiece_shim.h"

#include <sentencepiece_processor.h>

#include <cstring>
#include <string>
#include <vector>

struct qpool_spm {
  sentencepiece::SentencePieceProcessor processor;
};

namespace {

void CopyError(const std::string& message, char* error, size_t size) {
  if (error == nullptr || size == 0) return;
  const size_t n = message.size() < size - 1 ? message.size() : size - 1;
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

// The id of `piece` if the model has it as that exact piece (PieceToId answers unk otherwise).
int ExactId(const sentencepiece::SentencePieceProcessor& p, const char* piece) {
  const int id = p.PieceToId(piece);
  return id >= 0 && id < p.GetPieceSize() && p.IdToPiece(id) == piece ? id : -1;
}

}  // namespace

extern "C" {

int qpool_spm_version(void) { return QPOOL_SPM_SHIM_VERSION; }

qpool_spm* qpool_spm_load(const char* path, char* error, size_t error_size) {
  auto* model = new qpool_spm;
  const sentencepiece::util::Status status = model->processor.Load(path);
  if (!status.ok()) {
    CopyError(status.error_message(), error, error_size);
    delete model;
    return nullptr;
  }
  return model;
}

void qpool_spm_free(qpool_spm* model) { delete model; }

void qpool_spm_info(const qpool_spm* model, qpool_spm_model_info* info) {
  const sentencepiece::SentencePieceProcessor& p = model->processor;
  info->pieces = p.GetPieceSize();
  info->unk_id = p.unk_id();
  info->eos_id = p.eos_id() >= 0 ? p.eos_id() : ExactId(p, "</s>");
  info->pad_id = p.pad_id() >= 0 ? p.pad_id() : ExactId(p, "<pad>");
}

long qpool_spm_encode(const qpool_spm* model, const char* text, size_t len, int* ids,
                      size_t capacity) {
  std::vector<int> out;
  if (!model->processor.Encode(std::string(text, len), &out).ok()) return -1;
  for (size_t i = 0; i < out.size() && i < capacity; ++i) ids[i] = out[i];
  return static_cast<long>(out.size());
}

}  // extern "C"
