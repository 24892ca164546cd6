// qpool::grouped_quant_linear on CUDA (Note [Grouped linear op]): each group's rows times its
// weight dequantized on the GPU, on every format, at a HiDream-I1 routed expert's width and at a
// small one; an empty group; and inside a CUDA graph, whose replay follows new group ends (they
// are never read on the host).
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "quant/grouped_linear_op.h"
#include "quant/quant_linear_cuda.h"
#include "testing/cuda_graph_replay.h"
#include "testing/quant_states.h"

namespace qpool::quant {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "CUDA is not available; GPU test skipped"

QuantState ToCuda(const QuantState& s) {
  auto c = [](const at::Tensor& t) { return t.to(at::kCUDA); };
  return QuantState{c(s.weight),        c(s.absmax),      c(s.code),
                    c(s.nested_absmax), c(s.nested_code), c(s.offset)};
}

at::Tensor Offs(const std::vector<int>& ends) {
  return at::tensor(ends, at::TensorOptions().dtype(at::kInt)).to(at::kCUDA);
}

// Group g's rows of x times its [n, k] slice of the dequantized layer, each group on its own.
at::Tensor PerGroup(const at::Tensor& x, const at::Tensor& w, const std::vector<int>& ends) {
  const int64_t n = w.size(0) / static_cast<int64_t>(ends.size());
  std::vector<at::Tensor> parts;
  int start = 0;
  for (size_t g = 0; g < ends.size(); ++g) {
    parts.push_back(at::matmul(x.slice(0, start, ends[g]), w.slice(0, g * n, (g + 1) * n).t()));
    start = ends[g];
  }
  return at::cat(parts);
}

TEST(GroupedQuantLinearCuda, EachGroupTimesItsDequantizedWeightOnEveryFormat) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(53);
  struct Shape {
    int64_t groups, n, k;
    std::vector<int> ends;
  };
  // HiDream-I1's w2 (4 experts of 2560 x 6912), then small widths with an empty group.
  for (const Shape& sh :
       {Shape{4, 2560, 6912, {700, 1100, 1800, 2048}}, Shape{3, 32, 64, {5, 5, 12}}}) {
    const at::Tensor w = at::randn({sh.groups * sh.n, sh.k}) * 0.02;
    for (const auto& [name, cpu_state] : testing::EveryFormat(w)) {
      const QuantState s = ToCuda(cpu_state);
      const at::Tensor x = at::randn({sh.ends.back(), sh.k}, at::kCUDA).to(at::kBFloat16);
      const at::Tensor got = GroupedQuantLinear(x, Offs(sh.ends), s);
      const at::Tensor want = PerGroup(x, DequantizeCuda(s, sh.k, at::kBFloat16), sh.ends);
      ASSERT_EQ(got.sizes(), want.sizes()) << name;
      const double diff = (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>();
      const double scale = want.to(at::kFloat).abs().max().item<double>();
      // The same bfloat16 operands; the grouped kernel may sum in another order.
      EXPECT_LE(diff, 1e-2 * scale) << name << " k=" << sh.k << ": " << diff << " of " << scale;
    }
  }
}

TEST(GroupedQuantLinearCuda, CapturedGraphFollowsNewGroupEnds) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(54);
  const int64_t groups = 4, n = 256, k = 512, rows = 96;
  const QuantState s = ToCuda(*QuantizeNf4(at::randn({groups * n, k}) * 0.05, 64, true));
  const at::Tensor x = at::randn({rows, k}, at::kCUDA).to(at::kBFloat16);
  const at::Tensor offs = Offs({24, 48, 72, 96});
  const std::vector<int> changed = {0, 10, 90, 96};  // group 0 empty, group 2 most rows
  const at::Tensor replayed =
      testing::ReplayedAfterChange([&] { return GroupedQuantLinear(x, offs, s); },
                                   [&] {
                                     offs.copy_(Offs(changed));
                                     x.copy_(at::randn_like(x));
                                   });
  const at::Tensor want = PerGroup(x, DequantizeCuda(s, k, at::kBFloat16), changed);
  const double diff = (replayed.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>();
  EXPECT_LE(diff, 1e-2 * want.to(at::kFloat).abs().max().item<double>()) << diff;
}

}  // namespace
}  // namespace qpool::quant
