"""CLIP byte-level BPE: a small trainer that writes vocab.json / merges.txt in CLIP's layout, and a
pure-Python reference tokenizer that reads them (used by tests to cross-check qpool's C++ one).

Layout written (the one of openai/CLIP and of SD 1.x's tokenizer folder):
  vocab.json  ids 0..255: the 256 byte symbols of bytes_to_unicode() in its order,
              256..511: the same symbols with "</w>", then one id per merge in merge order,
              then "<|startoftext|>", "<|endoftext|>".  UTF-8, ensure_ascii=False.
  merges.txt  "#version: 0.2", then one "a b" line per merge, highest priority first.
"""

from __future__ import annotations

import collections
import html
import json
import os
import re
import unicodedata
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

BOS = "<|startoftext|>"
EOS = "<|endoftext|>"
END_OF_WORD = "</w>"
_CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d")
_CLIP_PATTERN = (r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|"""
                 r"""[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""")

try:  # the `regex` module understands \p{L}; without it we scan by Unicode category.
    import regex as _regex  # type: ignore
    _CLIP_RE = _regex.compile(_CLIP_PATTERN, _regex.IGNORECASE)
except ImportError:  # pragma: no cover - depends on the environment
    _CLIP_RE = None


def bytes_to_unicode() -> Dict[int, str]:
    """Maps every byte to a printable unicode character (GPT-2's reversible byte encoding).

    Bytes that are printable and not whitespace map to themselves; the 68 others map to
    chr(256), chr(257), ... in increasing byte order. The dict iterates in CLIP's vocab order:
    the printable bytes first, then the remapped ones.
    """
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) +
                 list(range(ord("\xae"), ord("\xff") + 1)))
    mapping = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shift)
            shift += 1
    return mapping


def normalize(text: str, unescape_html: bool = True) -> str:
    """CLIP's text cleaning without ftfy: html-unescape (twice), collapse whitespace, lowercase."""
    if unescape_html:
        text = html.unescape(html.unescape(text))
    return re.sub(r"\s+", " ", text).strip().lower()


def _is_letter(c: str) -> bool:
    return unicodedata.category(c).startswith("L")


def _is_number(c: str) -> bool:
    return unicodedata.category(c).startswith("N")


def _scan_pretokens(text: str) -> List[str]:
    """Same result as re.findall(CLIP pattern, text), by hand (no `regex` module needed)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        special = next((s for s in (BOS, EOS) if text.startswith(s, i)), None)
        if special is None:
            special = next((s for s in _CONTRACTIONS if text.startswith(s, i)), None)
        if special is not None:
            out.append(special)
            i += len(special)
        elif _is_letter(c):
            j = i + 1
            while j < n and _is_letter(text[j]):
                j += 1
            out.append(text[i:j])
            i = j
        elif _is_number(c):
            out.append(c)
            i += 1
        else:
            j = i + 1
            while j < n and not (text[j].isspace() or _is_letter(text[j]) or _is_number(text[j])):
                j += 1
            out.append(text[i:j])
            i = j
    return out


def pretokenize(text: str, use_regex: Optional[bool] = None) -> List[str]:
    """Splits already-normalized text into CLIP pre-tokens (words, single digits, punctuation runs,
    contractions, special tokens). Uses the `regex` module when installed unless use_regex=False."""
    if use_regex is None:
        use_regex = _CLIP_RE is not None
    if use_regex:
        if _CLIP_RE is None:
            raise RuntimeError("the `regex` module is not installed")
        return _CLIP_RE.findall(text)
    return _scan_pretokens(text)


def _word_symbols(word: str, byte_encoder: Dict[int, str]) -> Tuple[str, ...]:
    chars = [byte_encoder[b] for b in word.encode("utf-8")]
    chars[-1] += END_OF_WORD
    return tuple(chars)


def base_vocab() -> List[str]:
    """The 512 symbols every CLIP vocab starts with."""
    symbols = list(bytes_to_unicode().values())
    return symbols + [s + END_OF_WORD for s in symbols]


def train_bpe(corpus: Iterable[str], num_merges: int) -> List[Tuple[str, str]]:
    """Learns up to `num_merges` merges over the pre-tokenized, normalized corpus.

    Greedy BPE: repeatedly merges the most frequent adjacent pair (ties broken by the pair's
    lexicographic order, so training is deterministic). A merge whose product already is a token
    is never chosen, so vocab ids stay dense (512 + len(merges) + 2). Stops early when every word
    is a single symbol.
    """
    byte_encoder = bytes_to_unicode()
    freq: collections.Counter = collections.Counter()
    for line in corpus:
        for word in pretokenize(normalize(line)):
            if word not in (BOS, EOS):
                freq[_word_symbols(word, byte_encoder)] += 1
    words = [list(w) for w in freq]
    counts = [freq[w] for w in freq]

    pair_count: Dict[Tuple[str, str], int] = collections.defaultdict(int)
    pair_words: Dict[Tuple[str, str], set] = collections.defaultdict(set)
    for idx, w in enumerate(words):
        for pair in zip(w, w[1:]):
            pair_count[pair] += counts[idx]
            pair_words[pair].add(idx)

    tokens = set(base_vocab())
    merges: List[Tuple[str, str]] = []
    banned = set()
    while len(merges) < num_merges:
        best = None
        for pair, c in pair_count.items():
            if c <= 0 or pair in banned:
                continue
            if best is None or c > pair_count[best] or (c == pair_count[best] and pair < best):
                best = pair
        if best is None:
            break
        product = best[0] + best[1]
        if product in tokens:
            banned.add(best)
            continue
        tokens.add(product)
        merges.append(best)
        for idx in list(pair_words[best]):
            w, c = words[idx], counts[idx]
            for pair in zip(w, w[1:]):  # remove this word's old pairs ...
                pair_count[pair] -= c
            merged, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    merged.append(product)
                    i += 2
                else:
                    merged.append(w[i])
                    i += 1
            words[idx] = merged
            for pair in zip(merged, merged[1:]):  # ... and add its new ones
                pair_count[pair] += c
                pair_words[pair].add(idx)
        del pair_count[best]
        del pair_words[best]
    return merges


def build_vocab(merges: Sequence[Tuple[str, str]]) -> Dict[str, int]:
    """CLIP-layout vocab (token -> id) for the given merges."""
    tokens = base_vocab() + [a + b for a, b in merges] + [BOS, EOS]
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError("merges produce duplicate tokens")
    return vocab


def write_tokenizer(out_dir: str, merges: Sequence[Tuple[str, str]]) -> Dict[str, int]:
    """Writes out_dir/vocab.json and out_dir/merges.txt; returns the vocab."""
    os.makedirs(out_dir, exist_ok=True)
    vocab = build_vocab(merges)
    with open(os.path.join(out_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")
    return vocab


class ClipTokenizer:
    """Reference CLIP tokenizer (SimpleTokenizer semantics, no ftfy) over vocab.json/merges.txt.

    encode(text) -> ids without BOS/EOS; encode_padded(text) -> BOS + ids[:max_length-2] + EOS,
    padded with EOS (SD 1.x's pad token) to max_length; decode(ids) -> normalized pre-tokenized
    text with one space per word end ("hi , you").
    """

    def __init__(self, vocab_path: str, merges_path: str, max_length: int = 77,
                 unescape_html: bool = True, use_regex: Optional[bool] = None):
        with open(vocab_path, encoding="utf-8") as f:
            self.encoder: Dict[str, int] = json.load(f)
        self.decoder = {i: t for t, i in self.encoder.items()}
        with open(merges_path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        if lines and lines[0].startswith("#version"):
            lines = lines[1:]
        pairs = [tuple(line.split(" ")) for line in lines if line]
        self.ranks = {p: r for r, p in enumerate(pairs)}
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {u: b for b, u in self.byte_encoder.items()}
        self.bos_id = self.encoder[BOS]
        self.eos_id = self.encoder[EOS]
        self.pad_id = self.eos_id
        self.max_length = max_length
        self.unescape_html = unescape_html
        self.use_regex = use_regex
        self._cache: Dict[str, List[str]] = {}

    def bpe(self, word: str) -> List[str]:
        """Final BPE symbols of one pre-token (the last ends in "</w>")."""
        if word in (BOS, EOS):
            return [word]
        if word in self._cache:
            return self._cache[word]
        symbols = list(_word_symbols(word, self.byte_encoder))
        while len(symbols) > 1:
            ranked = [(self.ranks.get(p, None), i) for i, p in enumerate(zip(symbols, symbols[1:]))]
            ranked = [(r, i) for r, i in ranked if r is not None]
            if not ranked:
                break
            best = min(ranked)[0]
            pair = next(p for p in zip(symbols, symbols[1:]) if self.ranks.get(p) == best)
            merged, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        self._cache[word] = symbols
        return symbols

    def tokenize(self, text: str) -> List[str]:
        out = []
        for word in pretokenize(normalize(text, self.unescape_html), self.use_regex):
            out.extend(self.bpe(word))
        return out

    def encode(self, text: str) -> List[int]:
        return [self.encoder[t] for t in self.tokenize(text)]

    def encode_padded(self, text: str) -> List[int]:
        ids = [self.bos_id] + self.encode(text)[: self.max_length - 2] + [self.eos_id]
        return ids + [self.pad_id] * (self.max_length - len(ids))

    def decode(self, ids: Sequence[int]) -> str:
        specials = (self.bos_id, self.eos_id)
        text = "".join(self.decoder[i] for i in ids if i in self.decoder and i not in specials)
        raw = bytearray(self.byte_decoder[c] for c in text)  # "</w>" is made of printable bytes
        return raw.decode("utf-8", errors="replace").replace(END_OF_WORD, " ").strip()
