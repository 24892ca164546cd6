#include "util/file_digest.h"

#include <openssl/evp.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "util/log.h"

namespace qpool {
namespace {

using Identity = std::tuple<dev_t, ino_t, off_t, int64_t, int64_t>;  // dev, inode, size, mtime

struct Cache {
  std::mutex mu;
  std::map<std::string, std::pair<Identity, std::string>> digests;  // by path
};

Cache& TheCache() {
  static Cache* cache = new Cache();  // never destroyed: loads may run during exit
  return *cache;
}

StatusOr<Identity> IdentityOf(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    return NotFound(StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  return Identity{st.st_dev, st.st_ino, st.st_size, static_cast<int64_t>(st.st_mtim.tv_sec),
                  static_cast<int64_t>(st.st_mtim.tv_nsec)};
}

}  // namespace

bool IsSha256Hex(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

StatusOr<std::string> Sha256File(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) return NotFound(StrCat("cannot read ", path, ": ", std::strerror(errno)));
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return Internal("SHA-256 is not available");
  }
  std::vector<unsigned char> buffer(size_t{4} << 20);
  for (;;) {
    const size_t n = std::fread(buffer.data(), 1, buffer.size(), file.get());
    if (n > 0 && EVP_DigestUpdate(ctx.get(), buffer.data(), n) != 1) {
      return Internal(StrCat("hashing ", path, " failed"));
    }
    if (n < buffer.size()) break;
  }
  if (std::ferror(file.get())) {
    return Internal(StrCat("reading ", path, " failed: ", std::strerror(errno)));
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_DigestFinal_ex(ctx.get(), digest, &size) != 1) {
    return Internal(StrCat("hashing ", path, " failed"));
  }
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < size; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 15]);
  }
  return hex;
}

StatusOr<std::string> CachedSha256File(const std::string& path) {
  ASSIGN_OR_RETURN(Identity before, IdentityOf(path));
  Cache& cache = TheCache();
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.digests.find(path);
    if (it != cache.digests.end() && it->second.first == before) return it->second.second;
  }
  ASSIGN_OR_RETURN(std::string digest, Sha256File(path));
  // Remembered only if the file did not change while it was read.
  ASSIGN_OR_RETURN(Identity after, IdentityOf(path));
  if (after == before) {
    std::lock_guard<std::mutex> lock(cache.mu);
    cache.digests[path] = {after, digest};
  }
  return digest;
}

}  // namespace qpool
