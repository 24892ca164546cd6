"""Byte-level BPE tokenizers as LLM text encoders ship them, trained here with Hugging Face's
tokenizers on a small corpus, and the ids transformers' PreTrainedTokenizerFast gives a set of
prompts: the reference bpe_tokenizer_test compares BpeTokenizer with.

Usage: bpe_reference.py OUT_DIR   (writes OUT_DIR/<variant>/tokenizer.json and cases.json)
"""

import json
import sys
from pathlib import Path

from tokenizers import (AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers,
                        processors, trainers)
from transformers import PreTrainedTokenizerFast

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "a photo of a red fox in the snow, 4k, highly detailed",
    "an astronaut riding a horse on mars, digital art by greg rutkowski",
    "They're sure it's the cat's toy; we'll see what I'd've done",
    "café crème brûlée naïve façade, Straße, Ελληνικά, русский текст",
    "日本語のテキストと中文文本，还有한국어 텍스트",
    "emoji 🦊🔥✨ and a family 👨‍👩‍👧 in 2024 with 1234567 numbers 3.14159",
    "tabs\tand\nnew lines\r\n  and   spaces",
] * 40

PROMPTS = [
    "",
    "a red fox",
    "A Photo Of A RED FOX in the SNOW",
    "I'm sure they'LL say it's fine, we'd've known",
    "1234567890 and 3.14159 and 2024-12-02",
    "  leading and trailing spaces   ",
    "a   b\n\n c \t\td\r\n\r\ne",
    "café naïve Straße Ελληνικά русский 日本語 中文 한국어",
    "emoji 🦊🔥✨ a family 👨‍👩‍👧 and flags 🇯🇵",
    "e\u0301 combining marks a\u0308 and \u200b zero width \u3000 ideographic space",
    "decomposed cafe\u0301 and composed café, Hangul \u1100\u1161 and \uac00, \u212b angstrom",
    "control \x00 \x07 chars \u0085 next line",
    "<|begin_of_text|>already there<|eot_id|> and <|eot_id|>again",
    "an added word qpool and qpoolqpool, a <mask> stripped <mask>  both sides",
    "unknown merges: zxqv wxyz ʘ ߷ 𓀀",
    " ".join(["a long prompt of many words, numbers 42 and emoji 🦊"] * 60),
    "x" * 3000,
]


def train(pattern, ignore_merges, template, nfc=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    if pattern is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens([AddedToken("qpool", normalized=True)])
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True)])
    if template:
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          special_tokens=[("<|begin_of_text|>", bos)])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def main(out):
    variants = {"llama3": (LLAMA3, True, True, False), "qwen2": (QWEN2, False, False, True),
                "qwen2-no-normalizer": (QWEN2, False, False, False),
                "gpt2": (None, False, False, False)}
    for name, (pattern, ignore_merges, template, nfc) in variants.items():
        folder = Path(out) / name
        folder.mkdir(parents=True, exist_ok=True)
        train(pattern, ignore_merges, template, nfc).save(str(folder / "tokenizer.json"))
        fast = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
        fast.pad_token = "<|end_of_text|>"
        cases = []
        for text in PROMPTS:
            padded = fast(text, padding="max_length", max_length=16, truncation=True)
            cases.append({"text": text, "ids": fast(text)["input_ids"],
                          "plain": fast(text, add_special_tokens=False)["input_ids"],
                          "padded": padded["input_ids"], "mask": padded["attention_mask"]})
        (folder / "cases.json").write_text(json.dumps(
            {"pad_id": fast.pad_token_id, "max_length": 16, "cases": cases}, ensure_ascii=False))


if __name__ == "__main__":
    main(sys.argv[1])
