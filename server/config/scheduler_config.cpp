#include "config/scheduler_config.h"

namespace qpool {

const std::vector<std::string>& SamplerNames(ScheduleFamily family) {
  static const std::vector<std::string> kDdpm = {"ddim",
                                                 "euler",
                                                 "euler_a",
                                                 "dpmpp_2m",
                                                 "dpmpp_2m_karras",
                                                 "dpmpp_2m_sde",
                                                 "dpmpp_2m_sde_karras",
                                                 "unipc",
                                                 "unipc_karras"};
  static const std::vector<std::string> kFlowMatch = {"euler", "unipc"};
  return family == ScheduleFamily::kFlowMatch ? kFlowMatch : kDdpm;
}

}  // namespace qpool
