#include "residency/offload_policy.h"

#include "util/log.h"

namespace qpool {

StatusOr<OffloadPolicy> MakeOffloadPolicy(const std::string& name, double idle_seconds) {
  OffloadPolicy policy;
  if (name == "none") {
    policy.mode = OffloadMode::kNone;
  } else if (name == "model") {
    policy.mode = OffloadMode::kModel;
  } else if (name == "idle") {
    policy.mode = OffloadMode::kIdle;
    if (!(idle_seconds > 0) || idle_seconds > 7 * 24 * 3600) {
      return InvalidArgument(StrCat("idle_seconds must be in (0, 604800] for the idle policy (got ",
                                    idle_seconds, ")"));
    }
    policy.idle_seconds = idle_seconds;
  } else if (name == "sequential" || name == "group") {
    return InvalidArgument(StrCat("offload policy '", name,
                                  "' (layer-wise streaming) is not supported yet; use none, model "
                                  "or idle"));
  } else {
    return InvalidArgument(StrCat("unknown offload policy '", name, "'; valid: none, model, idle"));
  }
  return policy;
}

const char* OffloadModeName(OffloadMode mode) {
  switch (mode) {
    case OffloadMode::kNone:
      return "none";
    case OffloadMode::kModel:
      return "model";
    case OffloadMode::kIdle:
      return "idle";
  }
  return "unknown";
}

}  // namespace qpool
