#include "pipeline/tokenizer/clip_tokenizer.h"

#include <locale.h>
#include <wctype.h>

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "pipeline/tokenizer/utf8.h"
#include "util/log.h"

namespace qpool {

// Note [CLIP tokenization]
// Encode follows OpenAI CLIP's SimpleTokenizer (which HF's CLIPTokenizer reproduces when ftfy is
// installed):
//   1. UTF-8 is decoded to code points; invalid bytes become U+FFFD (they cannot crash us, and they
//      encode like any other symbol through the byte-level BPE).
//   2. Whitespace runs (Python's str.isspace set) collapse to one space; the text is stripped and
//      lowercased (towlower under C.UTF-8, see Note [Unicode classes without ICU]).
//   3. Pre-tokenization by CLIP's pattern, tried in this order at each position:
//        <|startoftext|> | <|endoftext|> | 's|'t|'re|'ve|'m|'ll|'d | \p{L}+ | \p{N} |
//        [^\s\p{L}\p{N}]+
//      so digits are single tokens and punctuation runs ("!?") are one word.
//   4. Each word's UTF-8 bytes are mapped to printable characters (GPT-2 bytes_to_unicode), "</w>"
//      is appended to the last one, and BPE merges adjacent pairs by lowest rank (merges.txt line
//      order) until no ranked pair is left.
// Differences, all deliberate: no ftfy fix-up and no HTML unescaping (prompts are plain text);
// merges whose result is not in vocab.json are ignored at load (as SimpleTokenizer truncates its
// merge list to the vocab); a BPE symbol missing from the vocab (only possible with inconsistent
// files) falls back to its single-byte symbols, and a byte symbol still missing is skipped.
// Decode cannot restore the original spacing: CLIP marks word ends, not spaces, so
// Decode(Encode("Hi, you!")) is "hi , you !".

// Note [Unicode classes without ICU]
// \p{L} is glibc's iswalpha_l and lowercasing is towlower_l, both under a "C.UTF-8" locale made
// with newlocale (glibc >= 2.35 and Debian ship full Unicode tables for it). glibc counts
// non-ASCII digits (Arabic-Indic, Devanagari, ...) and Roman numerals as alpha, so \p{N} is our
// own table of the common Nd/Nl/No ranges, checked before \p{L}. Combining marks are not alpha
// in glibc, as in Unicode, so "e\u0301" splits like the regex module splits it. Without the
// locale we fall back to ASCII + Latin-1 rules plus "every other code point outside the common
// punctuation/symbol/emoji blocks is a letter"; lowercasing then covers ASCII, Latin-1, Latin
// Extended-A, Greek and Cyrillic only.

namespace {

constexpr size_t kMaxCacheEntries = 20000;
const char* const kWordEnd = "</w>";
const char* const kBos = "<|startoftext|>";
const char* const kEos = "<|endoftext|>";

locale_t Utf8Locale() {
  static const locale_t loc = [] {
    locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
    if (l == static_cast<locale_t>(nullptr)) {
      l = newlocale(LC_CTYPE_MASK, "C.utf8", static_cast<locale_t>(nullptr));
    }
    return l;
  }();
  return loc;
}

// Python's str.isspace set (what CLIP's whitespace_clean collapses).
bool IsSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// \p{N}: the common Nd/Nl/No ranges (Note [Unicode classes without ICU]).
bool IsNumber(char32_t c) {
  static constexpr std::pair<char32_t, char32_t> kRanges[] = {
      {0x30, 0x39},     {0xB2, 0xB3},     {0xB9, 0xB9},       {0xBC, 0xBE},       {0x660, 0x669},
      {0x6F0, 0x6F9},   {0x7C0, 0x7C9},   {0x966, 0x96F},     {0x9E6, 0x9EF},     {0xA66, 0xA6F},
      {0xAE6, 0xAEF},   {0xB66, 0xB6F},   {0xBE6, 0xBF2},     {0xC66, 0xC6F},     {0xCE6, 0xCEF},
      {0xD66, 0xD78},   {0xDE6, 0xDEF},   {0xE50, 0xE59},     {0xED0, 0xED9},     {0xF20, 0xF33},
      {0x1040, 0x1049}, {0x1090, 0x1099}, {0x17E0, 0x17E9},   {0x1810, 0x1819},   {0x2070, 0x2070},
      {0x2074, 0x2079}, {0x2080, 0x2089}, {0x2150, 0x2182},   {0x2185, 0x2189},   {0x2460, 0x249B},
      {0x24EA, 0x24FF}, {0x2776, 0x2793}, {0x3007, 0x3007},   {0x3021, 0x3029},   {0x3038, 0x303A},
      {0x3192, 0x3195}, {0x3220, 0x3229}, {0x3248, 0x324F},   {0x3251, 0x325F},   {0x3280, 0x3289},
      {0x32B1, 0x32BF}, {0xFF10, 0xFF19}, {0x1D7CE, 0x1D7FF}, {0x1F100, 0x1F10C},
  };
  for (const auto& [lo, hi] : kRanges) {
    if (c < lo) return false;
    if (c <= hi) return true;
  }
  return false;
}

// Fallback \p{L} without a UTF-8 locale.
bool IsLetterFallback(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  if (c < 0x100)
    return c == 0xAA || c == 0xB5 || c == 0xBA || (c >= 0xC0 && c != 0xD7 && c != 0xF7);
  if (c >= 0x300 && c <= 0x36F) return false;      // combining marks
  if (c >= 0x2000 && c <= 0x2BFF) return false;    // punctuation, symbols, arrows, shapes
  if (c >= 0x3000 && c <= 0x303F) return false;    // CJK punctuation
  if (c >= 0xFE00 && c <= 0xFE6F) return false;    // variation selectors, small forms
  if (c >= 0xFF00 && c <= 0xFF20) return false;    // fullwidth punctuation
  if (c >= 0x1F000 && c <= 0x1FAFF) return false;  // emoji and pictographs
  if (c == kUtf8Replacement || (c >= 0xE000 && c <= 0xF8FF)) return false;
  return true;
}

bool IsLetter(char32_t c) {
  if (IsNumber(c)) return false;
  const locale_t loc = Utf8Locale();
  if (loc != static_cast<locale_t>(nullptr)) return iswalpha_l(static_cast<wint_t>(c), loc) != 0;
  return IsLetterFallback(c);
}

char32_t ToLowerFallback(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c >= 0x100 && c <= 0x17F) {
    if (c == 0x130) return 'i';
    if (c == 0x178) return 0xFF;
    const bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (c == 0x131 || c == 0x138 || c == 0x149 || c == 0x17F) return c;
    if (odd_upper) return (c % 2 == 1) ? c + 1 : c;
    return (c % 2 == 0) ? c + 1 : c;
  }
  if (c >= 0x391 && c <= 0x3AB && c != 0x3A2) return c + 32;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

char32_t ToLower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  const locale_t loc = Utf8Locale();
  if (loc != static_cast<locale_t>(nullptr)) {
    return static_cast<char32_t>(towlower_l(static_cast<wint_t>(c), loc));
  }
  return ToLowerFallback(c);
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

StatusOr<std::string> ReadFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(StrCat("cannot open ", what, " file '", path, "'"));
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return Internal(StrCat("error reading ", what, " file '", path, "'"));
  return buf.str();
}

bool MatchesAt(const std::u32string& text, size_t i, const char* ascii) {
  for (size_t k = 0; ascii[k] != '\0'; ++k) {
    if (i + k >= text.size() || text[i + k] != static_cast<char32_t>(ascii[k])) return false;
  }
  return true;
}

}  // namespace

ClipTokenizer::ClipTokenizer(ClipTokenizer&&) noexcept = default;
ClipTokenizer& ClipTokenizer::operator=(ClipTokenizer&&) noexcept = default;
ClipTokenizer::~ClipTokenizer() = default;

StatusOr<ClipTokenizer> ClipTokenizer::Load(const std::string& vocab_path,
                                            const std::string& merges_path, int max_length,
                                            const std::string& pad_token) {
  if (max_length < 2) {
    return InvalidArgument(
        StrCat("tokenizer max_length must be >= 2 (room for BOS and EOS), got ", max_length));
  }
  ClipTokenizer tok;
  tok.max_length_ = max_length;

  ASSIGN_OR_RETURN(std::string vocab_text, ReadFile(vocab_path, "vocab"));
  nlohmann::json vocab = nlohmann::json::parse(vocab_text, nullptr, /*allow_exceptions=*/false);
  if (vocab.is_discarded()) {
    return InvalidArgument(StrCat("vocab file '", vocab_path, "' is not valid JSON"));
  }
  if (!vocab.is_object() || vocab.empty()) {
    return InvalidArgument(
        StrCat("vocab file '", vocab_path, "' must be a non-empty JSON object of token -> id"));
  }
  tok.encoder_.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) {
      return InvalidArgument(StrCat("vocab file '", vocab_path, "': id of token '", token,
                                    "' is not a non-negative integer"));
    }
    const auto value = id.get<int64_t>();
    tok.encoder_.emplace(token, value);
    tok.decoder_.emplace(value, token);
  }
  for (const char* special : {kBos, kEos}) {
    if (tok.encoder_.count(special) == 0) {
      return InvalidArgument(StrCat("vocab file '", vocab_path, "' lacks the token ", special));
    }
  }
  tok.bos_id_ = tok.encoder_.at(kBos);
  tok.eos_id_ = tok.encoder_.at(kEos);
  auto pad = tok.encoder_.find(pad_token);
  if (pad == tok.encoder_.end()) {
    return InvalidArgument(
        StrCat("vocab file '", vocab_path, "' lacks the pad token '", pad_token, "'"));
  }
  tok.pad_id_ = pad->second;
  if (pad_token != kEos) tok.pad_special_ = DecodeUtf8(pad_token);

  ASSIGN_OR_RETURN(std::string merges_text, ReadFile(merges_path, "merges"));
  std::istringstream lines(merges_text);
  std::string line;
  int line_no = 0;
  int rank = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line_no == 1 && line.rfind("#version", 0) == 0) continue;
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    if (space == 0 || space == std::string::npos || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos) {
      return InvalidArgument(StrCat("merges file '", merges_path, "' line ", line_no,
                                    ": expected two symbols separated by one space, got '", line,
                                    "'"));
    }
    const int this_rank = rank++;  // ranks follow line order even for merges we ignore
    const std::string merged = line.substr(0, space) + line.substr(space + 1);
    if (tok.encoder_.count(merged) == 0) continue;  // Note [CLIP tokenization]
    tok.merge_ranks_.emplace(line, this_rank);      // first occurrence wins
  }
  tok.cache_ = std::make_unique<Cache>();
  return tok;
}

int ClipTokenizer::MergeRank(const std::string& a, const std::string& b) const {
  std::string key;
  key.reserve(a.size() + b.size() + 1);
  key.append(a).push_back(' ');
  key.append(b);
  const auto it = merge_ranks_.find(key);
  return it == merge_ranks_.end() ? -1 : it->second;
}

std::vector<std::string> ClipTokenizer::Bpe(const std::vector<std::string>& symbols) const {
  std::vector<std::string> word = symbols;
  while (word.size() > 1) {
    int best_rank = std::numeric_limits<int>::max();
    size_t best = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const int r = MergeRank(word[i], word[i + 1]);
      if (r >= 0 && r < best_rank) {
        best_rank = r;
        best = i;
      }
    }
    if (best_rank == std::numeric_limits<int>::max()) break;
    // Merge every non-overlapping occurrence of the best pair, left to right.
    const std::string first = word[best];
    const std::string second = word[best + 1];
    std::vector<std::string> merged;
    merged.reserve(word.size());
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(word[i]);
        ++i;
      }
    }
    word = std::move(merged);
  }
  return word;
}

void ClipTokenizer::EncodeWord(const std::string& word, std::vector<int64_t>* out) const {
  {
    std::lock_guard<std::mutex> lock(cache_->mu);
    const auto it = cache_->entries.find(word);
    if (it != cache_->entries.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const ByteTable& bytes = ByteToUnicode();
  std::vector<std::string> symbols;
  symbols.reserve(word.size());
  for (unsigned char b : word) symbols.push_back(bytes.symbol[b]);
  symbols.back() += kWordEnd;

  std::vector<int64_t> ids;
  for (const std::string& sym : Bpe(symbols)) {
    const auto it = encoder_.find(sym);
    if (it != encoder_.end()) {
      ids.push_back(it->second);
      continue;
    }
    // Fallback for inconsistent files: the symbol's single-byte symbols (Note [CLIP tokenization]).
    const bool ends_word = EndsWith(sym, kWordEnd);
    const std::u32string chars = DecodeUtf8(ends_word ? sym.substr(0, sym.size() - 4) : sym);
    for (size_t k = 0; k < chars.size(); ++k) {
      std::string piece;
      AppendUtf8(chars[k], &piece);
      if (ends_word && k + 1 == chars.size()) piece += kWordEnd;
      const auto pit = encoder_.find(piece);
      if (pit != encoder_.end()) ids.push_back(pit->second);
    }
  }
  out->insert(out->end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_->mu);
  if (cache_->entries.size() >= kMaxCacheEntries) cache_->entries.clear();
  cache_->entries.emplace(word, std::move(ids));
}

// Note [Pad token in prompts]
// SD 2.x's tokenizer pads with "!" and declares it a special token, so the transformers
// tokenizer that diffusers runs matches "!" in a prompt as that token (id 0) instead of the word
// "!</w>" that OpenCLIP's own tokenizer yields. qpool does what diffusers does, so that an
// imported pipeline gives diffusers' images for prompts with a "!".
std::vector<int64_t> ClipTokenizer::Encode(const std::string& text) const {
  // Normalize: collapse whitespace, strip, lowercase.
  const std::u32string raw = DecodeUtf8(text);
  std::u32string norm;
  norm.reserve(raw.size());
  bool pending_space = false;
  for (char32_t c : raw) {
    if (IsSpace(c)) {
      pending_space = !norm.empty();
      continue;
    }
    if (pending_space) {
      norm.push_back(U' ');
      pending_space = false;
    }
    norm.push_back(ToLower(c));
  }

  std::vector<int64_t> ids;
  size_t i = 0;
  while (i < norm.size()) {
    const char32_t c = norm[i];
    if (c == U' ') {
      ++i;
      continue;
    }
    size_t end = i + 1;
    if (MatchesAt(norm, i, kBos) || MatchesAt(norm, i, kEos)) {
      const bool bos = MatchesAt(norm, i, kBos);
      ids.push_back(bos ? bos_id_ : eos_id_);
      i += std::char_traits<char>::length(bos ? kBos : kEos);
      continue;
    }
    // Note [Pad token in prompts]
    if (!pad_special_.empty() && norm.compare(i, pad_special_.size(), pad_special_) == 0) {
      ids.push_back(pad_id_);
      i += pad_special_.size();
      continue;
    }
    if (c == U'\'' && i + 1 < norm.size()) {
      const char32_t n = norm[i + 1];
      if (n == U's' || n == U't' || n == U'm' || n == U'd') {
        end = i + 2;
      } else if (MatchesAt(norm, i + 1, "re") || MatchesAt(norm, i + 1, "ve") ||
                 MatchesAt(norm, i + 1, "ll")) {
        end = i + 3;
      }
    }
    if (end == i + 1) {
      if (IsLetter(c)) {
        while (end < norm.size() && IsLetter(norm[end])) ++end;
      } else if (!IsNumber(c)) {
        while (end < norm.size() && norm[end] != U' ' && !IsLetter(norm[end]) &&
               !IsNumber(norm[end])) {
          ++end;
        }
      }
    }
    EncodeWord(EncodeUtf8(norm.substr(i, end - i)), &ids);
    i = end;
  }
  return ids;
}

std::vector<int64_t> ClipTokenizer::EncodePadded(const std::string& text) const {
  std::vector<int64_t> ids = Encode(text);
  const size_t room = static_cast<size_t>(max_length_ - 2);
  if (ids.size() > room) ids.resize(room);
  std::vector<int64_t> out;
  out.reserve(max_length_);
  out.push_back(bos_id_);
  out.insert(out.end(), ids.begin(), ids.end());
  out.push_back(eos_id_);
  out.resize(max_length_, pad_id());
  return out;
}

std::string ClipTokenizer::Decode(const std::vector<int64_t>& ids) const {
  const ByteTable& bytes = ByteToUnicode();
  std::string out;
  for (int64_t id : ids) {
    if (id == bos_id_ || id == eos_id_) continue;
    const auto it = decoder_.find(id);
    if (it == decoder_.end()) continue;
    std::string token = it->second;
    const bool ends_word = EndsWith(token, kWordEnd);
    if (ends_word) token.resize(token.size() - 4);
    for (char32_t cp : DecodeUtf8(token)) {
      if (cp < bytes.byte_of.size() && bytes.byte_of[cp] >= 0) {
        out.push_back(static_cast<char>(bytes.byte_of[cp]));
      } else {
        AppendUtf8(cp, &out);  // a vocab character outside the byte alphabet: keep it
      }
    }
    if (ends_word) out.push_back(' ');
  }
  out = SanitizeUtf8(out);
  const size_t first = out.find_first_not_of(' ');
  if (first == std::string::npos) return "";
  const size_t last = out.find_last_not_of(' ');
  return out.substr(first, last - first + 1);
}

}  // namespace qpool
