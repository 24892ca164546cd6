// Load-time quantization of a TorchScript component: swaps the buffers of every QuantLinear layer
// (see tools/qpool_export/qpool_export/quant.py) for their int8 / nf4 / w8a8 form, like
// load_in_4bit.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "util/status.h"

namespace qpool::quant {

// What to quantize at load; mirrors the manifest's QuantizationSpec field by field.
struct QuantSettings {
  std::string format = "none";    // none | int8 | nf4 | w8a8 (activation scales = ones)
  int blocksize = 64;             // nf4 only; power of two in [16, 4096]
  bool double_quant = false;      // nf4 only; 8-bit absmax of absmax
  std::vector<std::string> skip;  // layers kept as they are (qualified-name substrings)
  int64_t min_weights = 0;        // float layers with fewer weights kept as they are
};

// What QuantizeModule did.
struct QuantizeReport {
  int layers_quantized = 0;          // float weights replaced by quantized ones
  int layers_already_quantized = 0;  // exported pre-quantized in the requested format
  int layers_skipped = 0;            // matched a skip substring
  int layers_small = 0;              // float, with fewer weights than min_weights: kept float
  int64_t bytes_before = 0;          // weight + quant state of all QuantLinear layers
  int64_t bytes_after = 0;
  std::vector<std::string> quantized;  // qualified names of the layers quantized now
};

// Note [Load-time quantization]
// A QuantLinear layer is recognized by its attributes (weight, absmax, code, nested_absmax,
// nested_code, offset), not by its class name, so any exporter that follows the layout works.
// A first pass checks every layer (format conflicts, weight shapes) without touching anything;
// the second pass quantizes layer by layer and setattr()s the new buffers, which drops the
// module's reference to the float weight at once: peak memory stays near the quantized size
// plus one layer, provided nobody else holds the float tensors (call it before building a
// tensor table). Each layer's quantization runs on `compute` (the pipeline's GPU: a 12B FLUX
// transformer quantizes in seconds there instead of a minute on the host), one layer at a time,
// and its quantized tensors go back to the device the weight was on. The ATen operations are
// quant.py's, so a load-time quantized layer is byte-identical to a pre-quantized one: int8, w8a8
// (with activation scales of ones: no calibration data exists in the server) and nf4 are exact
// in IEEE float32 on either device; double quantization's mean of the absmax is a reduction
// whose order differs between CPU and GPU (measured: other bits in offset and the nested
// state), so double-quantized layers are quantized where their weights are.
// Note [Small layers stay float]
// `min_weights` keeps float layers of fewer weights (out x in) as they are: where quantizing
// costs more time than it saves memory. w8a8 is the case: its activation quantizing pass and
// launches cost more than the whole fp16 GEMM of a small layer (the 320- and 640-wide
// projections of SD 1.5 and SDXL), while the feed-forward layers of millions of weights gain
// from 4096 rows (bench/results/quant_linear_w8a8_h100.json). The exporter
// applies the same rule (quant.py quantize_module), so a prequantized import leaves the same layers
// float. A component whose layers are all small (SDXL's CLIP-L under a threshold meant for its
// UNet) stays float as a whole: a size threshold that excludes everything says "nothing here is
// worth it", not "the manifest is wrong", whereas `skip` excluding every layer is an error.
// Quantizes `module` in place. format "none" changes nothing. InvalidArgument for an unknown
// format, a bad blocksize, no QuantLinear layer left after `skip`, or a layer already quantized
// in another format (or blocksize / double quant); nothing is modified then.
// Each layer is quantized on `compute` (default: where its weight is).
StatusOr<QuantizeReport> QuantizeModule(torch::jit::Module& module, const QuantSettings& settings,
                                        const std::optional<c10::Device>& compute = std::nullopt);

// True when `module` has the attributes of a QuantLinear layer.
bool IsQuantLinear(const torch::jit::Module& module);

}  // namespace qpool::quant
