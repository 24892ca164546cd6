/* The C interface of libqpool_sentencepiece, the shim through which qpool calls the packaged
 * SentencePiece library (Note [SentencePiece behind a shim] in ../sentencepiece_tokenizer.cpp).
 * Plain C types only: the shim is loaded with dlopen and its functions found by name. */
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a signature below changes; qpool refuses a shim of another version. */
#define QPOOL_SPM_SHIM_VERSION 1

/* The shim is built with hidden visibility; these are its only exported symbols. */
#define QPOOL_SPM_EXPORT __attribute__((visibility("default")))

typedef struct qpool_spm qpool_spm;

/* What qpool_spm_info reports of a model. */
typedef struct {
  int pieces; /* vocabulary size */
  int eos_id; /* "</s>", -1 if the model has none */
  int pad_id; /* the model's pad id, else the id of "<pad>", -1 if neither */
  int unk_id;
} qpool_spm_model_info;

QPOOL_SPM_EXPORT int qpool_spm_version(void);
/* Loads a model file; on failure returns NULL and writes a message to error (NUL-terminated,
 * truncated to error_size). */
QPOOL_SPM_EXPORT qpool_spm* qpool_spm_load(const char* path, char* error, size_t error_size);
QPOOL_SPM_EXPORT void qpool_spm_free(qpool_spm* model);
QPOOL_SPM_EXPORT void qpool_spm_info(const qpool_spm* model, qpool_spm_model_info* info);
/* Encodes text (len bytes of UTF-8) into at most capacity ids; returns how many ids the text
 * has (more than capacity: call again with room for them), or -1 on failure. Thread-safe. */
QPOOL_SPM_EXPORT long qpool_spm_encode(const qpool_spm* model, const char* text, size_t len,
                                       int* ids, size_t capacity);

#ifdef __cplusplus
}
#endif
