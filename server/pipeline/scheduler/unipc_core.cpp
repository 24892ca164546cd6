#include "pipeline/scheduler/unipc_core.h"

#include <algorithm>
#include <cmath>

namespace qpool {

void UniPcHistory::Clear() {
  previous_x0 = older_x0 = last_sample = torch::Tensor();
  last_order = 0;
}

void UniPcHistory::KeepRows(const torch::Tensor& rows) {
  for (torch::Tensor* t : {&previous_x0, &older_x0, &last_sample}) {
    if (t->defined()) *t = t->index_select(0, rows.to(t->device()));
  }
}

torch::Tensor UniPcStep(UniPcHistory& history, const std::vector<double>& g,
                        const UniPcSchedule& schedule, int i, int num_steps, torch::Tensor x,
                        const torch::Tensor& x0) {
  const auto alpha = schedule.alpha;
  const auto sigma = schedule.sigma;
  auto lambda = [&](double v) { return std::log(alpha(v)) - std::log(sigma(v)); };
  if (i > 0 && history.last_sample.defined() && g[i - 1] != g[i]) {  // UniC
    const double s0 = g[i - 1], st = g[i];
    const double h = lambda(st) - lambda(s0);
    const double b = std::expm1(-h);
    torch::Tensor corr = (x0 - history.previous_x0) * 0.5;
    if (history.last_order == 2 && history.older_x0.defined() && g[i - 2] != s0) {
      const double r = (lambda(g[i - 2]) - lambda(s0)) / h;
      double phi = b / -h - 1.0;
      const double b1 = phi / b;
      phi = phi / -h - 0.5;
      const double b2 = 2.0 * phi / b;
      const double rho0 = (b1 - b2) / (1.0 - r);
      const double rho1 = b1 - rho0;
      corr =
          (history.older_x0 - history.previous_x0) * (rho0 / r) + (x0 - history.previous_x0) * rho1;
    }
    x = history.last_sample.mul(sigma(st) / sigma(s0))
            .sub_(history.previous_x0, alpha(st) * b)
            .sub_(corr, alpha(st) * b);
  }
  history.older_x0 = history.previous_x0;
  history.previous_x0 = x0;
  const int order = std::min({2, num_steps - i, std::min(i, 2) + 1});
  history.last_order = order;
  history.last_sample = x;
  const double s = g[i], t = g[i + 1];
  if (t == 0.0) return x0;
  const double h = lambda(t) - lambda(s);
  const double b = std::expm1(-h);
  torch::Tensor prev = x.mul(sigma(t) / sigma(s)).sub_(x0, alpha(t) * b);
  if (order == 2 && g[i - 1] != s) {  // UniP, rho = 1/2
    const double r = (lambda(g[i - 1]) - lambda(s)) / h;
    prev.sub_(history.older_x0 - x0, alpha(t) * b * 0.5 / r);
  }
  return prev;
}

}  // namespace qpool
