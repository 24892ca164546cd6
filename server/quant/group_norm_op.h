// The qpool::group_norm operator: a UNet's channels-last GroupNorm with the SiLU and the
// time-embedding addition around it in one op (Note [Group norm op]); registered with the
// dispatcher for CPU, CUDA and Meta.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace qpool::quant {

// Note [Group norm op]
// group_norm(x [N, C, H, W], weight [C], bias [C], groups, eps, add [N, C]?, silu) is
//   y = GroupNorm(x + add[:, :, None, None]) with the affine, then silu(y) when `silu`:
// the norms of every resnet block of an SD 1.x / 2.x or SDXL UNet (norm1 then SiLU; the
// time-embedding addition, norm2, SiLU) and of its transformers' inputs (no add, no SiLU).
// Unfused (the exporter's ChannelsLastGroupNorm, tools/qpool_export/qpool_export/blocks.py), a
// norm is a broadcast addition, a reduction, five small ops for the per-channel scale and shift,
// an addcmul and a SiLU: four passes over x and up to nine launches. The CUDA kernels for a
// channels-last x read x twice and write once, in two launches:
//   * statistics: blocks of pixels of one image; a thread owns a 16-byte vector of channels and
//     keeps a running mean and squared deviation per channel (Welford); the block combines its
//     channels into (count, mean, M2) per group with Chan's formula (the mean first, then the
//     deviations from it) and writes them to a float32 workspace;
//   * normalisation: each block combines its image's partials the same way, derives a float32
//     scale and shift per channel, and writes silu(x * scale + shift), x + add rounded to x's
//     dtype first as the unfused addition's output is.
// Statistics and affine stay float32, where the unfused ops round the standard deviation, scale
// and shift to fp16: the kernels' result is nearer a float64 norm than the unfused one (tested
// against both). The CPU kernel is the unfused operations, so CPU results are the exporter's
// before this op bit for bit; so is the CUDA path for what the kernels do not take: x not
// channels-last contiguous, C not a multiple of a 16-byte vector or above 4096 channels in fp16 /
// bf16 (2048 in float32), float64. The schema string is byte-identical to GROUP_NORM_SCHEMA in
// tools/qpool_export/qpool_export/blocks.py (a unit test compares them).
inline constexpr char kGroupNormSchema[] =
    "group_norm(Tensor x, Tensor weight, Tensor bias, int groups, float eps, Tensor? add, "
    "bool silu) -> Tensor";

// Calls qpool::group_norm through the dispatcher.
at::Tensor GroupNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                     int64_t groups, double eps, const std::optional<at::Tensor>& add, bool silu);

// The CPU kernel: the exporter's unfused ChannelsLastGroupNorm (std_mean, then one addcmul with
// the per-channel scale and shift), the addition before it and the SiLU after it, which keep x's
// memory format (the reference; on any device).
at::Tensor GroupNormCpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                        int64_t groups, double eps, const std::optional<at::Tensor>& add,
                        bool silu);

// Throws c10::Error naming the argument unless x is [N, C, H, W] floating-point, groups > 0
// divides C, weight and bias are [C] and add (when given) [N, C], all of x's dtype and device,
// and eps >= 0.
void CheckGroupNormArgs(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                        int64_t groups, double eps, const std::optional<at::Tensor>& add);

}  // namespace qpool::quant
