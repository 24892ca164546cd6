#include "config/offload_policy.h"

#include "util/log.h"

namespace qpool {

StatusOr<OffloadPolicy> MakeOffloadPolicy(const std::string& name, double idle_seconds,
                                          const StreamSettings& stream) {
  OffloadPolicy policy;
  if (name == "none") {
    policy.mode = OffloadMode::kNone;
  } else if (name == "model") {
    policy.mode = OffloadMode::kModel;
  } else if (name == "idle") {
    policy.mode = OffloadMode::kIdle;
    if (!(idle_seconds > 0) || idle_seconds > kMaxIdleSeconds) {
      return InvalidArgument(StrCat("idle_seconds must be in (0, 604800] for the idle policy (got ",
                                    idle_seconds, ")"));
    }
    policy.idle_seconds = idle_seconds;
  } else if (name == "sequential") {
    policy.mode = OffloadMode::kSequential;
    if (!(stream.group_mib >= 0) || stream.group_mib > kMaxGroupMib) {
      return InvalidArgument(
          StrCat("group_mib must be in [0, ", kMaxGroupMib, "] (got ", stream.group_mib, ")"));
    }
    if (stream.prefetch < 0 || stream.prefetch > kMaxPrefetch) {
      return InvalidArgument(
          StrCat("prefetch must be in [0, ", kMaxPrefetch, "] (got ", stream.prefetch, ")"));
    }
    if (!(stream.resident_mib >= 0) || stream.resident_mib > kMaxResidentMib) {
      return InvalidArgument(StrCat("resident_mib must be in [0, ", kMaxResidentMib, "] (got ",
                                    stream.resident_mib, ")"));
    }
    policy.stream = stream;
  } else if (name == "group") {
    return InvalidArgument(
        "offload policy 'group': use 'sequential', whose group_mib sets the size of the groups "
        "streamed together");
  } else {
    return InvalidArgument(
        StrCat("unknown offload policy '", name, "'; valid: none, model, idle, sequential"));
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
    case OffloadMode::kSequential:
      return "sequential";
  }
  return "unknown";
}

}  // namespace qpool
