#include "component/attention_backend.h"

#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <mutex>

#include "util/log.h"

namespace qpool {
namespace {

struct Named {
  const char* name;
  at::SDPBackend backend;
};

// Every backend ATen knows, by the name `--attention` and the logs use; the last one cannot be
// asked for (it is a third-party kernel registered at run time).
const Named kBackends[] = {
    {"flash", at::SDPBackend::flash_attention},
    {"efficient", at::SDPBackend::efficient_attention},
    {"math", at::SDPBackend::math},
    {"cudnn", at::SDPBackend::cudnn_attention},
    {"overrideable", at::SDPBackend::overrideable},
};
constexpr size_t kSelectable = 4;

}  // namespace

StatusOr<std::vector<int64_t>> AttentionPriority(const std::string& name,
                                                 const std::vector<int64_t>& current) {
  if (name == "auto") return current;
  const Named* named = std::find_if(kBackends, kBackends + kSelectable,
                                    [&](const Named& n) { return name == n.name; });
  if (named == kBackends + kSelectable) {
    return InvalidArgument(
        StrCat("unknown attention backend '", name, "' (auto, flash, cudnn, efficient or math)"));
  }
  const int64_t wanted = static_cast<int64_t>(named->backend);
  const auto at = std::find(current.begin(), current.end(), wanted);
  if (at == current.end()) {
    return InvalidArgument(StrCat("attention backend '", name, "' is not in ATen's order (",
                                  DescribeAttentionPriority(current), ")"));
  }
  std::vector<int64_t> order = {wanted};
  order.insert(order.end(), current.begin(), at);
  order.insert(order.end(), at + 1, current.end());
  return order;
}

std::string DescribeAttentionPriority(const std::vector<int64_t>& order) {
  std::string out;
  for (int64_t b : order) {
    const auto* named =
        std::find_if(std::begin(kBackends), std::end(kBackends),
                     [&](const Named& n) { return static_cast<int64_t>(n.backend) == b; });
    if (!out.empty()) out += ", ";
    out += named != std::end(kBackends) ? named->name : "backend " + std::to_string(b);
  }
  return out;
}

std::string CompiledAttentionMismatch(const std::string& package,
                                      const std::vector<int64_t>& server) {
  const std::string ours = DescribeAttentionPriority(server);
  if (package == ours) return "";
  if (package.empty()) {
    return StrCat(
        "the package records no attention order (exported before qpool_export recorded "
        "it), so its attention kernel may not be the one the server runs (",
        ours, "); re-export it");
  }
  return StrCat("its attention kernels were chosen under the order ", package, ", the server runs ",
                ours, " (--attention); re-export it with the matching --compile-attention");
}

std::vector<int64_t> CurrentAttentionPriority() {
  std::vector<int64_t> order;
  for (at::SDPBackend b : at::globalContext().sDPPriorityOrder()) {
    order.push_back(static_cast<int64_t>(b));
  }
  return order;
}

void SettleAttentionOrder(int cuda_device) {
  static std::once_flag once;
  std::call_once(once, [cuda_device] {
    const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(cuda_device));
    const c10::DeviceGuard guard(device);
    const at::Tensor q =
        at::zeros({1, 1, 1, 64}, at::TensorOptions().device(device).dtype(at::kHalf));
    (void)at::_fused_sdp_choice(q, q, q);
  });
}

StatusOr<std::vector<int64_t>> ApplyAttentionBackend(const std::string& name, int cuda_device) {
  // A bad name is refused before any device is touched.
  RETURN_IF_ERROR(AttentionPriority(name, CurrentAttentionPriority()).status());
  if (cuda_device >= 0) SettleAttentionOrder(cuda_device);
  ASSIGN_OR_RETURN(std::vector<int64_t> order, AttentionPriority(name, CurrentAttentionPriority()));
  at::globalContext().setSDPPriorityOrder(order);
  return order;
}

}  // namespace qpool
