// qpool::cat_gelu on the CPU (Note [Joined GELU op]): the schema the exporter traces, the unfused
// operations' values, and errors that name the argument.
#include "quant/cat_gelu_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <sstream>
#include <string>

#include "testing/c10_error.h"
#include "testing/test_paths.h"

namespace qpool::quant {
namespace {

using testing::ErrorOf;

TEST(CatGeluOp, SchemaMatchesTheExporter) {
  std::ostringstream printed;
  printed << c10::Dispatcher::singleton().findSchemaOrThrow("qpool::cat_gelu", "").schema();
  EXPECT_EQ(printed.str(), std::string("qpool::") + kCatGeluSchema);
  const std::string path =
      testing::SourceDir() + "/tools/qpool_export/qpool_export/flux_transformer.py";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path;
  std::string line, python;
  while (std::getline(in, line)) {
    if (line.rfind("CAT_GELU_SCHEMA = \"", 0) == 0) {
      const size_t start = line.find('"') + 1;
      python = line.substr(start, line.find('"', start) - start);
    }
  }
  EXPECT_EQ(python, kCatGeluSchema) << "CAT_GELU_SCHEMA in " << path;
}

TEST(CatGeluOp, JoinsAWithTheGeluOfB) {
  torch::manual_seed(23);
  for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const at::Tensor a = at::randn({2, 3, 5}).to(type);
    // b as a view of a wider projection's output, as the MLP branch is of the fused one.
    const at::Tensor b = at::randn({2, 3, 19}).to(type).slice(2, 7);
    const at::Tensor got = CatGelu(a, b);
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2, 3, 17}));
    EXPECT_TRUE(at::equal(got.slice(2, 0, 5), a)) << type;
    EXPECT_TRUE(at::equal(got.slice(2, 5), at::gelu(b, "tanh"))) << type;
  }
  // The tanh approximation: gelu(0) = 0, gelu(x) -> x for large x, -> 0 for very negative x.
  const at::Tensor b = at::tensor({0.f, 10.f, -10.f});
  const at::Tensor got = CatGelu(at::zeros({0}), b);
  EXPECT_EQ(got[0].item<float>(), 0.f);
  EXPECT_NEAR(got[1].item<float>(), 10.f, 1e-5);
  EXPECT_NEAR(got[2].item<float>(), 0.f, 1e-5);
}

TEST(CatGeluOp, BadArgumentsAreNamed) {
  const at::Tensor a = at::zeros({2, 3, 4});
  EXPECT_NE(ErrorOf([&] {
              CatGelu(a, at::zeros({2, 4, 4}));
            }).find("only the last dimension"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              CatGelu(a, at::zeros({2, 3, 4}, at::kHalf));
            }).find("a is Float, b Half"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { CatGelu(a.to(at::kInt), a); }).find("a must be float32"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { CatGelu(a, at::zeros({}, at::kFloat)); }).find("b must have at least"),
            std::string::npos);
}

}  // namespace
}  // namespace qpool::quant
