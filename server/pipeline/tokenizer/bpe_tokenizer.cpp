#include "pipeline/tokenizer/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <tuple>
#include <type_traits>

#include "pipeline/tokenizer/utf8.h"
#include "util/log.h"

namespace qpool {
namespace {

using Json = nlohmann::json;

// Steps one match of the pre-tokenizer may take (PCRE2's default is 10 million); Llama 3's and
// Qwen's patterns take a few per character.
constexpr uint32_t kMatchLimit = 1000000;

// GPT-2's pre-tokenizer, what a ByteLevel pre-tokenizer with use_regex runs.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The White_Space property (what the added tokens' lstrip and rstrip take).
bool IsWhiteSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// Unicode's canonical composition (NFC) of valid UTF-8, NUL characters included.
std::string Nfc(const std::string& text) {
  utf8proc_uint8_t* composed = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &composed,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return text;  // not valid UTF-8: Encode sanitized it, so this does not happen
  std::string out(reinterpret_cast<const char*>(composed), static_cast<size_t>(n));
  std::free(composed);
  return out;
}

uint64_t PairKey(int64_t left, int64_t right) {
  return (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
}

// Reads an optional member: absent and null are `fallback`.
template <typename T>
bool Member(const Json& object, const char* key, T fallback, T* out) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) {
    *out = fallback;
    return true;
  }
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) return false;
  } else {
    if (!it->is_string()) return false;
  }
  *out = it->get<T>();
  return true;
}

}  // namespace

struct BpeTokenizer::Regex {
  pcre2_code* code = nullptr;
  // Bounds one match's backtracking: a pattern that explodes on some text gives up there, and
  // the rest of that text is one piece, instead of holding the request for minutes.
  pcre2_match_context* context = nullptr;
  ~Regex() {
    pcre2_match_context_free(context);
    pcre2_code_free(code);
  }
};

BpeTokenizer::BpeTokenizer() = default;
BpeTokenizer::~BpeTokenizer() = default;

StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return NotFound(StrCat("cannot read tokenizer file ", path));
  const std::streamoff bytes = in.tellg();
  if (bytes < 0 || bytes > kMaxFileBytes) {
    return InvalidArgument(StrCat(path, ": a tokenizer.json of more than ", kMaxFileBytes >> 20,
                                  " MiB (Llama 3's is 9 MB)"));
  }
  in.seekg(0);
  std::string text(static_cast<size_t>(bytes), '\0');
  if (!in.read(text.data(), bytes)) return NotFound(StrCat("cannot read tokenizer file ", path));
  return Parse(text, path);
}

StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Parse(const std::string& text,
                                                            const std::string& name) {
  try {
    return ParseJson(text, name);
  } catch (const nlohmann::json::exception& e) {  // a field of another type than read
    return InvalidArgument(StrCat(name, ": a field has an unexpected type (", e.what(),
                                  ") (Note [Byte-level BPE from tokenizer.json])"));
  }
}

StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::ParseJson(const std::string& text,
                                                                const std::string& name) {
  auto bad = [&name](const std::string& field, const std::string& why) {
    return InvalidArgument(
        StrCat(name, ": ", field, " ", why, " (Note [Byte-level BPE from tokenizer.json])"));
  };
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument(StrCat(name, ": not a JSON object"));
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());

  // ---- model
  const auto model = j.find("model");
  if (model == j.end() || !model->is_object()) return bad("'model'", "is required");
  if (model->value("type", std::string()) != "BPE") {
    return bad("'model.type'", "must be \"BPE\"");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    std::string value;
    if (!Member(*model, key, std::string(), &value) || !value.empty()) {
      return bad(StrCat("'model.", key, "'"), "is not supported (byte-level BPE has none)");
    }
  }
  bool byte_fallback = false;
  if (!Member(*model, "byte_fallback", false, &byte_fallback) || byte_fallback) {
    return bad("'model.byte_fallback'", "is not supported");
  }
  if (model->contains("dropout") && !(*model)["dropout"].is_null()) {
    return bad("'model.dropout'", "is not supported (it makes tokenization random)");
  }
  if (!Member(*model, "ignore_merges", false, &t->ignore_merges_)) {
    return bad("'model.ignore_merges'", "must be a boolean");
  }
  const auto vocab = model->find("vocab");
  if (vocab == model->end() || !vocab->is_object() || vocab->empty()) {
    return bad("'model.vocab'", "must be an object of token -> id");
  }
  int64_t largest = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX) {
      return bad(StrCat("'model.vocab' entry '", Abbreviate(it.key()), "'"),
                 "must be an id from 0 to 2^31-1");
    }
    t->vocab_[it.key()] = it.value().get<int64_t>();
    largest = std::max(largest, it.value().get<int64_t>());
  }
  const auto merges = model->find("merges");
  if (merges == model->end() || !merges->is_array()) {
    return bad("'model.merges'", "must be a list");
  }
  int32_t rank = 0;
  for (const Json& merge : *merges) {
    std::string left, right;
    if (merge.is_string()) {  // "a b"
      const std::string s = merge.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return bad(StrCat("'model.merges[", rank, "]'"), "must be two tokens \"a b\"");
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {  // ["a", "b"]
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      return bad(StrCat("'model.merges[", rank, "]'"), "must be \"a b\" or [\"a\", \"b\"]");
    }
    const auto l = t->vocab_.find(left);
    const auto r = t->vocab_.find(right);
    const auto m = t->vocab_.find(left + right);
    if (l == t->vocab_.end() || r == t->vocab_.end() || m == t->vocab_.end()) {
      return bad(StrCat("'model.merges[", rank, "]'"),
                 StrCat("merges '", Abbreviate(left), "' and '", Abbreviate(right),
                        "', which with their merge must all be in the vocabulary"));
    }
    // A later duplicate wins, as in tokenizers.
    t->merges_[PairKey(l->second, r->second)] = {rank++, m->second};
  }

  // ---- added tokens
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    if (!j["added_tokens"].is_array()) return bad("'added_tokens'", "must be a list");
    size_t i = 0;
    for (const Json& added : j["added_tokens"]) {
      const std::string field = StrCat("'added_tokens[", i++, "]'");
      if (!added.is_object() || !added.contains("content") || !added["content"].is_string() ||
          added["content"].get<std::string>().empty() || !added.contains("id") ||
          !added["id"].is_number_integer() || added["id"].get<int64_t>() < 0 ||
          added["id"].get<int64_t>() > INT32_MAX) {
        return bad(field, "must have a non-empty 'content' and an 'id' from 0 to 2^31-1");
      }
      AddedToken token{added["content"].get<std::string>(), added["id"].get<int64_t>(), false,
                       false};
      bool single_word = false;
      if (!Member(added, "lstrip", false, &token.lstrip) ||
          !Member(added, "rstrip", false, &token.rstrip) ||
          !Member(added, "single_word", false, &single_word)) {
        return bad(field, "'lstrip', 'rstrip' and 'single_word' must be booleans");
      }
      if (single_word) return bad(field, "'single_word' is not supported");
      largest = std::max(largest, token.id);
      t->added_.push_back(std::move(token));
    }
    std::stable_sort(t->added_.begin(), t->added_.end(),
                     [](const AddedToken& a, const AddedToken& b) {
                       return a.content.size() > b.content.size();
                     });
  }
  t->vocab_size_ = static_cast<size_t>(largest + 1);

  // ---- normalizer (none, or Qwen's NFC) and pre-tokenizer
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const Json& normalizer = j["normalizer"];
    if (!normalizer.is_object() || normalizer.value("type", std::string()) != "NFC") {
      return bad("'normalizer'", "must be none or NFC");
    }
    t->nfc_ = true;
  }
  std::string pattern;
  const Json pre = j.value("pre_tokenizer", Json());
  auto byte_level = [&](const Json& p, const std::string& field, bool regex_allowed) -> Status {
    bool prefix_space = false;
    bool use_regex = true;
    if (!Member(p, "add_prefix_space", false, &prefix_space) || prefix_space) {
      return bad(field + ".add_prefix_space", "must be false");
    }
    if (!Member(p, "use_regex", true, &use_regex)) {
      return bad(field + ".use_regex", "must be a boolean");
    }
    if (use_regex && !regex_allowed) {
      return bad(field + ".use_regex", "must be false after a Split");
    }
    if (use_regex) pattern = kGpt2Pattern;
    return Status::Ok();
  };
  const std::string pre_type = pre.is_object() ? pre.value("type", std::string()) : "";
  if (pre_type == "ByteLevel") {
    RETURN_IF_ERROR(byte_level(pre, "'pre_tokenizer'", /*regex_allowed=*/true));
    if (pattern.empty()) return bad("'pre_tokenizer.use_regex'", "must be true when alone");
  } else if (pre_type == "Sequence" && pre.contains("pretokenizers") &&
             pre["pretokenizers"].is_array() && pre["pretokenizers"].size() == 2) {
    const Json& split = pre["pretokenizers"][0];
    const std::string field = "'pre_tokenizer.pretokenizers[0]'";
    if (!split.is_object() || split.value("type", std::string()) != "Split" ||
        !split.contains("pattern") || !split["pattern"].is_object() ||
        !split["pattern"].contains("Regex") || !split["pattern"]["Regex"].is_string()) {
      return bad(field, "must be a Split on a Regex pattern");
    }
    if (split.value("behavior", std::string()) != "Isolated") {
      return bad(field + ".behavior", "must be \"Isolated\"");
    }
    bool invert = false;
    if (!Member(split, "invert", false, &invert) || invert) {
      return bad(field + ".invert", "must be false");
    }
    pattern = split["pattern"]["Regex"].get<std::string>();
    const Json& second = pre["pretokenizers"][1];
    if (!second.is_object() || second.value("type", std::string()) != "ByteLevel") {
      return bad("'pre_tokenizer.pretokenizers[1]'", "must be a ByteLevel");
    }
    const std::string split_pattern = pattern;
    RETURN_IF_ERROR(byte_level(second, "'pre_tokenizer.pretokenizers[1]'", false));
    pattern = split_pattern;
  } else {
    return bad("'pre_tokenizer'", "must be a ByteLevel, or a Sequence of a Split and a ByteLevel");
  }
  int error = 0;
  PCRE2_SIZE offset = 0;
  t->split_ = std::make_unique<Regex>();
  t->split_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (t->split_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return bad("'pre_tokenizer' regex", StrCat("does not compile at offset ", offset, ": ",
                                               reinterpret_cast<const char*>(message)));
  }
  pcre2_jit_compile(t->split_->code, PCRE2_JIT_COMPLETE);  // interpreted when JIT is missing
  t->split_->context = pcre2_match_context_create(nullptr);
  if (t->split_->context == nullptr) return Internal("PCRE2: no memory for a match context");
  pcre2_set_match_limit(t->split_->context, kMatchLimit);
  pcre2_set_depth_limit(t->split_->context, kMatchLimit);

  // ---- post-processor: ByteLevel (nothing), TemplateProcessing, or a Sequence of them
  std::vector<Json> processors;
  const Json post = j.value("post_processor", Json());
  if (post.is_object() && post.value("type", std::string()) == "Sequence" &&
      post.contains("processors") && post["processors"].is_array()) {
    for (const Json& p : post["processors"]) processors.push_back(p);
  } else if (!post.is_null()) {
    processors.push_back(post);
  }
  for (const Json& p : processors) {
    const std::string type = p.is_object() ? p.value("type", std::string()) : "";
    if (type == "ByteLevel") continue;
    if (type != "TemplateProcessing" || !p.contains("single") || !p["single"].is_array()) {
      return bad("'post_processor'", "must be ByteLevel or TemplateProcessing");
    }
    bool seen_text = false;
    for (const Json& piece : p["single"]) {
      if (piece.contains("Sequence")) {
        if (seen_text) return bad("'post_processor.single'", "names the text twice");
        seen_text = true;
        continue;
      }
      const std::string id = piece.contains("SpecialToken") && piece["SpecialToken"].is_object()
                                 ? piece["SpecialToken"].value("id", std::string())
                                 : std::string();
      const Json specials = p.value("special_tokens", Json::object());
      if (id.empty() || !specials.contains(id) || !specials[id].contains("ids") ||
          !specials[id]["ids"].is_array()) {
        return bad("'post_processor.single'",
                   StrCat("names special token '", Abbreviate(id),
                          "', which its special_tokens do not give ids"));
      }
      for (const Json& value : specials[id]["ids"]) {
        if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
            value.get<int64_t>() >= static_cast<int64_t>(t->vocab_size_)) {
          return bad("'post_processor.special_tokens'",
                     StrCat("'", Abbreviate(id), "' has an id out of range"));
        }
        (seen_text ? t->suffix_ : t->prefix_).push_back(value.get<int64_t>());
      }
    }
    if (!seen_text) return bad("'post_processor.single'", "does not hold the text ($A)");
  }
  return t;
}

int64_t BpeTokenizer::TokenId(const std::string& token) const {
  for (const AddedToken& added : added_) {
    if (added.content == token) return added.id;
  }
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

std::vector<int64_t> BpeTokenizer::Encode(const std::string& raw, bool add_special_tokens) const {
  const std::string text = SanitizeUtf8(raw);
  std::vector<int64_t> out;
  if (add_special_tokens) out = prefix_;
  // 1. Added tokens, leftmost-longest (added_ is sorted longest first).
  size_t plain_start = 0;
  size_t i = 0;
  while (i < text.size()) {
    const AddedToken* found = nullptr;
    for (const AddedToken& added : added_) {
      if (text.compare(i, added.content.size(), added.content) == 0) {
        found = &added;
        break;
      }
    }
    if (found == nullptr) {
      ++i;
      continue;
    }
    size_t plain_end = i;
    if (found->lstrip) {  // the whitespace before it is the token's
      const std::u32string before = DecodeUtf8(text.substr(plain_start, i - plain_start));
      size_t keep = before.size();
      while (keep > 0 && IsWhiteSpace(before[keep - 1])) --keep;
      plain_end = plain_start + EncodeUtf8(before.substr(0, keep)).size();
    }
    EncodePlain(text.substr(plain_start, plain_end - plain_start), &out);
    out.push_back(found->id);
    i += found->content.size();
    if (found->rstrip) {  // and the whitespace after it
      while (i < text.size()) {
        size_t next = i + 1;
        while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0) == 0x80)
          ++next;
        const std::u32string c = DecodeUtf8(text.substr(i, next - i));
        if (c.empty() || !IsWhiteSpace(c[0])) break;
        i = next;
      }
    }
    plain_start = i;
  }
  EncodePlain(text.substr(plain_start), &out);
  if (add_special_tokens) out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

std::vector<int64_t> BpeTokenizer::EncodePadded(const std::string& text, int max_length,
                                                int64_t pad_id, std::vector<int64_t>* mask,
                                                bool add_special_tokens) const {
  std::vector<int64_t> ids = Encode(text, /*add_special_tokens=*/false);
  const size_t around = add_special_tokens ? prefix_.size() + suffix_.size() : 0;
  const size_t budget = max_length > static_cast<int>(around) ? max_length - around : 0;
  if (ids.size() > budget) ids.resize(budget);
  std::vector<int64_t> out;
  if (add_special_tokens) out = prefix_;
  out.insert(out.end(), ids.begin(), ids.end());
  if (add_special_tokens) out.insert(out.end(), suffix_.begin(), suffix_.end());
  if (mask != nullptr) mask->assign(out.size(), 1);
  while (static_cast<int>(out.size()) < max_length) {
    out.push_back(pad_id);
    if (mask != nullptr) mask->push_back(0);
  }
  return out;
}

void BpeTokenizer::EncodePlain(const std::string& raw, std::vector<int64_t>* out) const {
  if (raw.empty()) return;
  const std::string text = nfc_ ? Nfc(raw) : raw;
  // 2. The pre-tokenizer: every match is a piece, and so is every gap between matches.
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> match(
      pcre2_match_data_create_from_pattern(split_->code, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t at = 0;
  while (at < text.size()) {
    const int rc = pcre2_match(split_->code, subject, text.size(), at, PCRE2_NO_UTF_CHECK,
                               match.get(), split_->context);
    if (rc < 0) break;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (start > at) EncodePiece(text.substr(at, start - at), out);
    if (end == start) {  // an empty match: step over one character, which stays in the gap
      size_t next = start + 1;
      while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0) == 0x80) ++next;
      EncodePiece(text.substr(start, next - start), out);
      at = next;
      continue;
    }
    EncodePiece(text.substr(start, end - start), out);
    at = end;
  }
  if (at < text.size()) EncodePiece(text.substr(at), out);
}

void BpeTokenizer::EncodePiece(const std::string& piece, std::vector<int64_t>* out) const {
  // 3. Bytes to GPT-2's characters, then merges by rank.
  const ByteTable& table = ByteToUnicode();
  std::string mapped;
  for (unsigned char byte : piece) mapped += table.symbol[byte];
  if (ignore_merges_) {
    auto whole = vocab_.find(mapped);
    if (whole != vocab_.end()) {
      out->push_back(whole->second);
      return;
    }
  }
  struct Symbol {
    int64_t id;
    int prev;
    int next;
  };
  std::vector<Symbol> symbols;
  for (unsigned char byte : piece) {
    auto it = vocab_.find(table.symbol[byte]);
    if (it == vocab_.end()) continue;  // no unknown token: dropped, as tokenizers does
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({it->second, index - 1, index + 1});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;
  // (rank, position, left id, right id): the lowest rank first, the leftmost of equal ranks.
  using Candidate = std::tuple<int32_t, int, int64_t, int64_t>;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto offer = [&](int left) {
    if (left < 0 || symbols[left].next < 0) return;
    const int right = symbols[left].next;
    auto it = merges_.find(PairKey(symbols[left].id, symbols[right].id));
    if (it != merges_.end()) {
      queue.emplace(it->second.first, left, symbols[left].id, symbols[right].id);
    }
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) offer(i);
  while (!queue.empty()) {
    const auto [rank, left, left_id, right_id] = queue.top();
    queue.pop();
    Symbol& l = symbols[left];
    if (l.id < 0 || l.next < 0 || l.id != left_id || symbols[l.next].id != right_id) continue;
    Symbol& r = symbols[l.next];
    l.id = merges_.at(PairKey(left_id, right_id)).second;
    r.id = -1;  // merged away
    l.next = r.next;
    if (l.next >= 0) symbols[l.next].prev = left;
    offer(l.prev);
    offer(left);
  }
  for (int i = 0; i >= 0; i = symbols[i].next) out->push_back(symbols[i].id);
}

}  // namespace qpool
