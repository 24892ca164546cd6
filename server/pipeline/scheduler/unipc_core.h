// The UniPC update (Note [UniPC]) shared by the DDPM schedulers' "unipc" (UniPcScheduler) and the
// flow-matching one (FlowUniPcScheduler): the same predictor and corrector over any schedule
// that writes the sample as alpha(g) x0 + sigma(g) noise.
#pragma once

#include <torch/types.h>

#include <vector>

namespace qpool {

// Note [UniPC]
// Writing the sample at schedule value g as x = alpha(g) x0 + sigma(g) noise, with the log-SNR
// lambda = log(alpha / sigma), a move from g_s to g_t (h = lambda_t - lambda_s, B = e^-h - 1)
// starts from
//   x_t' = (sigma_t / sigma_s) x_s - alpha_t B m_s,
// m_s the data prediction at g_s. The predictor (UniP) of order 2 subtracts
// alpha_t B / 2 (m_{s'} - m_s) / r, r = (lambda_{s'} - lambda_s) / h, m_{s'} the prediction of
// the step before; order 1 is x_t' itself (at g_t = 0: m_s). Once the model has seen x_t and
// predicted m_t, the corrector (UniC) redoes the move from x_s with
//   x_t = x_t' - alpha_t B (rho_0 (m_{s'} - m_s) / r + rho_1 (m_t - m_s))
// where (rho_0, rho_1) solves [[1, 1], [r, 1]] rho = (b_1, b_2), b_k = k! phi_k / B with
// phi_1 = B / -h - 1, phi_2 = phi_1 / -h - 1/2 (the corrector of a first-order prediction has
// rho_1 = 1/2 and no rho_0), and the next prediction starts from the corrected x_t. The order is
// 1 on the first step and on the last, 2 between: diffusers' UniPCMultistepScheduler with its
// defaults (solver order 2, B(h) = e^-h - 1 ("bh2"), data prediction, the corrector on every
// step). The DDPM schedules (g = sigma of Note [DPM-Solver++ 2M]) have alpha = 1 / sqrt(g^2 + 1)
// and sigma = g alpha; flow matching (g = the flow's sigma, Note [Flow-matching UniPC]) has
// alpha = 1 - g and sigma = g. diffusers computes the coefficients in float32 and we in double.

// What the steps taken so far leave for the next one.
struct UniPcHistory {
  torch::Tensor previous_x0;  // the data prediction of the last step taken
  torch::Tensor older_x0;     // the data prediction of the step before it
  torch::Tensor last_sample;  // the corrected sample the last step predicted from
  int last_order = 0;         // the order of the last step's prediction

  void Clear();
  // Keeps the rows `rows` (dimension 0) of each tensor held.
  void KeepRows(const torch::Tensor& rows);
};

// The schedule in the solver's terms: the sample at schedule value g is
// alpha(g) x0 + sigma(g) noise, and lambda = log(alpha / sigma) (g > 0).
struct UniPcSchedule {
  double (*alpha)(double g);
  double (*sigma)(double g);
};

// Step `i` of `num_steps` on the schedule values `g` (num_steps + 1 of them, the last 0): corrects
// x, the sample the model saw at g[i], with x0, its data prediction there (UniC, from step 1 on),
// then predicts the sample at g[i + 1] (UniP: order 1 on the first and the last step, 2 between;
// x0 itself at g 0). x and x0 are of one floating type; so is the result. Updates `history`.
torch::Tensor UniPcStep(UniPcHistory& history, const std::vector<double>& g,
                        const UniPcSchedule& schedule, int i, int num_steps, torch::Tensor x,
                        const torch::Tensor& x0);

}  // namespace qpool
