#include "pool/eviction.h"

#include <algorithm>
#include <tuple>

#include "pool/router.h"
#include "util/log.h"

namespace qpool {

StatusOr<std::vector<EvictionCandidate>> PlanEviction(std::vector<EvictionCandidate> candidates,
                                                      uint64_t needed) {
  std::vector<EvictionCandidate> plan;
  if (needed == 0) return plan;
  candidates.erase(std::remove_if(candidates.begin(), candidates.end(),
                                  [](const EvictionCandidate& c) { return !c.idle; }),
                   candidates.end());
  std::sort(candidates.begin(), candidates.end(),
            [](const EvictionCandidate& a, const EvictionCandidate& b) {
              return std::tie(a.last_used_ns, a.pipeline, a.replica) <
                     std::tie(b.last_used_ns, b.pipeline, b.replica);
            });
  uint64_t freed = 0;
  for (auto& c : candidates) {
    if (freed >= needed) break;
    freed += c.bytes;
    plan.push_back(std::move(c));
  }
  if (freed < needed) {
    return ResourceExhausted(StrCat("needs ", FormatBytes(needed), " more; idle pipelines hold ",
                                    FormatBytes(freed)));
  }
  return plan;
}

}  // namespace qpool
