#include "pipeline/tokenizer/sentencepiece_tokenizer.h"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>

#include "pipeline/tokenizer/sentencepiece_shim/sentencepiece_shim.h"
#include "pipeline/tokenizer/utf8.h"
#include "util/log.h"

namespace qpool {

// Note [SentencePiece behind a shim]
// Debian's libsentencepiece0 carries its own copy of protobuf-lite and exports its symbols
// (google::protobuf::...), which gRPC's libprotobuf also defines: linked into qpool-server, one
// copy's symbols interpose the other's and the process crashes while registering descriptors,
// before main. So qpool never links it. libqpool_sentencepiece (sentencepiece_shim/), built
// with the server, links the library and offers a C interface; it is loaded with dlopen
// RTLD_LOCAL | RTLD_DEEPBIND, so that the library and its protobuf resolve their own symbols
// first and add none to the process's global scope. The shim is looked up at
// $QPOOL_SENTENCEPIECE_SHIM, next to the executable, in <executable>/../lib/qpool/, then in the
// build tree it was built in.

namespace {

namespace fs = std::filesystem;

constexpr char kShimName[] = "libqpool_sentencepiece.so";

struct Shim {
  decltype(&qpool_spm_load) load = nullptr;
  decltype(&qpool_spm_free) free = nullptr;
  decltype(&qpool_spm_info) info = nullptr;
  decltype(&qpool_spm_encode) encode = nullptr;
};

std::vector<std::string> ShimCandidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("QPOOL_SENTENCEPIECE_SHIM"); env != nullptr && *env) {
    out.emplace_back(env);
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back((exe.parent_path() / kShimName).string());
    out.push_back((exe.parent_path().parent_path() / "lib" / "qpool" / kShimName).string());
  }
#ifdef QPOOL_SENTENCEPIECE_SHIM_BUILD_PATH
  out.emplace_back(QPOOL_SENTENCEPIECE_SHIM_BUILD_PATH);
#endif
  return out;
}

StatusOr<Shim> LoadShim() {
  std::string tried;
  for (const std::string& path : ShimCandidates()) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) {
      tried += (tried.empty() ? "" : ", ") + path;
      continue;
    }
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (lib == nullptr) {
      return FailedPrecondition(StrCat(path, ": cannot be loaded: ", dlerror()));
    }
    auto version = reinterpret_cast<decltype(&qpool_spm_version)>(dlsym(lib, "qpool_spm_version"));
    Shim shim;
    shim.load = reinterpret_cast<decltype(shim.load)>(dlsym(lib, "qpool_spm_load"));
    shim.free = reinterpret_cast<decltype(shim.free)>(dlsym(lib, "qpool_spm_free"));
    shim.info = reinterpret_cast<decltype(shim.info)>(dlsym(lib, "qpool_spm_info"));
    shim.encode = reinterpret_cast<decltype(shim.encode)>(dlsym(lib, "qpool_spm_encode"));
    if (version == nullptr || version() != QPOOL_SPM_SHIM_VERSION || !shim.load || !shim.free ||
        !shim.info || !shim.encode) {
      return FailedPrecondition(StrCat(path, ": not a version ", QPOOL_SPM_SHIM_VERSION,
                                       " SentencePiece shim of this qpool"));
    }
    return shim;  // never unloaded: models may live as long as the process
  }
  return FailedPrecondition(
      StrCat("SentencePiece tokenizers need ", kShimName, ", which is in none of: ", tried));
}

// The shim, loaded once per process.
const StatusOr<Shim>& TheShim() {
  static const StatusOr<Shim>* shim = new StatusOr<Shim>(LoadShim());
  return *shim;
}

}  // namespace

StatusOr<SentencePieceTokenizer> SentencePieceTokenizer::Load(const std::string& model_path,
                                                              int max_length) {
  std::error_code ec;
  if (!fs::is_regular_file(model_path, ec)) {
    return NotFound(StrCat(model_path, ": SentencePiece model not found"));
  }
  if (max_length < 2) {
    return InvalidArgument(StrCat(model_path, ": max_length must be >= 2 (got ", max_length, ")"));
  }
  const StatusOr<Shim>& shim = TheShim();
  if (!shim.ok()) return shim.status();
  char error[512] = {0};
  qpool_spm* raw = shim->load(model_path.c_str(), error, sizeof(error));
  if (raw == nullptr) {
    return InvalidArgument(StrCat(model_path, ": not a SentencePiece model: ", error));
  }
  SentencePieceTokenizer t;
  t.model_ = std::shared_ptr<qpool_spm>(raw, shim->free);
  qpool_spm_model_info info{};
  shim->info(raw, &info);
  if (info.eos_id < 0) {
    return InvalidArgument(StrCat(model_path, ": the model has no </s> piece (T5's end of text)"));
  }
  if (info.pad_id < 0) {
    return InvalidArgument(StrCat(model_path, ": the model defines no pad piece (<pad>)"));
  }
  t.eos_id_ = info.eos_id;
  t.pad_id_ = info.pad_id;
  t.unk_id_ = info.unk_id;
  t.vocab_size_ = static_cast<size_t>(info.pieces);
  t.max_length_ = max_length;
  return t;
}

void SentencePieceTokenizer::EncodePieces(const std::string& text,
                                          std::vector<int64_t>* out) const {
  const Shim& shim = *TheShim();  // loaded: Load succeeded
  std::vector<int> ids(text.size() + 8);
  long n = shim.encode(model_.get(), text.data(), text.size(), ids.data(), ids.size());
  if (n > static_cast<long>(ids.size())) {
    ids.resize(n);
    n = shim.encode(model_.get(), text.data(), text.size(), ids.data(), ids.size());
  }
  // Encoding fails only for a model that was not loaded; Load guarantees one.
  if (n > 0) out->insert(out->end(), ids.begin(), ids.begin() + n);
}

int64_t SentencePieceTokenizer::AddedTokenAt(const std::string& text, size_t pos,
                                             size_t* length) const {
  const auto starts = [&](const char* token) {
    *length = std::char_traits<char>::length(token);
    return text.compare(pos, *length, token) == 0;
  };
  if (starts("</s>")) return eos_id_;
  if (starts("<pad>")) return pad_id_;
  if (unk_id_ >= 0 && starts("<unk>")) return unk_id_;
  if (!starts("<extra_id_")) return -1;
  // A sentinel: its number in decimal without leading zeros, below kSentinels.
  constexpr int kSentinels = 100;
  size_t end = pos + *length;
  int n = 0;
  size_t digits = 0;
  while (end < text.size() && text[end] >= '0' && text[end] <= '9' && digits < 3) {
    n = n * 10 + (text[end] - '0');
    ++end;
    ++digits;
  }
  if (digits == 0 || (digits > 1 && text[pos + *length] == '0') || n >= kSentinels ||
      end >= text.size() || text[end] != '>') {
    return -1;
  }
  *length = end + 1 - pos;
  return static_cast<int64_t>(vocab_size_) + kSentinels - 1 - n;
}

std::vector<int64_t> SentencePieceTokenizer::Encode(const std::string& text) const {
  const std::string clean = SanitizeUtf8(text);
  std::vector<int64_t> ids;
  size_t done = 0;  // clean[0, done) is encoded
  for (size_t pos = clean.find('<'); pos != std::string::npos; pos = clean.find('<', pos + 1)) {
    size_t length = 0;
    const int64_t id = AddedTokenAt(clean, pos, &length);
    if (id < 0) continue;
    EncodePieces(clean.substr(done, pos - done), &ids);
    ids.push_back(id);
    done = pos + length;
    pos = done - 1;
  }
  EncodePieces(clean.substr(done), &ids);
  return ids;
}

std::vector<int64_t> SentencePieceTokenizer::EncodePadded(const std::string& text,
                                                          std::vector<int64_t>* mask) const {
  std::vector<int64_t> ids = Encode(text);
  if (ids.size() > static_cast<size_t>(max_length_ - 1)) ids.resize(max_length_ - 1);
  ids.push_back(eos_id_);
  if (mask != nullptr) {
    mask->assign(ids.size(), 1);
    mask->resize(max_length_, 0);
  }
  ids.resize(max_length_, pad_id_);
  return ids;
}

}  // namespace qpool
