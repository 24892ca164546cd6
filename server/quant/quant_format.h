// QuantFormat and QuantState: the weight formats qpool::quant_linear understands, their code
// tables, and the derivation of a weight's layout from its tensors (no ints in graphs).
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <string>

#include "util/status.h"

namespace qpool::quant {

// Note [Quantized weight layouts]
// Every quantized linear layer holds six tensors (plus an optional bias). Unused ones are empty
// (numel 0, float32). The format is derived from dtypes, never from an int argument, so traced
// graphs carry no format constants and load-time quantization only swaps buffers.
//
//   none : weight fp32/fp16/bf16 [N, K]
//   int8 : weight int8 [N, K]; absmax float32 [N];  w[n, k] = weight[n, k] * (absmax[n] / 127)
//          (symmetric, per output row; q = round_half_even(w / absmax * 127), absmax 0 -> q 0)
//   w8a8 : int8's weight and absmax plus code float32 [K] = s, per-input-channel activation
//          scales (SmoothQuant: the int8 weight was quantized from w[n, k] * s[k], so
//          w[n, k] = weight[n, k] * (absmax[n] / 127) / s[k]; s = ones without calibration, and
//          then weight and absmax are int8's bytes). An int8 weight with an empty code is int8
//          (weight-only); a non-empty code makes it w8a8. The op also quantizes x: see
//          Note [W8A8 linear] in w8a8_linear.h for what it computes.
//   nf4  : each row is zero-padded to Kp = roundup(K, blocksize) elements; the padded matrix,
//          flattened row-major, is cut into blocks of `blocksize` (a power of two >= 16) elements,
//          so blocks never span rows and a K that is no multiple of blocksize is fine.
//          absmax float32 [N * Kp / blocksize] (block absolute maximum);
//          weight uint8 [N, Kp / 2]: element 2j in the HIGH nibble of byte j, element 2j+1 in the
//          low nibble (bitsandbytes order), each nibble the index of the nearest value of
//          code float32 [16] (kNf4Code) to w / absmax (ties to the lower index).
//          w[n, k] = code[nibble(n, k)] * absmax[block(n, k)]
//          blocksize = 2 * numel(weight) / numel(absmax); K comes from x (Kp - blocksize < K <=
//          Kp).
//   nf4 + double quant (bitsandbytes compress_statistics): absmax is uint8 [nblocks] instead,
//          offset float32 [] = mean(absmax_fp32), nested_absmax float32 [ceil(nblocks / 256)] =
//          per-256-block max |absmax_fp32 - offset|, nested_code float32 [256] = kNestedCode
//          (signed linear: (i - 128) / 127), each absmax byte the nearest nested_code index to
//          (absmax_fp32 - offset) / nested_absmax.
//          absmax_fp32[b] = nested_code[absmax[b]] * nested_absmax[b / 256] + offset
//          (a product then a sum, each rounded: no fused multiply-add, so CPU and CUDA agree).
// Python (tools/qpool_export/qpool_export/quant.py) computes exactly the same bytes with the
// same tensor operations; the unit tests check it byte for byte.

enum class QuantFormat { kNone, kInt8, kNf4, kW8A8 };

// Blocks of absmax values per nested absmax (double quantization).
inline constexpr int64_t kNestedBlocksize = 256;
// Smallest and largest nf4 block sizes (powers of two).
inline constexpr int kMinBlocksize = 16;
inline constexpr int kMaxBlocksize = 4096;

// The 16 NormalFloat-4 values of the QLoRA paper (as bitsandbytes publishes them), ascending.
inline constexpr std::array<float, 16> kNf4Code = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

// "none" | "int8" | "nf4" | "w8a8" -> format; InvalidArgument naming the value otherwise.
StatusOr<QuantFormat> ParseQuantFormat(const std::string& name);
// "none", "int8", "nf4" or "w8a8".
const char* QuantFormatName(QuantFormat format);
// OK when blocksize is a power of two in [kMinBlocksize, kMaxBlocksize].
Status ValidateBlocksize(int64_t blocksize);

// kNf4Code as a float32 [16] tensor on `device`.
at::Tensor Nf4Code(const at::Device& device = at::kCPU);
// The 8-bit code of double quantization, float32 [256]: (i - 128) / 127 computed in float32.
at::Tensor NestedCode(const at::Device& device = at::kCPU);

// The six state tensors of one linear weight (Note [Quantized weight layouts]).
struct QuantState {
  at::Tensor weight;
  at::Tensor absmax;
  at::Tensor code;
  at::Tensor nested_absmax;
  at::Tensor nested_code;
  at::Tensor offset;
};

// What the tensors of a QuantState say about the weight, for a given in_features K.
struct QuantLayout {
  QuantFormat format = QuantFormat::kNone;
  bool double_quant = false;
  int64_t out_features = 0;  // N
  int64_t in_features = 0;   // K (from the activation)
  int64_t padded_in = 0;     // Kp: K for none/int8/w8a8, roundup(K, blocksize) for nf4
  int64_t blocksize = 0;     // nf4 only
  int64_t nblocks = 0;       // nf4 only: N * Kp / blocksize
  int64_t row_bytes = 0;     // bytes of one packed weight row (int8, w8a8: K; nf4: Kp / 2)
};

// Derives and checks the layout; throws c10::Error naming the offending tensor. `what` prefixes
// messages (e.g. "qpool::quant_linear"). Devices are not checked here.
QuantLayout InspectQuantState(const QuantState& state, int64_t in_features, const char* what);

// Empty float32 tensor on `device` (the value of unused state slots).
at::Tensor EmptyState(const at::Device& device = at::kCPU);

}  // namespace qpool::quant
