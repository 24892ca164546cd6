"""T5's SentencePiece model rebuilt from the tokenizer.json that transformers 5 saves alone.

Note [T5 from tokenizer.json]
The server tokenizes T5 prompts with the SentencePiece library (Note [T5 tokenization] in
server/pipeline/tokenizer/sentencepiece_tokenizer.h), which reads a model file. A tokenizer.json
of T5 holds everything such a model holds for encoding: a Unigram model (each piece and its
score, the unknown piece), the normalizer SentencePiece compiled (its precompiled_charsmap, the
same bytes as a model's normalizer_spec), and a Metaspace pre-tokenizer (spaces as "▁", one added
in front) behind a whitespace split (runs of spaces collapsed). So the model is written back
from them: the pieces with their scores (<pad> and </s> as control pieces, the unknown piece as
such), the charsmap, a dummy prefix, extra whitespace removed and whitespace escaped. T5's
sentinels (<extra_id_N>), which T5TokenizerFast adds after the pieces in reverse, stay out of
the model: the server adds them itself (pieces + 99 - N), and a tokenizer.json whose sentinels
are elsewhere, or whose normalizer, pre-tokenizer or model is anything else, is refused naming
the field. The tests compare the rebuilt model's ids with the original's and the server's with
T5TokenizerFast's.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Dict, List

from .import_error import ImportFailure

SENTINELS = 100  # T5's <extra_id_0> .. <extra_id_99>


def _normalizer_charsmap(normalizer: object, path: str) -> bytes:
    """The precompiled charsmap of a Precompiled normalizer, alone or followed by the Replace of
    runs of spaces by one that T5's conversion adds."""
    parts = normalizer.get("normalizers") if isinstance(normalizer, dict) and \
        normalizer.get("type") == "Sequence" else [normalizer]
    charsmap = None
    for part in parts or []:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "Precompiled" and charsmap is None:
            charsmap = base64.b64decode(part.get("precompiled_charsmap") or "")
        elif kind == "Replace" and part.get("pattern") == {"Regex": " {2,}"} and \
                part.get("content") == " ":
            continue  # what remove_extra_whitespaces does
        else:
            raise ImportFailure(f"{path}: field 'normalizer' has a {kind!r} step; qpool rebuilds "
                                f"T5's SentencePiece model from a Precompiled normalizer")
    if not charsmap:
        raise ImportFailure(f"{path}: field 'normalizer' holds no precompiled_charsmap")
    return charsmap


def _check_pre_tokenizer(pre: object, path: str) -> None:
    parts = pre.get("pretokenizers") if isinstance(pre, dict) and \
        pre.get("type") == "Sequence" else [pre]
    kinds = [p.get("type") if isinstance(p, dict) else None for p in parts or []]
    meta = [p for p in parts or [] if isinstance(p, dict) and p.get("type") == "Metaspace"]
    if not meta or any(k not in ("WhitespaceSplit", "Metaspace") for k in kinds) or \
            meta[0].get("replacement") != "\u2581" or \
            meta[0].get("prepend_scheme", "always") != "always":
        raise ImportFailure(f"{path}: field 'pre_tokenizer' is {json.dumps(pre)[:200]}; qpool "
                            f"rebuilds T5's SentencePiece model behind a Metaspace that "
                            f"prepends '\u2581' always")


def spiece_from_tokenizer_json(path: str) -> bytes:
    """The serialized SentencePiece ModelProto of the T5 tokenizer.json at `path` (Note [T5 from
    tokenizer.json]); ImportFailure naming the file and the field it cannot rebuild."""
    from sentencepiece import sentencepiece_model_pb2 as spm

    try:
        with open(path, encoding="utf-8") as f:
            tokenizer = json.load(f)
    except (OSError, ValueError) as e:
        raise ImportFailure(f"{path}: cannot be read as JSON: {e}") from None
    model = tokenizer.get("model") if isinstance(tokenizer, dict) else None
    if not isinstance(model, dict) or model.get("type") != "Unigram":
        kind = model.get("type") if isinstance(model, dict) else None
        raise ImportFailure(f"{path}: field 'model.type' is {kind!r}; T5's tokenizer is Unigram")
    if model.get("byte_fallback"):
        raise ImportFailure(f"{path}: field 'model.byte_fallback' is true; T5's is false")
    charsmap = _normalizer_charsmap(tokenizer.get("normalizer"), path)
    _check_pre_tokenizer(tokenizer.get("pre_tokenizer"), path)
    vocab: List[List[object]] = model.get("vocab") or []
    added: Dict[int, str] = {t["id"]: t["content"] for t in tokenizer.get("added_tokens", [])
                             if isinstance(t, dict) and isinstance(t.get("id"), int)}
    sentinel = re.compile(r"<extra_id_(\d+)>")
    sentinels = {i: int(sentinel.fullmatch(c).group(1)) for i, c in added.items()
                 if sentinel.fullmatch(c)}
    pieces = len(vocab) - len(sentinels)
    if sentinels and (len(sentinels) != SENTINELS or any(
            i != pieces + SENTINELS - 1 - n for i, n in sentinels.items())):
        raise ImportFailure(f"{path}: its {len(sentinels)} sentinels <extra_id_N> are not the "
                            f"{SENTINELS} ids after the {pieces} pieces in reverse that the "
                            f"server adds")
    ids = {str(piece): i for i, (piece, _) in enumerate(vocab[:pieces])}
    unk = model.get("unk_id")
    for name in ("<pad>", "</s>"):
        if name not in ids:
            raise ImportFailure(f"{path}: field 'model.vocab' has no {name}")
    proto = spm.ModelProto()
    for i, (piece, score) in enumerate(vocab[:pieces]):
        entry = proto.pieces.add()
        entry.piece = str(piece)
        entry.score = float(score)
        entry.type = (spm.ModelProto.SentencePiece.CONTROL if i in (ids["<pad>"], ids["</s>"])
                      else spm.ModelProto.SentencePiece.UNKNOWN if i == unk
                      else spm.ModelProto.SentencePiece.NORMAL)
    trainer = proto.trainer_spec
    trainer.model_type = spm.TrainerSpec.UNIGRAM
    trainer.vocab_size = pieces
    trainer.pad_id, trainer.eos_id, trainer.bos_id = ids["<pad>"], ids["</s>"], -1
    trainer.unk_id = unk if isinstance(unk, int) and 0 <= unk < pieces else ids.get("<unk>", 2)
    normalizer = proto.normalizer_spec
    normalizer.name = "nmt_nfkc"
    normalizer.precompiled_charsmap = charsmap
    normalizer.add_dummy_prefix = True
    normalizer.remove_extra_whitespaces = True
    normalizer.escape_whitespaces = True
    return proto.SerializeToString()
