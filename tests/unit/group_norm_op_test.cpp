// qpool::group_norm on the CPU (Note [Group norm op]): the schema the exporter traces, values
// against a float64 group norm, the addition before the norm and the SiLU after it, the memory
// format kept, and errors that name the argument.
#include "quant/group_norm_op.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "testing/c10_error.h"
#include "testing/group_norm_reference.h"
#include "testing/op_schemas.h"

namespace qpool::quant {
namespace {

using testing::ErrorOf;

// The largest difference allowed, relative to the reference's largest magnitude. In fp16 and
// bf16 the unfused operations round the standard deviation, scale and shift to x's dtype.
double Tolerance(at::ScalarType type) {
  switch (type) {
    case at::kDouble:
      return 1e-12;
    case at::kFloat:
      return 1e-6;
    case at::kHalf:
      return 5e-3;
    default:
      return 3.2e-2;
  }
}

double MaxAbs(const at::Tensor& t) { return t.abs().max().item<double>(); }

TEST(GroupNormOp, SchemaMatchesTheExporter) {
  EXPECT_EQ(testing::RegisteredSchema("qpool::group_norm"),
            std::string("qpool::") + kGroupNormSchema);
  EXPECT_EQ(testing::ExporterSchema("GROUP_NORM_SCHEMA", "blocks.py"), kGroupNormSchema);
}

TEST(GroupNormOp, Values) {
  torch::manual_seed(31);
  struct Shape {
    int64_t n, c, h, w, groups;
  };
  // Two channels per group, then twelve in a smaller image.
  for (const Shape& sh : {Shape{2, 64, 5, 7, 32}, Shape{1, 48, 3, 4, 4}}) {
    const at::Tensor x64 = at::randn({sh.n, sh.c, sh.h, sh.w}, at::kDouble) * 3 + 1;
    const at::Tensor w64 = at::randn({sh.c}, at::kDouble), b64 = at::randn({sh.c}, at::kDouble);
    const at::Tensor add64 = at::randn({sh.n, sh.c}, at::kDouble) * 2;
    for (at::ScalarType type : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16}) {
      for (at::MemoryFormat format :
           {at::MemoryFormat::Contiguous, at::MemoryFormat::ChannelsLast}) {
        const at::Tensor x = x64.to(type).contiguous(format);
        const at::Tensor weight = w64.to(type), bias = b64.to(type);
        for (bool with_add : {false, true}) {
          const std::optional<at::Tensor> add =
              with_add ? std::optional<at::Tensor>(add64.to(type)) : std::nullopt;
          for (bool silu : {false, true}) {
            const std::string what = std::string(c10::toString(type)) + " c " +
                                     std::to_string(sh.c) + " " + c10::toString(format) +
                                     (with_add ? " add" : "") + (silu ? " silu" : "");
            const at::Tensor got = GroupNorm(x, weight, bias, sh.groups, 1e-5, add, silu);
            ASSERT_EQ(got.sizes(), x.sizes()) << what;
            EXPECT_EQ(got.scalar_type(), type) << what;
            EXPECT_TRUE(got.is_contiguous(format)) << what << ": strides " << got.strides();
            const at::Tensor ref =
                testing::GroupNormFloat64(x, weight, bias, sh.groups, 1e-5, add, silu);
            const double diff = MaxAbs(got.to(at::kDouble) - ref);
            EXPECT_LE(diff, Tolerance(type) * MaxAbs(ref)) << what;
          }
        }
      }
    }
  }
}

TEST(GroupNormOp, AddsBeforeTheNorm) {
  torch::manual_seed(32);
  const at::Tensor x =
      (at::randn({2, 16, 4, 4}) * 3 + 1).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor weight = at::randn({16}), bias = at::randn({16});
  // A different value for each channel moves the channels of a group apart: a new norm.
  const at::Tensor add = at::arange(32, at::kFloat).reshape({2, 16}) * 0.5;
  const at::Tensor got = GroupNorm(x, weight, bias, 4, 1e-5, add, false);
  const at::Tensor without = GroupNorm(x, weight, bias, 4, 1e-5, std::nullopt, false);
  EXPECT_FALSE(at::allclose(got, without, 1e-3, 1e-3));
  const at::Tensor added = x + add.unsqueeze(-1).unsqueeze(-1);
  EXPECT_TRUE(
      at::allclose(got, GroupNorm(added, weight, bias, 4, 1e-5, std::nullopt, false), 1e-6, 1e-6))
      << "max difference "
      << (got - GroupNorm(added, weight, bias, 4, 1e-5, std::nullopt, false)).abs().max();
  // One value for every channel moves whole groups: the norm takes it out again, where an
  // addition after the norm would not.
  const at::Tensor constant = at::full({2, 16}, 5.0);
  EXPECT_TRUE(
      at::allclose(GroupNorm(x, weight, bias, 4, 1e-5, constant, false), without, 1e-4, 1e-4));
}

TEST(GroupNormOp, AppliesTheSiluAfterTheNorm) {
  torch::manual_seed(33);
  const at::Tensor x = at::randn({2, 32, 6, 5}) * 2 - 1;
  const at::Tensor weight = at::randn({32}), bias = at::randn({32});
  const at::Tensor add = at::randn({2, 32});
  const at::Tensor plain = GroupNorm(x, weight, bias, 8, 1e-6, add, false);
  const at::Tensor got = GroupNorm(x, weight, bias, 8, 1e-6, add, true);
  EXPECT_FALSE(at::allclose(got, plain, 1e-3, 1e-3));
  EXPECT_TRUE(at::allclose(got, at::silu(plain), 1e-6, 1e-6))
      << "max difference " << (got - at::silu(plain)).abs().max();
}

TEST(GroupNormOp, BadArgumentsAreNamed) {
  const at::Tensor x = at::zeros({2, 8, 3, 3}), v = at::zeros({8}), add = at::zeros({2, 8});
  const auto error_of = [&](const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                            int64_t groups, double eps, const std::optional<at::Tensor>& add) {
    return ErrorOf([&] { GroupNorm(x, weight, bias, groups, eps, add, true); });
  };
  EXPECT_NE(error_of(at::zeros({2, 8, 9}), v, v, 4, 1e-5, add).find("x must be [N, C, H, W]"),
            std::string::npos);
  EXPECT_NE(error_of(x, v, v, 3, 1e-5, add).find("groups (3)"), std::string::npos);
  EXPECT_NE(error_of(x, v, v, 3, 1e-5, add).find("divide"), std::string::npos);
  EXPECT_NE(error_of(x, v, v, 0, 1e-5, add).find("groups (0)"), std::string::npos);
  EXPECT_NE(error_of(x, v, v, -2, 1e-5, add).find("groups (-2)"), std::string::npos);
  EXPECT_NE(error_of(x, at::zeros({4}), v, 4, 1e-5, add).find("weight must be [8]"),
            std::string::npos);
  EXPECT_NE(error_of(x, v, at::zeros({2, 4}), 4, 1e-5, add).find("bias must be [8]"),
            std::string::npos);
  EXPECT_NE(error_of(x, v, v, 4, 1e-5, at::zeros({8})).find("add must be [2, 8]"),
            std::string::npos);
  EXPECT_NE(error_of(x, v, v, 4, 1e-5, at::zeros({1, 8})).find("add must be [2, 8]"),
            std::string::npos);
  EXPECT_NE(error_of(x, v.to(at::kHalf), v, 4, 1e-5, add).find("weight is Half"),
            std::string::npos);
  EXPECT_NE(error_of(x, v, v, 4, 1e-5, add.to(at::kDouble)).find("add is Double"),
            std::string::npos);
  EXPECT_NE(error_of(x, v, v, 4, -1e-5, add).find("eps must be >= 0"), std::string::npos);
  EXPECT_NE(error_of(x.to(at::kInt), v.to(at::kInt), v.to(at::kInt), 4, 1e-5, add.to(at::kInt))
                .find("x must be floating-point"),
            std::string::npos);
}

TEST(GroupNormOp, MetaGivesTheOutputShape) {
  const at::TensorOptions meta = at::TensorOptions().device(at::kMeta).dtype(at::kHalf);
  const at::Tensor x = at::empty({8, 320, 16, 16}, meta).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor got = GroupNorm(x, at::empty({320}, meta), at::empty({320}, meta), 32, 1e-5,
                                   at::empty({8, 320}, meta), true);
  EXPECT_EQ(got.sizes(), (std::vector<int64_t>{8, 320, 16, 16}));
  EXPECT_EQ(got.scalar_type(), at::kHalf);
  EXPECT_TRUE(got.is_meta());
  EXPECT_TRUE(got.is_contiguous(at::MemoryFormat::ChannelsLast));
}

}  // namespace
}  // namespace qpool::quant
