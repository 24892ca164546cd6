// An Encode reply past --max-message-mb: RESOURCE_EXHAUSTED saying how large it is and what to
// change (an LLM encoder's every-layer states are 64 MiB a prompt at HiDream-I1's size).
#include <gtest/gtest.h>

#include "api/encode_reactor.h"

namespace qpool::api {
namespace {

constexpr int kLimit = 64 << 20;

TEST(CheckReplySizeTest, AReplyWithinTheLimitPasses) {
  EXPECT_TRUE(CheckReplySize(0, 1, kLimit).ok());
  EXPECT_TRUE(CheckReplySize(kLimit, 16, kLimit).ok());
}

TEST(CheckReplySizeTest, ALargerReplySaysItsSizeAndTheFlag) {
  // Two prompts of HiDream-I1's Llama states: 32 layers x 128 tokens x 4096 float32 each.
  const size_t two = 2 * (32ull * 128 * 4096 * 4) + 4096;
  const Status s = CheckReplySize(two, 2, kLimit);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "the Encode reply is 129 MiB for 2 prompt(s), about 65 MiB each, above the server's "
            "message limit of 64 MiB: send fewer prompts per request, or start the server with "
            "--max-message-mb 129 or more");
  const Status one = CheckReplySize(kLimit + 1, 1, kLimit);
  EXPECT_EQ(one.message(),
            "the Encode reply is 65 MiB for 1 prompt(s), about 65 MiB each, above the server's "
            "message limit of 64 MiB: start the server with --max-message-mb 65 or more");
  const Status float32 = CheckReplySize(two, 2, kLimit, /*float32=*/true);
  EXPECT_EQ(float32.message(),
            "the Encode reply is 129 MiB for 2 prompt(s), about 65 MiB each, above the server's "
            "message limit of 64 MiB: send fewer prompts per request, ask for dtype "
            "DTYPE_BFLOAT16 (half the bytes), or start the server with --max-message-mb 129 or "
            "more");
}

TEST(EncodeReplyDtypeTest, FloatingDtypesAreTakenAndOthersRefused) {
  EXPECT_EQ(*EncodeReplyDtype(v1::DTYPE_UNSPECIFIED), c10::kFloat);
  EXPECT_EQ(*EncodeReplyDtype(v1::DTYPE_FLOAT32), c10::kFloat);
  EXPECT_EQ(*EncodeReplyDtype(v1::DTYPE_BFLOAT16), c10::kBFloat16);
  EXPECT_EQ(*EncodeReplyDtype(v1::DTYPE_FLOAT16), c10::kHalf);
  const auto ids = EncodeReplyDtype(v1::DTYPE_INT64);
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ids.status().message(),
            "field 'dtype' is DTYPE_INT64; Encode returns DTYPE_FLOAT32 (the default), "
            "DTYPE_BFLOAT16 or DTYPE_FLOAT16 embeddings");
  const auto unknown = EncodeReplyDtype(42);  // an enum value this server does not know
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("field 'dtype' is 42;"), std::string::npos);
}

}  // namespace
}  // namespace qpool::api
