#include "quant/quantizer.h"

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

namespace qpool::quant {

namespace {

// Note [Quantize in row chunks]
// NearestCodeIndex makes an int64 index per element (8 bytes) plus a float32 copy (4 bytes):
// for a 3072 x 12288 Flux layer that would be 450 MB of temporaries. Rows are independent
// (blocks never span rows), so we quantize ~4 M elements at a time; results are identical.
constexpr int64_t kChunkElements = int64_t{1} << 22;

Status CheckWeight(const at::Tensor& w, const std::string& name) {
  if (!w.defined()) return InvalidArgument(name + ": weight is undefined");
  if (w.dim() != 2) {
    return InvalidArgument(name + ": weight must be 2-D [out, in] to quantize, got " +
                           std::to_string(w.dim()) + "-D");
  }
  if (!at::isFloatingType(w.scalar_type())) {
    return InvalidArgument(name + ": only floating weights can be quantized, got " +
                           std::string(c10::toString(w.scalar_type())));
  }
  if (w.numel() == 0) return InvalidArgument(name + ": weight is empty");
  return Status::Ok();
}

// Absmax with zeros replaced by one, so that x / absmax is 0 (not NaN) for an all-zero block.
at::Tensor SafeDivisor(const at::Tensor& absmax) {
  return at::where(absmax == 0, at::ones_like(absmax), absmax);
}

// Row-wise symmetric int8 of weight (times column_scale, when defined): weight and absmax of the
// state, the other slots empty. The weight has passed CheckWeight.
QuantState QuantizeRowsInt8(const at::Tensor& weight, const at::Tensor& column_scale) {
  c10::AutoGradMode no_grad(false);
  const at::Device device = weight.device();
  const int64_t rows = weight.size(0);
  const int64_t k = weight.size(1);
  QuantState s;
  s.weight = at::empty({rows, k}, weight.options().dtype(at::kChar));
  s.absmax = at::empty({rows}, weight.options().dtype(at::kFloat));
  const int64_t chunk_rows = std::max<int64_t>(1, kChunkElements / k);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t r1 = std::min(rows, r0 + chunk_rows);
    at::Tensor w = weight.slice(0, r0, r1).to(at::kFloat);
    if (column_scale.defined()) w = w.mul(column_scale);
    at::Tensor amax = w.abs().amax(1);
    s.weight.slice(0, r0, r1).copy_(RowsToInt8(w, amax));
    s.absmax.slice(0, r0, r1).copy_(amax);
  }
  s.code = EmptyState(device);
  s.nested_absmax = EmptyState(device);
  s.nested_code = EmptyState(device);
  s.offset = EmptyState(device);
  return s;
}

}  // namespace

at::Tensor NearestCodeIndex(const at::Tensor& x, const at::Tensor& code) {
  // Midpoints between neighbours; bucketize(right=false) maps a value equal to a midpoint to
  // the lower code. Same operations in quant.py.
  const int64_t n = code.numel();
  at::Tensor mid = code.slice(0, 0, n - 1).add(code.slice(0, 1, n)).div(2);
  return at::bucketize(x, mid);
}

at::Tensor DivideBy127(const at::Tensor& t) {
  return t.div(at::full({}, 127.0, t.options().dtype(at::kFloat)));
}

at::Tensor RowsToInt8(const at::Tensor& x, const at::Tensor& absmax) {
  // round() is round-half-to-even on every device; same operations in quant.py.
  return x.div(SafeDivisor(absmax).unsqueeze(1)).mul(127).round().clamp(-127, 127).to(at::kChar);
}

StatusOr<QuantState> QuantizeInt8(const at::Tensor& weight, const std::string& name) {
  RETURN_IF_ERROR(CheckWeight(weight, name));
  return QuantizeRowsInt8(weight, at::Tensor());
}

StatusOr<QuantState> QuantizeW8A8(const at::Tensor& weight, const at::Tensor& smooth,
                                  const std::string& name) {
  RETURN_IF_ERROR(CheckWeight(weight, name));
  c10::AutoGradMode no_grad(false);
  const int64_t k = weight.size(1);
  const at::TensorOptions f32 = weight.options().dtype(at::kFloat);
  at::Tensor scale = smooth.defined() ? smooth.to(f32).contiguous() : at::ones({k}, f32);
  if (scale.dim() != 1 || scale.numel() != k) {
    return InvalidArgument(name + ": w8a8 activation scales must be [" + std::to_string(k) +
                           "] (one per input feature), got " + std::to_string(scale.numel()) +
                           " values in " + std::to_string(scale.dim()) + "-D");
  }
  if (smooth.defined() && !(scale.gt(0) & scale.isfinite()).all().item<bool>()) {
    return InvalidArgument(name + ": w8a8 activation scales must be positive and finite");
  }
  QuantState s = QuantizeRowsInt8(weight, smooth.defined() ? scale : at::Tensor());
  s.code = scale;
  return s;
}

StatusOr<QuantState> QuantizeNf4(const at::Tensor& weight, int64_t blocksize, bool double_quant,
                                 const std::string& name) {
  RETURN_IF_ERROR(CheckWeight(weight, name));
  Status bs = ValidateBlocksize(blocksize);
  if (!bs.ok()) return InvalidArgument(name + ": " + bs.message());
  c10::AutoGradMode no_grad(false);
  const at::Device device = weight.device();
  const int64_t rows = weight.size(0);
  const int64_t k = weight.size(1);
  const int64_t kp = (k + blocksize - 1) / blocksize * blocksize;
  const int64_t blocks_per_row = kp / blocksize;
  at::Tensor code = Nf4Code(device);

  at::Tensor packed = at::empty({rows, kp / 2}, weight.options().dtype(at::kByte));
  at::Tensor absmax = at::empty({rows * blocks_per_row}, weight.options().dtype(at::kFloat));
  const int64_t chunk_rows = std::max<int64_t>(1, kChunkElements / kp);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t r1 = std::min(rows, r0 + chunk_rows);
    at::Tensor w = weight.slice(0, r0, r1).to(at::kFloat);
    if (kp != k) w = at::constant_pad_nd(w, {0, kp - k}, 0);
    at::Tensor blocks = w.reshape({-1, blocksize});
    at::Tensor amax = blocks.abs().amax(1);
    at::Tensor idx = NearestCodeIndex(blocks.div(SafeDivisor(amax).unsqueeze(1)), code);
    idx = idx.to(at::kByte).reshape({r1 - r0, kp / 2, 2});
    at::Tensor hi = idx.select(2, 0).bitwise_left_shift(4);
    packed.slice(0, r0, r1).copy_(hi.bitwise_or(idx.select(2, 1)));
    absmax.slice(0, r0 * blocks_per_row, r1 * blocks_per_row).copy_(amax);
  }

  QuantState s;
  s.weight = packed;
  s.code = code;
  if (!double_quant) {
    s.absmax = absmax;
    s.nested_absmax = EmptyState(device);
    s.nested_code = EmptyState(device);
    s.offset = EmptyState(device);
    return s;
  }
  // Double quantization: 8-bit absmax around their mean, in blocks of 256.
  const int64_t nblocks = absmax.numel();
  const int64_t nested = (nblocks + kNestedBlocksize - 1) / kNestedBlocksize;
  s.offset = absmax.mean();
  at::Tensor centered = absmax.sub(s.offset);
  at::Tensor padded = at::constant_pad_nd(centered, {0, nested * kNestedBlocksize - nblocks}, 0);
  at::Tensor nested_blocks = padded.reshape({nested, kNestedBlocksize});
  s.nested_absmax = nested_blocks.abs().amax(1);
  s.nested_code = NestedCode(device);
  at::Tensor normalized = nested_blocks.div(SafeDivisor(s.nested_absmax).unsqueeze(1));
  s.absmax = NearestCodeIndex(normalized, s.nested_code)
                 .to(at::kByte)
                 .reshape({-1})
                 .slice(0, 0, nblocks)
                 .contiguous();
  return s;
}

StatusOr<QuantState> Quantize(const at::Tensor& weight, const QuantOptions& options,
                              const std::string& name) {
  switch (options.format) {
    case QuantFormat::kInt8:
      return QuantizeInt8(weight, name);
    case QuantFormat::kW8A8:
      return QuantizeW8A8(weight, at::Tensor(), name);
    case QuantFormat::kNf4:
      return QuantizeNf4(weight, options.blocksize, options.double_quant, name);
    case QuantFormat::kNone:
      break;
  }
  RETURN_IF_ERROR(CheckWeight(weight, name));
  QuantState s;
  s.weight = weight;
  s.absmax = EmptyState(weight.device());
  s.code = EmptyState(weight.device());
  s.nested_absmax = EmptyState(weight.device());
  s.nested_code = EmptyState(weight.device());
  s.offset = EmptyState(weight.device());
  return s;
}

at::Tensor Nf4BlockAbsmax(const QuantState& s) {
  if (s.absmax.scalar_type() == at::kFloat) return s.absmax;
  const int64_t nblocks = s.absmax.numel();
  at::Tensor nested = s.nested_absmax.repeat_interleave(kNestedBlocksize).slice(0, 0, nblocks);
  return s.nested_code.index({s.absmax.to(at::kLong)}).mul(nested).add(s.offset.reshape({}));
}

at::Tensor Dequantize(const QuantState& s, int64_t in_features, at::ScalarType dtype) {
  c10::AutoGradMode no_grad(false);
  const QuantLayout layout = InspectQuantState(s, in_features, "Dequantize");
  const int64_t n = layout.out_features;
  at::Tensor w;
  switch (layout.format) {
    case QuantFormat::kNone:
      return s.weight.to(dtype);
    case QuantFormat::kInt8:
      w = s.weight.to(at::kFloat).mul(DivideBy127(s.absmax).unsqueeze(1));
      break;
    case QuantFormat::kW8A8:  // quantized from w * s, column-wise
      w = s.weight.to(at::kFloat).mul(DivideBy127(s.absmax).unsqueeze(1)).div(s.code);
      break;
    case QuantFormat::kNf4: {
      at::Tensor bytes = s.weight.contiguous();
      at::Tensor idx = at::stack({bytes.bitwise_right_shift(4), bytes.bitwise_and(15)}, 2);
      at::Tensor values = s.code.index({idx.reshape({-1}).to(at::kLong)});
      at::Tensor scale = Nf4BlockAbsmax(s).unsqueeze(1);
      w = values.reshape({-1, layout.blocksize}).mul(scale).reshape({n, layout.padded_in});
      w = w.slice(1, 0, in_features);
      break;
    }
  }
  return w.to(dtype).contiguous();
}

int64_t StateBytes(const QuantState& s) {
  int64_t total = 0;
  for (const at::Tensor* t :
       {&s.weight, &s.absmax, &s.code, &s.nested_absmax, &s.nested_code, &s.offset}) {
    if (t->defined()) total += t->numel() * t->element_size();
  }
  return total;
}

}  // namespace qpool::quant
