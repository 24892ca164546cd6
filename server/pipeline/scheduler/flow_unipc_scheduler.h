// FlowUniPcScheduler: UniPC on flow matching's sigmas, as diffusers' UniPCMultistepScheduler with
// use_flow_sigmas and flow_prediction (HiDream-I1 Full's scheduler); MakeFlowSampler, the
// flow-matching samplers by name.
#pragma once

#include <memory>
#include <string>

#include "pipeline/scheduler/flow_match_scheduler.h"
#include "pipeline/scheduler/unipc_core.h"
#include "util/status.h"

namespace qpool {

// Note [Flow-matching UniPC]
// The sample is x = (1 - s) x0 + s noise and the model predicts the velocity v = noise - x0, so
// the data prediction is x0 = x - s v, and UniPC (Note [UniPC]) runs with alpha = 1 - s and
// sigma = s. Sigmas: the scheduler's own linspace(1, 1/num_train_timesteps, n + 1) without its
// last value, whatever the FlowSigmas (FluxPipeline hands a flow-sigma scheduler none, as
// HiDreamImagePipeline does), shifted once (FlowShiftConfig: the static shift is the config's
// flow_shift, the dynamic one FluxPipeline's mu for the image); a first sigma within 1e-6 of 1
// becomes 1 - 1e-6 (alpha 0 has no log), and a final 0 follows. The timesteps are
// sigma * num_train_timesteps truncated to integers, as diffusers stores them: the denoiser gets
// them (timestep(i) gives them in sigma units, divided by num_train_timesteps again), while the
// solver steps on the sigmas (float32 values, as diffusers keeps them). Step must see the steps
// of a denoising loop in order.
class FlowUniPcScheduler final : public FlowSampler {
 public:
  FlowUniPcScheduler(FlowShiftConfig config, FlowSigmas sigmas, int num_train_timesteps)
      : FlowSampler(std::move(config), sigmas, num_train_timesteps) {}

  std::string name() const override { return "unipc"; }
  Status SetTimesteps(int num_steps, int64_t image_seq_len) override;
  // The integer timestep / num_train_timesteps.
  double timestep(int step_index) const override;
  // Throws c10::Error unless step_index is 0 or follows the last step taken.
  torch::Tensor Step(const torch::Tensor& velocity, int step_index,
                     const torch::Tensor& sample) override;
  void KeepRows(const torch::Tensor& rows) override { history_.KeepRows(rows); }

 private:
  std::vector<double> timesteps_;  // integer-valued, one per step
  UniPcHistory history_;
  int next_step_ = 0;
};

// The flow-matching sampler `name` ("euler" or "unipc"); InvalidArgument naming the valid ones
// for any other.
StatusOr<std::unique_ptr<FlowSampler>> MakeFlowSampler(const std::string& name,
                                                       const FlowShiftConfig& config,
                                                       FlowSigmas sigmas, int num_train_timesteps);

}  // namespace qpool
