// qpool::upsample_nearest on the CPU (Note [Upsample op]): the schema the exporter traces, ATen's
// nearest upsampling to twice the size or to another map's, the layout kept, and errors that name
// the problem.
#include "quant/upsample_op.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "testing/c10_error.h"
#include "testing/op_schemas.h"

namespace qpool::quant {
namespace {

using testing::ErrorOf;

TEST(UpsampleOp, SchemaMatchesTheExporter) {
  EXPECT_EQ(testing::RegisteredSchema("qpool::upsample_nearest"),
            std::string("qpool::") + kUpsampleSchema);
  EXPECT_EQ(testing::ExporterSchema("UPSAMPLE_SCHEMA", "blocks.py"), kUpsampleSchema);
}

TEST(UpsampleOp, CopiesEachPixelToATwoByTwoBlockInTheInputsLayout) {
  // Pixel (y, x) of channel c holds 100 c + 10 y + x.
  const at::Tensor x = (at::arange(2).view({1, 2, 1, 1}) * 100 +
                        at::arange(3).view({1, 1, 3, 1}) * 10 + at::arange(4).view({1, 1, 1, 4}))
                           .to(at::kFloat);
  for (at::MemoryFormat format : {at::MemoryFormat::Contiguous, at::MemoryFormat::ChannelsLast}) {
    const at::Tensor got = UpsampleNearest(x.contiguous(format), std::nullopt);
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{1, 2, 6, 8}));
    EXPECT_TRUE(got.is_contiguous(format));
    for (int64_t c = 0; c < 2; ++c) {
      for (int64_t y = 0; y < 6; ++y) {
        for (int64_t col = 0; col < 8; ++col) {
          EXPECT_EQ(got[0][c][y][col].item<float>(), 100 * c + 10 * (y / 2) + col / 2)
              << c << " " << y << " " << col;
        }
      }
    }
  }
  // Every dtype, as ATen's upsampling.
  for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble}) {
    const at::Tensor t = at::randn({2, 5, 3, 4}).to(type);
    EXPECT_TRUE(at::equal(UpsampleNearest(t, std::nullopt), at::upsample_nearest2d(t, {6, 8})))
        << type;
  }
}

TEST(UpsampleOp, ResizesToTheSizeOfLike) {
  // A UNet's skip connection one less than twice the size (an odd size on the way down).
  const at::Tensor x = at::randn({2, 3, 4, 5}).contiguous(at::MemoryFormat::ChannelsLast);
  for (const std::vector<int64_t>& size : {std::vector<int64_t>{7, 9}, {8, 10}, {4, 5}}) {
    const at::Tensor like = at::empty({2, 6, size[0], size[1]});
    const at::Tensor got = UpsampleNearest(x, like);
    EXPECT_TRUE(at::equal(got, at::upsample_nearest2d(x, size))) << size[0] << "x" << size[1];
    EXPECT_TRUE(got.is_contiguous(at::MemoryFormat::ChannelsLast));
  }
}

TEST(UpsampleOp, BadArgumentsAreNamed) {
  EXPECT_NE(ErrorOf([] {
              UpsampleNearest(at::zeros({2, 4, 3}), std::nullopt);
            }).find("x is [2, 4, 3], not [N, C, H, W]"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] {
              UpsampleNearest(at::zeros({1, 1, 2, 2}, at::kInt), std::nullopt);
            }).find("x must be floating-point"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] {
              UpsampleNearest(at::zeros({1, 1, 2, 2}), at::zeros({1, 1, 0, 4}));
            }).find("like is [1, 1, 0, 4]"),
            std::string::npos);
}

TEST(UpsampleOp, MetaGivesTheOutputShapeAndLayout) {
  const auto meta = at::TensorOptions().device(at::kMeta);
  const at::Tensor x = at::empty({4, 8, 5, 6}, meta).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor doubled = UpsampleNearest(x, std::nullopt);
  EXPECT_EQ(doubled.sizes(), (std::vector<int64_t>{4, 8, 10, 12}));
  EXPECT_TRUE(doubled.is_contiguous(at::MemoryFormat::ChannelsLast));
  const at::Tensor resized = UpsampleNearest(x, at::empty({4, 16, 9, 11}, meta));
  EXPECT_EQ(resized.sizes(), (std::vector<int64_t>{4, 8, 9, 11}));
}

}  // namespace
}  // namespace qpool::quant
