#include "util/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

namespace qpool {
namespace {

// The number in `path` (a cgroup limit file), or 0 when absent, "max" or not a number.
uint64_t ReadLimit(const char* path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text.empty() || text.find_first_not_of("0123456789") != std::string::npos) {
    return 0;
  }
  try {
    return std::stoull(text);
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

uint64_t HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  uint64_t bytes = pages > 0 && page_size > 0
                       ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size)
                       : 0;
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const uint64_t limit = ReadLimit(path);
    if (limit > 0 && (bytes == 0 || limit < bytes)) bytes = limit;
  }
  return bytes;
}

}  // namespace qpool
