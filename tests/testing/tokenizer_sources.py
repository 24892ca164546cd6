"""Tokenizer files trained here (no hub) for the pipelines tests and benchmarks build themselves:
CLIP's byte-level BPE (vocab.json, merges.txt) and T5's SentencePiece model, both on the
exporter's prompt corpus."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tools", "qpool_export"))


def write_clip_and_t5(folder: str) -> str:
    """vocab.json, merges.txt (1000 tokens) and spiece.model (300, T5's conventions: <pad> 0,
    </s> 1, <unk> 2, no <s>) into `folder`; returns spiece.model's path."""
    import sentencepiece
    from qpool_export import bpe, corpus

    bpe.write_tokenizer(folder, bpe.train_bpe(corpus.PROMPTS, 1000))
    with open(os.path.join(folder, "corpus.txt"), "w") as f:
        f.write("\n".join(corpus.PROMPTS))
    sentencepiece.SentencePieceTrainer.train(
        input=os.path.join(folder, "corpus.txt"), model_prefix=os.path.join(folder, "spiece"),
        vocab_size=300, model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        minloglevel=2)
    return os.path.join(folder, "spiece.model")
